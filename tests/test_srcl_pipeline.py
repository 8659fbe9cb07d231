"""SRCL end to end through the command line: helper -> feature cache -> regulated pretraining."""

import contextlib
import io
import json

import pytest
import torch

from tests.helpers import QUICK, TINY_ALBEF, pretrain
from vlp.cli import main
from vlp.config import PretrainConfig, load_config
from vlp.data.datasets import Collator, ImageTextDataset
from vlp.data.formats import load_pairs
from vlp.features.helper_cache import HelperCache
from vlp.preprocess import transforms
from vlp.runs.training.assembly import build_regulator
from vlp.train.logging import read_metrics

TINY = [*TINY_ALBEF, *QUICK, "train.steps=6", "train.log_every=3", "train.warmup_steps=2"]
SRCL = ["loss.regulation=srcl", "loss.srcl.delta=1.0"]
WORLD = dict(seed=5, n_train=24, n_val=4, n_test=8)


@pytest.fixture(scope="module")
def helper(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("helper") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = main(
            [
                "train-helper",
                "--config",
                "configs/helper/shapes_tiny.yaml",
                f"output_dir={out}",
                f"data.train=[{world['helper']}]",
                *TINY,
            ]
        )
    assert rc == 0
    HELPER_OUTPUT.append(printed.getvalue())
    return out


HELPER_OUTPUT: list[str] = []  # what the helper fixture's train-helper printed


def test_train_helper_announces_itself_once(helper):
    headers = [line for line in HELPER_OUTPUT[0].splitlines() if line.startswith("vlp ")]
    assert len(headers) == 1 and headers[0].startswith("vlp train-helper: "), headers


@pytest.fixture(scope="module")
def cache(world, helper, tmp_path_factory):
    out = tmp_path_factory.mktemp("cache") / "helper_cache"
    assert (
        main(
            [
                "cache-helper-features",
                "--helper",
                str(helper),
                "--data",
                str(world["pretrain"]),
                "--out",
                str(out),
                "--batch-size",
                "16",
            ]
        )
        == 0
    )
    return out


def test_helper_run_is_itc_only(helper):
    rows = read_metrics(helper / "metrics.jsonl")
    assert rows[-1]["step"] == 6 and "itm" not in rows[-1] and "mlm" not in rows[-1]
    assert rows[-1]["loss"] == pytest.approx(rows[-1]["itc"])


def test_train_helper_refuses_non_infonce_objectives(world, tmp_path, capsys):
    rc = main(
        [
            "train-helper",
            "--config",
            "configs/pretrain/shapes_tiny.yaml",
            f"output_dir={tmp_path / 'h'}",
            f"data.train=[{world['helper']}]",
            *TINY,
        ]
    )
    assert rc == 2 and "loss.itm=1.0" in capsys.readouterr().err
    assert not (tmp_path / "h").exists()


def test_cache_covers_every_image_and_caption(world, cache):
    c = HelperCache.load(cache)
    samples = load_pairs([str(world["pretrain"])])
    assert len(c.image_index) == 24 and len(c.text_index) == len({t for s in samples for t in s.captions})
    assert torch.allclose(c.image.norm(dim=1), torch.ones(24), atol=1e-5)
    index = json.loads((cache / "index.json").read_text())
    assert index["format"] == "vlp-helper-features-v1" and index["helper_step"] == 6
    # never overwritten
    assert (
        main(
            [
                "cache-helper-features",
                "--helper",
                index["helper"],
                "--data",
                str(world["pretrain"]),
                "--out",
                str(cache),
            ]
        )
        == 2
    )


def pretrain_cfg(world, out, *extra):
    return load_config(
        PretrainConfig,
        "configs/pretrain/shapes_tiny.yaml",
        [f"output_dir={out}", f"data.train=[{world['pretrain']}]", "model.queue_size=16", *TINY, *extra],
    )


def test_cache_and_live_helper_give_the_same_weights(world, helper, cache, tmp_path):
    cached_cfg = pretrain_cfg(world, tmp_path / "a", *SRCL, f"loss.srcl.helper_features={cache}")
    live_cfg = pretrain_cfg(world, tmp_path / "b", *SRCL, f"loss.srcl.helper={helper}")
    reg_cached, hc = build_regulator(cached_cfg)
    reg_live, none = build_regulator(live_cfg)
    assert hc is not None and none is None and reg_live.helper is not None
    samples = load_pairs([str(world["pretrain"])])
    tok = transforms.load_tokenizer(cached_cfg.model.text)
    ds = ImageTextDataset(
        samples, transforms.test_transform(64, cached_cfg.data.image), hc
    )  # eval transform: same inputs
    batch = Collator(tok, cached_cfg.model.text.max_len)([ds[i] for i in range(8)])
    h_cached = reg_cached.helper_features(batch, 0)
    live_batch = {k: v for k, v in batch.items() if not k.startswith("helper_")}
    h_live = reg_live.helper_features(live_batch, 0)
    assert torch.allclose(h_cached.image, h_live.image, atol=1e-5)
    assert torch.allclose(h_cached.text, h_live.text, atol=1e-5)
    g = torch.Generator().manual_seed(0)
    cos_i2t, cos_t2i = torch.rand(2, 8, 8 + 16, generator=g) * 2 - 1  # batch + helper queue of 16
    pos = torch.zeros(8, 24, dtype=torch.bool)
    pos[range(8), range(8)] = True
    for step in (0, 3):  # helper only, then half helper / half live
        a = reg_cached.regulate(cos_i2t, cos_t2i, pos, pos, h_cached, step)
        b = reg_live.regulate(cos_i2t, cos_t2i, pos, pos, h_live, step)
        assert torch.allclose(a.w_i2t, b.w_i2t, atol=1e-5) and torch.allclose(a.w_t2i, b.w_t2i, atol=1e-5)
        assert not torch.allclose(a.w_i2t, torch.ones(8, 24), atol=0.05)  # not trivially uniform


@pytest.mark.parametrize("mode", ["srcl", "removal"])
def test_regulated_pretraining_logs_weight_statistics(world, cache, tmp_path, mode):
    out = tmp_path / mode
    rc = pretrain(
        out,
        world["pretrain"],
        "model.queue_size=16",
        *TINY,
        f"loss.regulation={mode}",
        "loss.srcl.delta=1.0",
        f"loss.srcl.helper_features={cache}",
        "loss.srcl.threshold=0.5",
    )
    assert rc == 0
    rows = read_metrics(out / "metrics.jsonl")
    # steps 0-2 and 3-5 averaged: alpha_h = 1 - step / 6
    assert rows[0]["srcl_alpha_h"] == pytest.approx(1 - 1 / 6) and rows[1]["srcl_alpha_h"] == pytest.approx(1 - 4 / 6)
    for r in rows:
        assert 0 <= r["srcl_w_min"] <= 1.0 and 0 <= r["srcl_w_below_0_2"] <= r["srcl_w_below_0_7"] <= 1
        if mode == "srcl":
            assert r["srcl_w_mean"] == pytest.approx(1.0, abs=1e-4)
        else:
            assert 0 <= r["srcl_removed"] <= 1
    assert (out / "checkpoints" / "step_0000006").is_dir()


def test_missing_helper_features_is_one_clear_error(world, tmp_path, capsys):
    rc = pretrain(tmp_path / "r", world["pretrain"], *TINY, *SRCL)
    assert rc == 2 and "loss.srcl.helper_features" in capsys.readouterr().err
    rc = pretrain(tmp_path / "r", world["pretrain"], *TINY, *SRCL, f"loss.srcl.helper_features={tmp_path / 'nope'}")
    assert rc == 2 and "cache-helper-features" in capsys.readouterr().err


def test_cache_missing_captions_names_them(world, cache, tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps(
            [
                {
                    "image": str(world["root"] / "images/train/train_000000.png"),
                    "caption": "a caption the helper never saw",
                }
            ]
        )
    )
    rc = pretrain(tmp_path / "r", other, *TINY, *SRCL, f"loss.srcl.helper_features={cache}")
    err = capsys.readouterr().err
    assert rc == 2 and "other.json entry 0" in err and "a caption the helper never saw" in err


def test_plot_srcl_weights(world, cache, tmp_path):
    run = tmp_path / "run"
    assert pretrain(run, world["pretrain"], *TINY, *SRCL, f"loss.srcl.helper_features={cache}") == 0
    out = tmp_path / "plots"
    assert (
        main(
            [
                "plot",
                "srcl-weights",
                str(run),
                "--out",
                str(out),
                "--batches",
                "2",
                "--heatmap-size",
                "5",
                "--alpha-h",
                "1.0",
            ]
        )
        == 0
    )
    from PIL import Image

    with Image.open(out / "srcl_weights_heatmap.png") as im:
        assert im.size[0] > 300 and im.size[1] > 300
    assert (out / "srcl_weights_hist.png").stat().st_size > 10_000
