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
from vlp.errors import CalibrationError, ConfigError
from vlp.features.helper_cache import write_cache
from vlp.lab.calibration import (
    MIN_AUC_SOURCE,
    MIN_SAME_IMAGE_AUC,
    SUFFICIENCY_CAVEAT,
    CalibrationRows,
    calibration_summary,
    run_helper_calibration,
    same_image_auc,
    weight_concentration,
)
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


def constructed(tmp_path, captions_per_image: int, images: int = 24, prefix: str = "img"):
    """An annotation file ``tmp_path/train.json`` (one entry per image ``{prefix}NNN``,
    ``captions_per_image`` captions each) and a helper cache whose same-image cosines are C1 and all
    others C0."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    keys = [f"{prefix}{i:03d}" for i in range(images)]
    caps = {k: [f"caption {j} of {k}" for j in range(captions_per_image)] for k in keys}
    entries = [{"image": f"{k}.png", "image_id": k, "caption": caps[k]} for k in keys]
    data = tmp_path / "train.json"
    data.write_text(json.dumps(entries))
    return data, cache_of(tmp_path, data)


def cache_of(tmp_path, data, cosine=lambda i: C1):
    """A helper cache of ``data`` (a file or a list of files) with cosine ``cosine(i)`` between each
    caption and its image (the i-th key), C0 = 0 elsewhere: caption = c e_image + sqrt(1 - c^2) e_shared,
    image = e_image."""
    samples = load_pairs(data if isinstance(data, list) else [data])
    keys = sorted({s.image_key for s in samples})
    owner = {c: keys.index(s.image_key) for s in samples for c in s.captions}
    texts = sorted(owner)
    image = torch.eye(len(keys), len(keys) + 1)
    text = torch.zeros(len(texts), len(keys) + 1)
    for r, t in enumerate(texts):
        c = cosine(owner[t])
        text[r, owner[t]], text[r, -1] = c, math.sqrt(1 - c**2)
    return write_cache(tmp_path / "cache", keys, image, texts, text, {"helper": "constructed"})


def random_cache(tmp_path, captions_per_image: int = 1, data=None):
    """An annotation file (``data``, or :func:`constructed`'s) and a cache of random unit features (seeded)."""
    data = data or constructed(tmp_path / "data", captions_per_image)[0]
    samples = load_pairs([data])
    keys = sorted({s.image_key for s in samples})
    texts = sorted({c for s in samples for c in s.captions})
    gen = torch.Generator().manual_seed(0)
    image, text = torch.randn(len(keys), 16, generator=gen), torch.randn(len(texts), 16, generator=gen)
    image, text = torch.nn.functional.normalize(image, dim=-1), torch.nn.functional.normalize(text, dim=-1)
    return data, write_cache(tmp_path / "cache", keys, image, texts, text, {"helper": "random"})


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


def test_one_caption_data_is_refused_with_the_two_ways_out(tmp_path):
    data, cache = constructed(tmp_path, captions_per_image=1)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "override.txt").write_text("loss.srcl.delta=1000\n")  # an earlier answer
    with pytest.raises(CalibrationError, match=r"no image has a second caption.*--reference FILE.*--rule 20pct"):
        run_helper_calibration(cache, [data], tmp_path / "out", batch_size=B, batches=2, queue_size=16)
    assert not (tmp_path / "out" / "override.txt").exists()  # a refusal leaves no stale answer behind


def test_the_20pct_rule_by_name_on_one_caption_data(tmp_path):
    """No probes: the same-image medians are empty (printed as "-", the old TypeError) and the
    helper's quality is reported as unmeasured, not passed."""
    data, cache = random_cache(tmp_path, captions_per_image=1)
    rep = run_helper_calibration(cache, [data], tmp_path / "out", batch_size=B, batches=2, queue_size=16, rule="20pct")
    assert rep["same_image"]["probes"] == 0 and rep["delta"]["target_weight"] is None
    assert rep["quality"]["same_image_auc"] is None and "unmeasured" in rep["quality_warning"]
    assert rep["override"] == f"loss.srcl.norm=softmax loss.srcl.delta={rep['delta']['rule_20pct']:.4g}"
    assert rep["weights"]["rule_20pct"]["all_negatives"]["below_0_7"] == pytest.approx(0.2, abs=0.01)
    assert rep["negatives"]["with_queue"] == 2 * 2 * B * (B - 1 + 16)
    text = calibration_summary(rep)
    assert "same-image median - (p90 -)" in text and f"same-image AUC - (minimum {MIN_SAME_IMAGE_AUC:g})" in text


def test_a_search_that_hits_its_bound_is_an_error_naming_it(tmp_path, capsys):
    """All negatives of a row at one cosine: no delta puts 20% of them below 0.7 (the old answer
    was delta=1000, the search's bound)."""
    from vlp.cli import main

    data, cache = constructed(tmp_path, captions_per_image=1)
    status = main(["analyze", "helper", "--cache", str(cache), "--data", str(data), "--out", str(tmp_path / "a"),
                   "--batch-size", str(B), "--batches", "2", "--rule", "20pct"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("vlp: error: calibrate delta by the 20% rule")
    assert "delta=1000, the bounds of the search" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "a" / "override.txt").exists()
    rep = json.loads((tmp_path / "a" / "helper_diagnostics.json").read_text())
    assert rep["override"] is None and "bounds of the search" in rep["refused"]


def test_a_mixture_is_calibrated_on_its_multi_caption_sources(tmp_path):
    multi, _ = constructed(tmp_path / "m", captions_per_image=3, images=16, prefix="coco")
    single, _ = constructed(tmp_path / "s", captions_per_image=1, images=16, prefix="cc3m")
    cache = cache_of(tmp_path, [multi, single])
    rep = run_helper_calibration(cache, [multi, single], tmp_path / "out", batch_size=B, batches=4)
    assert rep["probe_sources"] == [str(multi)] and rep["one_caption_sources"] == [str(single)]
    assert rep["calibrated_on"] == [str(multi), str(single)] and rep["same_image"]["probes"] > 0
    # probes only from the multi-caption file; its same-image AUC is 1 (C1 > C0), the other file has none
    assert rep["quality"]["per_source"] == {str(multi): 1.0, str(single): None}
    assert rep["quality"]["same_image_auc"] == 1.0 and rep["override"] is not None


def test_one_caption_data_with_a_reference(tmp_path):
    single, single_cache = constructed(tmp_path / "s", captions_per_image=1, prefix="cc3m")
    ref, _ = constructed(tmp_path / "r", captions_per_image=3, prefix="coco")
    with pytest.raises(CalibrationError, match=r"--reference .*train.json: the helper cache does not cover it"):
        run_helper_calibration(single_cache, [single], tmp_path / "o1", batch_size=B, reference=ref)
    with pytest.raises(CalibrationError, match="no image has a second caption in it either"):
        run_helper_calibration(single_cache, [single], tmp_path / "o2", batch_size=B, reference=single)
    cache = cache_of(tmp_path, [single, ref])
    rep = run_helper_calibration(cache, [single], tmp_path / "out", batch_size=B, batches=4, reference=str(ref))
    assert rep["calibrated_on"] == [str(ref)] and rep["probe_sources"] == [str(ref)]
    assert rep["delta"]["target_weight"] == pytest.approx(probe_delta(0.12, B - 1), rel=1e-5)
    assert (tmp_path / "out" / "override.txt").exists()


def _analyze_constructed(tmp_path, good: int) -> list[str]:
    """``vlp analyze helper`` argv for a cache where ``good`` of every 8 images have their captions at
    cosine C1 > 0 with them, the rest at -0.3 < 0 = every other pair. A row's probes are all of its
    anchor's image and every other negative sits at 0, so a probe wins all its comparisons or loses
    all: 3 batches of 8 are one epoch, each image anchors once, and the same-image AUC is exactly
    ``good / 8``."""
    data, _ = constructed(tmp_path, captions_per_image=3)
    cache = cache_of(tmp_path / f"helper{good}", data, cosine=lambda i: C1 if i % 8 < good else -0.3)
    return ["analyze", "helper", "--cache", str(cache), "--data", str(data), "--batch-size", str(B), "--batches", "3"]


def test_a_weak_helper_is_refused_by_its_same_image_auc(tmp_path, capsys):
    """Same-image AUC 0.5 (4 of 8 images), below the default minimum: refused, naming the source of
    the minimum; ``--force`` writes the override and records that it was forced."""
    from vlp.cli import main

    assert MIN_SAME_IMAGE_AUC > 0.5
    args = _analyze_constructed(tmp_path, good=4)
    assert main([*args, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    want = (
        f"same-image AUC 0.500 is below {MIN_SAME_IMAGE_AUC:g}, the weakest noised oracle SRCL was shown to help with"
    )
    assert len(err) == 1 and want in err[0] and "MIN_AUC_SOURCE" in err[0] and "--force" in err[0]
    rep = json.loads((tmp_path / "a" / "helper_diagnostics.json").read_text())
    assert rep["quality"]["same_image_auc"] == pytest.approx(0.5) and rep["override"] is None
    assert rep["quality"]["threshold_source"] == MIN_AUC_SOURCE and "quality_caveat" not in rep
    assert rep["delta"]["target_weight"] is not None and not rep["forced"]  # a delta exists; it is not trusted
    assert not (tmp_path / "a" / "override.txt").exists()
    assert main([*args, "--out", str(tmp_path / "b"), "--force"]) == 0
    rep = json.loads((tmp_path / "b" / "helper_diagnostics.json").read_text())
    assert rep["forced"] and (tmp_path / "b" / "override.txt").read_text().strip() == rep["override"]
    assert "(forced past the quality check)" in capsys.readouterr().out
    assert main([*args, "--out", str(tmp_path / "c"), "--min-same-image-auc", "0.45"]) == 0


def test_a_helper_above_the_minimum_is_told_that_passing_is_not_enough(tmp_path, capsys):
    """Same-image AUC 0.625 (5 of 8 images), above the default minimum: calibrated, with the caveat
    (the learned helper that passed and did not help) in the JSON and printed; a stricter minimum
    given on the command line refuses it, naming that minimum, not the experiment's."""
    from vlp.cli import main

    args = _analyze_constructed(tmp_path, good=5)
    assert 0.625 >= MIN_SAME_IMAGE_AUC
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    rep = json.loads((tmp_path / "a" / "helper_diagnostics.json").read_text())
    assert rep["quality"]["same_image_auc"] == pytest.approx(0.625) and rep["quality_caveat"] == SUFFICIENCY_CAVEAT
    assert SUFFICIENCY_CAVEAT in capsys.readouterr().out and (tmp_path / "a" / "override.txt").exists()
    assert main([*args, "--out", str(tmp_path / "b"), "--min-same-image-auc", "0.7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "same-image AUC 0.625 is below 0.7, the minimum given (--min-same-image-auc)" in err[0]


def test_same_image_auc_and_weight_concentration_by_hand():
    nan = float("nan")
    rows = CalibrationRows(
        helper=torch.tensor([[0.9, 0.5, 0.2, 0.5], [0.9, 0.4, 0.1, 0.3]]),
        positives=torch.tensor([[True, False, False, False]] * 2),
        same_image=torch.tensor([[False, False, False, False], [False, False, False, True]]),
        probes=torch.tensor([[0.5, 0.3], [0.2, nan]]),
        sources=torch.tensor([0, 1]),
    )
    # row 0: probe 0.5 vs others 0.5, 0.2, 0.5 -> 0.5 + 1 + 0.5; probe 0.3 -> 0 + 1 + 0: 3 of 6 pairs
    # row 1 (column 3 is of the anchor's image, not an "other"): probe 0.2 vs 0.4, 0.1 -> 1 of 2
    auc, per_source = same_image_auc(rows, 2, budget=4)  # a budget of 4 elements: one row at a time
    assert auc == pytest.approx(4 / 8) and per_source == pytest.approx([0.5, 0.5])
    w = torch.tensor([[1.0, 2.0, 1.0, 1.0]])
    c = weight_concentration(w, torch.tensor([[True, False, False, False]]), k=2)
    # negatives 2, 1, 1: N_eff = 4^2 / (4 + 1 + 1); the 2 heaviest carry 3 of 4
    assert c == pytest.approx(
        {"n_eff_mean": 16 / 6, "n_eff_median": 16 / 6, "negatives_per_row": 3.0, "top2_share": 0.75}
    )


def test_the_report_says_what_the_chosen_delta_does(tmp_path):
    data, cache = constructed(tmp_path, captions_per_image=3)
    rep = run_helper_calibration(cache, [data], tmp_path / "out", batch_size=B, batches=3)
    # one entry per image: every other negative of a row is another image's, all at C0: equal weights
    assert rep["at_delta"] == pytest.approx({"n_eff_mean": B - 1, "n_eff_median": B - 1, "negatives_per_row": B - 1,
                                             "top10_share": 1.0})  # fmt: skip
    assert rep["quality"]["threshold_source"] == MIN_AUC_SOURCE and "srcl_calibration.py" in MIN_AUC_SOURCE
    assert "N_eff 7.0 of 7 negatives per row" in calibration_summary(rep)


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


def test_retrieval_fine_tuning_has_no_known_false_negatives(tmp_path):
    """itc_positives=image: an image's other captions are positives, so the probe rule is refused and the
    20% rule counts the queued same-image captions as positives, not negatives."""
    keys = [f"img{i}" for i in range(6)]
    entries = [{"image": f"{k}.png", "image_id": k, "caption": f"caption {j} of {k}"} for k in keys for j in range(4)]
    data = tmp_path / "train.json"
    data.write_text(json.dumps(entries))
    _, cache = random_cache(tmp_path, data=data)
    with pytest.raises(CalibrationError, match=r"itc_positives=image .* choose --rule 20pct"):
        run_helper_calibration(cache, [data], tmp_path / "a", batch_size=4, queue_size=12, itc_positives="image")
    pair = run_helper_calibration(
        cache, [data], tmp_path / "b", batch_size=4, queue_size=12, batches=5, rule="20pct", force=True
    )
    image = run_helper_calibration(
        cache, [data], tmp_path / "c", batch_size=4, queue_size=12, batches=5, rule="20pct", itc_positives="image"
    )
    same = pair["same_image"]["in_rows"]
    assert same > 0 and image["same_image"]["in_rows"] == 0 and image["same_image"]["probes"] == 0
    assert image["negatives"]["with_queue"] == pair["negatives"]["with_queue"] - same
    assert image["itc_positives"] == "image" and image["quality"]["same_image_auc"] is None


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


def test_a_run_config_whose_helper_has_no_cache_names_the_command_that_writes_one(tmp_path, capsys):
    from vlp.cli import main

    status = main(["analyze", "helper", "--config", "configs/pretrain/shapes_tiny.yaml", "--out", str(tmp_path / "a"),
                   "data.train=[train.json]", "loss.srcl.helper=open_clip:ViT-B-32/laion2b_s34b_b79k"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1
    assert "loss.srcl.helper=open_clip:ViT-B-32/laion2b_s34b_b79k) has no feature cache" in err[0]
    assert (
        "`vlp cache-helper-features --helper open_clip:ViT-B-32/laion2b_s34b_b79k --data train.json --out CACHE`"
        in err[0]
    )
    assert not (tmp_path / "a").exists()


def test_an_uncalibrated_srcl_run_stops_before_the_first_step(tmp_path):
    from vlp.runs.training.pretrain import run_pretrain

    for mode in ("srcl", "removal"):
        cfg = load_config(
            PretrainConfig,
            "configs/pretrain/shapes_tiny.yaml",
            [f"output_dir={tmp_path / mode}", "data.train=[missing.json]", f"loss.regulation={mode}"],
        )
        with pytest.raises(ConfigError, match=r"'loss\.srcl\.delta' is not set") as e:
            run_pretrain(cfg)
        assert "vlp analyze helper" in str(e.value)
        # the message quotes the simulated row that test_delta_one_hardly_regulates_a_simulated_row
        # computes, as a simulation: nothing in vlp has measured real-data weights at delta 1
        assert "simulated row" in str(e.value) and "0.72-0.81" in str(e.value)
        assert "real-data" not in str(e.value)
        assert not (tmp_path / mode / "metrics.jsonl").exists()
    # the mean norm has no delta to set
    cfg = load_config(
        PretrainConfig, "configs/pretrain/shapes_tiny.yaml", ["loss.regulation=srcl", "loss.srcl.norm=mean"]
    )
    cfg.loss.srcl.require_delta(cfg.loss.regulation)


def test_delta_one_hardly_regulates_a_simulated_row():
    """docs/methods.md and the missing-delta ConfigError: at delta 1, a simulated row of 65,600
    negatives at cosines drawn evenly from 0.1-0.3 (an assumed spread, not a measured helper's) and
    false negatives at 0.5-0.7 give the latter weights of 0.72-0.81 and put no negative below 0.7."""
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
