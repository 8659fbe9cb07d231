"""The SRCL quick start of docs/methods.md, end to end through the command line, with the local-file
variant of an open_clip helper (issue 40 part 5): a tiny open_clip architecture whose random weights
``scripts/make_tiny_open_clip.py`` saved to a file -> ``vlp cache-helper-features`` -> ``vlp analyze
helper`` (delta) -> ``vlp pretrain`` with that delta and cache."""

from __future__ import annotations

import json
from pathlib import Path

import open_clip
import torch
from safetensors.torch import load_file

from tests.helpers import NO_TASKS, QUICK, SHAPES_TINY, TINY_ALBEF, load_script, open_clip_rows
from vlp.cli import main
from vlp.data.formats import load_pairs
from vlp.features.helper_cache import HelperCache
from vlp.features.open_clip_cache import OPEN_CLIP_CACHE
from vlp.models.open_clip_helper import OpenClipHelper

WORLD = dict(seed=2, n_train=16, n_val=2, n_test=2, image_size=32, **NO_TASKS)


def reference_features(config: Path, weights: Path, cache: HelperCache, data: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache's rows computed by open_clip itself: a model of ``config`` built with other random
    weights (seed 1), then given the file's, with open_clip's eval preprocessing and tokenizer."""
    torch.manual_seed(1)
    model, _, preprocess = open_clip.create_model_and_transforms(config.stem)
    model.load_state_dict(load_file(str(weights)))
    return open_clip_rows(model, preprocess, open_clip.get_tokenizer(config.stem), cache, load_pairs([data]))


def test_quick_start_with_a_local_weights_file(world, tmp_path, capsys):
    config, weights = load_script("scripts/make_tiny_open_clip.py").write_tiny_open_clip(tmp_path / "helper")
    spec, data, cache_dir = f"open_clip:{config}/{weights}", str(world["pretrain"]), tmp_path / "helper_cache"

    # 1. the helper's features, read from the weights file as open_clip reads a tag's
    assert main(["cache-helper-features", "--helper", spec, "--data", data, "--out", str(cache_dir)]) == 0
    cache = HelperCache.load(cache_dir)
    assert (cache.meta["helper_init"], cache.meta["pretrained"]) == ("pretrained", str(weights.resolve()))
    saved, loaded = load_file(str(weights)), OpenClipHelper.load(spec, device=torch.device("cpu")).model.state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    image, text = reference_features(config, weights, cache, data)
    torch.testing.assert_close(cache.image, image, atol=1e-5, rtol=0)
    torch.testing.assert_close(cache.text, text, atol=1e-5, rtol=0)

    # 2. delta for this helper at the run's batch (8) and queue (0): a random helper fails the quality
    # check (same-image AUC near 0.5), so the override is written only with --force
    delta_dir = tmp_path / "delta"
    argv = ["analyze", "helper", "--cache", str(cache_dir), "--data", data, "--batch-size", "8", "--queue", "0"]
    assert main([*argv, "--out", str(delta_dir)]) == 2
    assert "same-image AUC" in capsys.readouterr().err and not (delta_dir / "override.txt").exists()
    assert main([*argv, "--out", str(delta_dir), "--force"]) == 0
    override = (delta_dir / "override.txt").read_text().split()
    assert override[0] == "loss.srcl.norm=softmax" and override[1].startswith("loss.srcl.delta=")
    delta = float(override[1].split("=")[1])

    # 3. two steps of SRCL pretraining with that delta and cache
    run = tmp_path / "run"
    srcl = ["loss.regulation=srcl", f"loss.srcl.helper_features={cache_dir}", *override]
    steps = ["train.steps=2", "train.log_every=1", *TINY_ALBEF, *QUICK]
    assert main(["pretrain", "--config", SHAPES_TINY, f"output_dir={run}", f"data.train=[{data}]", *steps, *srcl]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "srcl_alpha_h" in r]
    assert [r["step"] for r in trained] == [1, 2] and trained[0]["srcl_alpha_h"] == 1.0
    assert all(r["srcl_w_min"] < 1.0 < r["srcl_w_mean"] + 1e-3 for r in trained)  # weights vary, mean 1
    saved_cfg = (run / "config.yaml").read_text()
    assert "regulation: srcl" in saved_cfg and f"delta: {delta}" in saved_cfg
    assert not (run / OPEN_CLIP_CACHE).exists()  # the cache given, not one built by the run
