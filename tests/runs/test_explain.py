"""`vlp explain` (vlp.runs.evaluation.explain) and VLPModel.explain: one Grad-CAM map per token, the ITM score of
the pair, the PNG grid and the JSON of the maps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.runs.test_grounding import tiny_checkpoint
from vlp.api import VLPModel, grounding_maps, pixel_values, tokenize
from vlp.models.gradcam import gradcam_maps
from vlp.runs.evaluation.explain import run_explain


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("img") / "red.png"

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
    tok = tokenize(vm, "a red circle")
    expected = gradcam_maps(vm.model, pixel_values(vm, image), tok["input_ids"], tok["attention_mask"], 0)[0]
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


def test_cli_explain_writes_the_grid(checkpoint, image, tmp_path, capsys) -> None:
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
    wrote = [line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote")]
    assert len(wrote) == 1 and "explain.png" in wrote[0], wrote  # said once (issue 31, item 7)


def test_cli_explain_names_a_missing_image_not_the_layer(checkpoint, tmp_path, capsys) -> None:
    from vlp.cli import main

    missing = tmp_path / "nope.png"
    args = ["explain", "--checkpoint", str(checkpoint), "--image", str(missing), "--text", "a", "--out", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "nope.png" in err and "--layer" not in err


def _examples(folder: Path, image_dir: Path) -> list[dict]:
    """A retrieval_examples.json of 2 captions x their top-3 images, as `vlp evaluate retrieval` saves it."""

    image_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, colour in enumerate([(220, 30, 30), (30, 30, 220), (30, 200, 30)]):
        p = image_dir / f"im{i}.png"
        im = Image.new("RGB", (64, 64), (255, 255, 255))
        im.paste(colour, (8 + 10 * i, 8, 30 + 10 * i, 30))
        im.save(p)
        paths.append(str(p))
    rows = [
        {"query": 0, "text": "a red square", "top": [{"index": j, "path": paths[j], "mark": None} for j in (0, 1, 2)]},
        {"query": 3, "text": "a blue square", "top": [{"index": j, "path": paths[j], "mark": None} for j in (1, 2, 0)]},
    ]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "retrieval_examples.json").write_text(json.dumps({"direction": "t2i", "k": 3, "rows": rows}))
    return rows


def test_plot_retrieval_gradcam_draws_each_captions_maps_over_its_retrieved_images(
    checkpoint, tmp_path, monkeypatch
) -> None:
    import vlp.viz
    from vlp.runs.evaluation.explain import run_retrieval_gradcam

    run = checkpoint.parent.parent  # the run directory: eval/ has no metrics.json, so the run is the model
    rows = _examples(run / "eval", tmp_path / "images")
    drawn = {}
    real = vlp.viz.plot_retrieval_grid

    def spy(rows_, out, heatmaps=None, note="", shows=None):
        drawn.update(rows=rows_, heatmaps=heatmaps, note=note, shows=shows)
        return real(rows_, out, heatmaps, note, shows)

    monkeypatch.setattr(vlp.viz, "plot_retrieval_grid", spy)
    written = run_retrieval_gradcam(run, layer=1)
    assert written == [
        run / "eval" / "retrieval_examples_gradcam.png",
        run / "eval" / "retrieval_examples_words" / "query0.png",
        run / "eval" / "retrieval_examples_words" / "query3.png",
    ]
    assert all(p.stat().st_size > 0 for p in written)
    vm = VLPModel.from_pretrained(checkpoint, device="cpu")
    assert drawn["rows"] == rows and "fusion layer 1" in drawn["note"]
    step = json.loads((checkpoint / "state.json").read_text())["step"]
    for png in written:  # the grid and each caption's words: the run and the checkpoint's step
        with Image.open(png) as im:
            assert im.text["Title"].splitlines()[0] == f"{run.name}, step {step}"
    for row, maps in zip(rows, drawn["heatmaps"]):
        paths = [t["path"] for t in row["top"]]
        expected = grounding_maps(vm, paths, [row["text"]] * 3, 1, words_only=True)
        assert maps.shape == expected.shape == (3, *vm.explain(paths[0], "a", 1).maps.shape[1:])
        torch.testing.assert_close(maps, expected)


def test_plot_retrieval_gradcam_takes_the_checkpoint_metrics_json_records(checkpoint, tmp_path) -> None:
    from vlp.cli import main

    folder = tmp_path / "eval_out"
    _examples(folder, tmp_path / "images")
    (folder / "metrics.json").write_text(json.dumps({"checkpoint": str(checkpoint)}))
    out = tmp_path / "pictures"
    assert main(["plot", "retrieval", str(folder), "--gradcam", "--out", str(out)]) == 0
    assert (out / "retrieval_examples_gradcam.png").stat().st_size > 0
    assert sorted(p.name for p in (out / "retrieval_examples_words").iterdir()) == ["query0.png", "query3.png"]


def test_plot_retrieval_gradcam_errors_name_what_is_missing(checkpoint, tmp_path, capsys) -> None:
    from vlp.cli import main

    folder = tmp_path / "eval_out"
    _examples(folder, tmp_path / "images")
    assert main(["plot", "retrieval", str(folder), "--gradcam"]) == 2
    assert "pass --checkpoint" in capsys.readouterr().err
    (folder / "metrics.json").write_text(json.dumps({"checkpoint": str(tmp_path / "gone")}))
    assert main(["plot", "retrieval", str(folder), "--gradcam"]) == 2
    assert "gone" in capsys.readouterr().err
    assert main(["plot", "retrieval", str(folder), "--gradcam", "--checkpoint", str(checkpoint), "--layer", "7"]) == 2
    assert "--layer 7" in capsys.readouterr().err


def test_retrieval_grid_wants_one_map_per_retrieved_image(tmp_path) -> None:
    from vlp.viz import plot_retrieval_grid

    rows = _examples(tmp_path, tmp_path / "images")
    with pytest.raises(ValueError, match="one heat map per retrieved image"):
        plot_retrieval_grid(rows, tmp_path / "x.png", [torch.zeros(3, 4, 4), torch.zeros(2, 4, 4)])


def test_plot_retrieval_gradcam_of_a_finetuning_uses_its_best_checkpoint(checkpoint, tmp_path) -> None:
    """A fine-tuning writes RUN/test/retrieval_examples.json and names its best checkpoint in RUN/results.json."""
    from vlp.runs.evaluation.explain import _evaluated_checkpoint

    run = checkpoint.parent.parent
    _examples(run / "test", tmp_path / "images")
    assert _evaluated_checkpoint(run / "test" / "retrieval_examples.json") == run  # no results.json yet
    (run / "results.json").write_text(json.dumps({"best": str(checkpoint)}))
    try:
        assert _evaluated_checkpoint(run / "test" / "retrieval_examples.json") == checkpoint
    finally:
        (run / "results.json").unlink()
