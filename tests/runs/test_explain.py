"""`vlp explain` (vlp.runs.explain) and VLPModel.explain: one Grad-CAM map per token, the ITM score of
the pair, the PNG grid and the JSON of the maps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.runs.test_grounding import tiny_checkpoint
from vlp.api import VLPModel
from vlp.models.gradcam import gradcam_maps
from vlp.runs.explain import run_explain


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("img") / "red.png"
    from PIL import Image

    im = Image.new("RGB", (64, 64), (255, 255, 255))
    im.paste((220, 30, 30), (8, 8, 30, 30))
    im.save(path)
    return path


def test_explain_returns_one_map_per_token_and_the_itm_score(checkpoint, image) -> None:
    vm = VLPModel.from_pretrained(checkpoint, device="cpu")
    tokens, maps, score, layer = vm.explain(image, "a red circle")
    assert tokens == ["[CLS]", "a", "red", "circle", "[SEP]"] and layer == 0
    grid = vm.preprocessor.image_size // vm.model.vision.patch_embed.patch_size[0]
    assert maps.shape == (5, grid, grid) and float(maps.min()) >= 0.0
    assert score == pytest.approx(float(vm.itm_score(image, "a red circle")[0]), abs=1e-5)
    tok = vm.tokenize("a red circle")
    expected = gradcam_maps(vm.model, vm.pixel_values(image), tok["input_ids"], tok["attention_mask"], 0)[0]
    torch.testing.assert_close(maps, expected)
    assert vm.explain(image, "a red circle", layer=1).layer == 1
    assert all(p.grad is None for p in vm.model.parameters()) and not vm.model.training


def test_run_explain_writes_the_png_grid_and_the_maps(checkpoint, image, tmp_path) -> None:
    rec = run_explain(checkpoint, image, "a red circle", tmp_path, layer=1)
    assert (tmp_path / "explain.png").stat().st_size > 0
    saved = json.loads((tmp_path / "explain.json").read_text())
    assert saved == rec and rec["layer"] == 1 and len(rec["maps"]) == len(rec["tokens"]) == 5
    assert [len(rec["maps"][0]), len(rec["maps"][0][0])] == rec["grid"]
    assert 0.0 <= rec["itm_score"] <= 1.0


def test_cli_explain_writes_the_grid(checkpoint, image, tmp_path) -> None:
    from vlp.cli import main

    out = tmp_path / "cli"
    assert (
        main(
            [
                "explain",
                "--checkpoint",
                str(checkpoint),
                "--image",
                str(image),
                "--text",
                "a red circle",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rec = json.loads((out / "explain.json").read_text())
    assert (out / "explain.png").stat().st_size > 0 and rec["text"] == "a red circle"
