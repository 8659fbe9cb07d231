"""SRCL's delta calibrated without a world: same-image captions as the known false negatives.

Constructed helpers give every same-image (caption, image) pair the cosine C1 and every other pair
C0, so each row holds n = B - 1 negatives at C0 and its probes sit at C1, and the deltas have
closed forms: a probe's softmax weight is (n + 1) e^{d a1} / (n e^{d a0} + e^{d a1}) with
a = e^{-cos}, so the weight t is reached at d = ln(t n / (n + 1 - t)) / (a1 - a0).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from vlp.config import PretrainConfig, load_config
from vlp.data.formats import load_pairs
from vlp.errors import ConfigError
from vlp.features.helper_cache import write_cache
from vlp.lab.calibration import run_helper_calibration
from vlp.losses.srcl import calibrate_delta, calibrate_delta_for_probes, probe_weights

C1, C0 = 0.6, 0.0
B = 8


def probe_delta(target: float, n: int, c1: float = C1, c0: float = C0) -> float:
    return math.log(target * n / (n + 1 - target)) / (math.exp(-c1) - math.exp(-c0))


def test_probe_weights_by_hand_both_modes():
    s = torch.exp(torch.tensor([[0.9, C0, C0, C0]]))  # positive first, 3 negatives
    pos = torch.tensor([[True, False, False, False]])
    probes = torch.exp(torch.tensor([[C1, float("nan")]]))
    a1, a0 = math.exp(-C1), math.exp(-C0)
    for delta in (0.5, 3.0):
        w = probe_weights(s, pos, probes, "softmax", delta)
        assert float(w[0, 0]) == pytest.approx(
            4 * math.exp(delta * a1) / (3 * math.exp(delta * a0) + math.exp(delta * a1))
        )
        assert math.isnan(float(w[0, 1]))
    w = probe_weights(s, pos, probes, "mean")
    assert float(w[0, 0]) == pytest.approx(4 * a1 / (3 * a0 + a1))


def test_probe_weights_equal_the_weight_of_one_more_negative():
    from vlp.losses.srcl import srcl_weights

    gen = torch.Generator().manual_seed(0)
    s = torch.exp(torch.rand(3, 6, generator=gen))
    pos = torch.zeros(3, 6, dtype=torch.bool)
    pos[:, 0] = True
    probe = torch.exp(torch.rand(3, 1, generator=gen))
    for mode in ("softmax", "mean"):
        w_row = srcl_weights(
            torch.cat([s, probe], 1), torch.cat([pos, torch.zeros(3, 1, dtype=torch.bool)], 1), mode, 2.0
        )
        assert torch.allclose(probe_weights(s, pos, probe, mode, 2.0)[:, 0], w_row[:, -1], atol=1e-6)


def test_calibration_rules_by_hand():
    n = 7
    s = torch.exp(torch.tensor([[0.9] + [C0] * n]))
    pos = torch.zeros(1, n + 1, dtype=torch.bool)
    pos[0, 0] = True
    probes = torch.exp(torch.tensor([[C1]]))
    assert calibrate_delta_for_probes(s, pos, probes, 0.12) == pytest.approx(probe_delta(0.12, n), rel=1e-6)
    # the 20% rule: 1 of 5 negatives at C1 crosses 0.7 at d = ln(0.7 * 4 / (5 - 0.7)) / (a1 - a0)
    s5 = torch.exp(torch.tensor([[0.9, C1, C0, C0, C0, C0]]))
    pos5 = torch.tensor([[True] + [False] * 5])
    want = math.log(0.7 * 4 / (5 - 0.7)) / (math.exp(-C1) - math.exp(-C0))
    assert calibrate_delta(s5, pos5) == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match="no probes"):
        calibrate_delta_for_probes(s, pos, torch.full((1, 1), float("nan")), 0.12)


def constructed(tmp_path, captions_per_image: int, images: int = 24):
    """An annotation file (one entry per image, ``captions_per_image`` captions each) and a helper
    cache whose same-image cosines are C1 and all others C0."""
    keys = [f"img{i:03d}" for i in range(images)]
    caps = {k: [f"caption {j} of {k}" for j in range(captions_per_image)] for k in keys}
    entries = [{"image": f"{k}.png", "image_id": k, "caption": caps[k]} for k in keys]
    data = tmp_path / "train.json"
    data.write_text(json.dumps(entries))
    return data, cache_of(tmp_path, data)


def cache_of(tmp_path, data):
    """A helper cache of ``data`` with cosine C1 between each caption and its image, C0 = 0 elsewhere:
    caption = C1 e_image + sqrt(1 - C1^2) e_shared, image = e_image."""
    samples = load_pairs([data])
    keys = sorted({s.image_key for s in samples})
    owner = {c: keys.index(s.image_key) for s in samples for c in s.captions}
    texts = sorted(owner)
    image = torch.eye(len(keys), len(keys) + 1)
    text = torch.zeros(len(texts), len(keys) + 1)
    for r, t in enumerate(texts):
        text[r, owner[t]], text[r, -1] = C1, math.sqrt(1 - C1**2)
    return write_cache(tmp_path / "cache", keys, image, texts, text, {"helper": "constructed"})


def test_calibration_without_a_world_gives_the_hand_computed_delta(tmp_path):
    data, cache = constructed(tmp_path, captions_per_image=3)
    rep = run_helper_calibration(cache, [data], tmp_path / "out", batch_size=B, batches=4, delta=2.0)
    assert rep["world"] is None and rep["mode"] == "softmax"
    # every anchor has 2 other captions (i2t) and its own image (t2i): 3 probes per image
    assert rep["same_image"]["probes"] == 4 * B * 3 and rep["same_image"]["in_rows"] == 0
    assert rep["delta"]["target_weight"] == pytest.approx(probe_delta(0.12, B - 1), rel=1e-5)
    target = rep["weights"]["target_weight"]
    assert target["false_negatives"]["median"] == pytest.approx(0.12, abs=1e-4)
    assert target["other_negatives"]["median"] == pytest.approx(1.0, abs=1e-6)  # all at C0: weight exactly 1
    assert rep["weights"]["given"]["delta"] == 2.0
    assert rep["override"] == f"loss.srcl.norm=softmax loss.srcl.delta={rep['delta']['target_weight']:.4g}"
    saved = json.loads((tmp_path / "out" / "helper_diagnostics.json").read_text())
    assert saved["delta"] == rep["delta"] and saved["override"] == rep["override"]
    assert (tmp_path / "out" / "override.txt").read_text() == rep["override"] + "\n"
    for name in rep["weights"]:
        assert (tmp_path / "out" / f"weights_{name}.png").stat().st_size > 0


def test_calibration_in_mean_mode_reports_its_floor(tmp_path):
    data, cache = constructed(tmp_path, captions_per_image=2)
    rep = run_helper_calibration(cache, [data], tmp_path / "out", batch_size=B, batches=2, mode="mean")
    a1, n = math.exp(-C1), B - 1
    assert rep["delta"] == {"rule_20pct": None, "target_weight": None}
    assert "mean mode" in rep["delta_error"] and rep["override"] is None
    assert not (tmp_path / "out" / "override.txt").exists()
    assert rep["weights"]["mean"]["false_negatives"]["median"] == pytest.approx((n + 1) * a1 / (n + a1), rel=1e-5)
    assert rep["mean_mode_floor"]["median"] == pytest.approx(math.exp(-1.0), rel=1e-5)  # every u of a row is 1


def test_one_caption_sources_report_only_the_overall_distribution(tmp_path):
    data, cache = constructed(tmp_path, captions_per_image=1)
    rep = run_helper_calibration(cache, [data], tmp_path / "out", batch_size=B, batches=2, queue_size=16)
    assert rep["same_image"]["probes"] == 0 and rep["delta"]["target_weight"] is None
    assert "no probes" in rep["delta_error"]
    assert rep["override"] == f"loss.srcl.norm=softmax loss.srcl.delta={rep['delta']['rule_20pct']:.4g}"
    assert rep["negatives"]["with_queue"] == 2 * 2 * B * (B - 1 + 16)


def test_queued_same_image_negatives_are_counted(tmp_path):
    """ALBEF-style files (one caption per entry, the image repeated): the queue holds other captions
    of the anchor's image."""
    keys = [f"img{i}" for i in range(6)]
    entries = [{"image": f"{k}.png", "image_id": k, "caption": f"caption {j} of {k}"} for k in keys for j in range(4)]
    data = tmp_path / "train.json"
    data.write_text(json.dumps(entries))
    cache = cache_of(tmp_path, data)
    rep = run_helper_calibration(cache, [data], tmp_path / "out", batch_size=4, queue_size=12, batches=5)
    # per anchor: its image's 3 other captions (i2t) and the image itself (t2i)
    assert rep["same_image"]["in_rows"] > 0 and rep["same_image"]["probes"] == 5 * 4 * (3 + 1)
    assert rep["delta"]["target_weight"] is not None


def test_cli_calibrates_from_a_run_config(tmp_path, capsys):
    from vlp.cli import main

    data, cache = constructed(tmp_path, captions_per_image=3)
    main(["analyze", "helper", "--cache", str(cache), "--data", str(data), "--out", str(tmp_path / "a"),
          "--batch-size", str(B), "--batches", "3"])  # fmt: skip
    out = capsys.readouterr().out
    want = f"loss.srcl.delta={probe_delta(0.12, B - 1):.4g}"
    assert f"paste: loss.srcl.norm=softmax {want}" in out
    main(["analyze", "helper", "--config", "configs/pretrain/shapes_tiny.yaml", "--out", str(tmp_path / "b"),
          "--batches", "3", f"data.train=[{data}]", f"loss.srcl.helper_features={cache}", f"data.batch_size={B}",
          "model.queue_size=0"])  # fmt: skip
    rep = json.loads((tmp_path / "b" / "helper_diagnostics.json").read_text())
    assert rep["batch_size"] == B and rep["queue_size"] == 0 and rep["override"].endswith(want)


def test_an_uncalibrated_srcl_run_stops_before_the_first_step(tmp_path):
    from vlp.runs.pretrain import run_pretrain

    for mode in ("srcl", "removal"):
        cfg = load_config(
            PretrainConfig,
            "configs/pretrain/shapes_tiny.yaml",
            [f"output_dir={tmp_path / mode}", "data.train=[missing.json]", f"loss.regulation={mode}"],
        )
        with pytest.raises(ConfigError, match=r"'loss\.srcl\.delta' is not set") as e:
            run_pretrain(cfg)
        assert "vlp analyze helper" in str(e.value)
        assert not (tmp_path / mode / "metrics.jsonl").exists()
    # the mean norm has no delta to set
    cfg = load_config(
        PretrainConfig, "configs/pretrain/shapes_tiny.yaml", ["loss.regulation=srcl", "loss.srcl.norm=mean"]
    )
    cfg.loss.srcl.require_delta(cfg.loss.regulation)


def test_delta_one_hardly_regulates_a_realistic_row():
    """docs/methods.md: at delta 1, 65,600 negatives at cosines 0.1-0.3 and false negatives at
    0.5-0.7 give the latter weights of 0.72-0.81 and put no negative below 0.7."""
    from vlp.losses.srcl import srcl_weights

    n = 65_600
    cos = 0.1 + 0.2 * torch.rand(1, n, generator=torch.Generator().manual_seed(0))
    cos[0, 0] = 0.8
    pos = torch.zeros(1, n, dtype=torch.bool)
    pos[0, 0] = True
    s = torch.exp(cos)
    w = probe_weights(s, pos, torch.exp(torch.tensor([[0.5, 0.6, 0.7]])), "softmax", 1.0)[0]
    assert [round(float(x), 2) for x in w] == [0.81, 0.76, 0.72]
    assert float((srcl_weights(s, pos, "softmax", 1.0)[~pos] < 0.7).float().mean()) == 0.0
