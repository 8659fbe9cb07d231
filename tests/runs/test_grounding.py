"""`vlp evaluate grounding` (vlp.runs.evaluation.gradcam_grounding): a tiny shapes world's grounding files, a tiny
untrained ALBEF checkpoint, the files and keys it writes, its baselines against the library's, and
the box choice on a constructed map."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vlp.config import PretrainConfig, load_config, to_dict
from vlp.data.grounding import read_grounding_file
from vlp.eval.grounding import box_scores, fixed_position_prior, prior_accuracy, random_candidate_accuracy
from vlp.models.build import build_model_of_kind
from vlp.preprocess.transforms import load_tokenizer
from vlp.runs.evaluation.gradcam_grounding import choose_boxes, entry_size, run_evaluate_grounding
from vlp.weights import save_checkpoint
from vlp.world.task_files.grounding import write_grounding_splits

TINY = ["model.vision.depth=1", "model.text.layers=1", "model.text.fusion_layers=2"]


def tiny_checkpoint(root: Path) -> Path:
    """An untrained tiny ALBEF (2 fusion layers) of the shapes config, saved as a pretraining checkpoint."""
    cfg = load_config(PretrainConfig, "configs/pretrain/shapes_tiny.yaml", TINY)
    torch.manual_seed(0)
    model = build_model_of_kind("pretrain", cfg.model, len(load_tokenizer(cfg.model.text)))
    return save_checkpoint(
        root / "checkpoints" / "step_0000001", model, {"task": "pretrain", "step": 1, "config": to_dict(cfg)}
    )


@pytest.fixture(scope="module")
def world(make_world) -> dict[str, Path]:
    return write_grounding_splits(make_world(seed=0, n_train=40, n_val=4, n_test=12)["root"])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("run"))


def test_writes_metrics_predictions_and_examples(checkpoint, world, tmp_path) -> None:
    rec = run_evaluate_grounding(
        checkpoint, world["grounding_test"], tmp_path, train=world["grounding_train"], batch_size=5, show_progress=False
    )
    entries = read_grounding_file(world["grounding_test"], split_kind="eval")
    assert rec["n"] == len(entries) > 5 and rec["layer"] == 0 and rec["n_fusion_layers"] == 2
    assert 0.0 <= rec["accuracy"] <= 100.0
    cands, targets = [e.candidates for e in entries], [e.bbox for e in entries]
    sizes = [entry_size(e) for e in entries]
    assert rec["random_candidate"] == random_candidate_accuracy(cands, targets)
    train = read_grounding_file(world["grounding_train"])
    fit = fixed_position_prior([e.candidates for e in train], [e.bbox for e in train], [entry_size(e) for e in train])
    prior = rec["fixed_position"]
    assert prior["point"] == list(fit.point) and prior["train_accuracy"] == fit.train_accuracy
    assert prior["accuracy"] == prior_accuracy(fit.point, cands, targets, sizes)
    assert json.loads((tmp_path / "metrics.json").read_text()) == rec
    preds = json.loads((tmp_path / "predictions.json").read_text())
    assert len(preds) == rec["n"]
    assert all(p["chosen"] == max(range(len(p["scores"])), key=p["scores"].__getitem__) for p in preds)
    assert rec["accuracy"] == pytest.approx(100.0 * sum(p["hit"] for p in preds) / len(preds))
    assert (tmp_path / "grounding_examples.png").stat().st_size > 0


def test_layer_and_batch_size_change_nothing_but_the_layer(checkpoint, world, tmp_path) -> None:
    a = run_evaluate_grounding(checkpoint, world["grounding_test"], tmp_path / "a", batch_size=3, show_progress=False)
    b = run_evaluate_grounding(checkpoint, world["grounding_test"], tmp_path / "b", batch_size=64, show_progress=False)
    pa, pb = (json.loads((tmp_path / d / "predictions.json").read_text()) for d in "ab")
    assert [p["chosen"] for p in pa] == [p["chosen"] for p in pb] and a["fixed_position"] is None
    for x, y in zip(pa, pb):
        assert x["scores"] == pytest.approx(y["scores"], rel=1e-4, abs=1e-9)
    c = run_evaluate_grounding(checkpoint, world["grounding_test"], tmp_path / "c", layer=1, show_progress=False)
    assert c["layer"] == 1 and a["accuracy"] == b["accuracy"]
    with pytest.raises(ValueError, match="fusion layers 0..1"):
        run_evaluate_grounding(checkpoint, world["grounding_test"], tmp_path / "d", layer=2, show_progress=False)


def test_choice_follows_box_scores_on_a_constructed_map() -> None:
    """A 4x4 patch map hot in its bottom-right quarter, on a 32x32 image: the candidate covering
    that quarter wins, the same box shifted to the top-left loses, and a huge box is penalised by
    the sqrt(area) normalisation."""
    heat = torch.zeros(4, 4)
    heat[2:, 2:] = 1.0
    cands = [[0, 0, 16, 16], [16, 16, 16, 16], [0, 0, 32, 32], [16, 0, 16, 16]]
    chosen, scores = choose_boxes(torch.stack([heat, heat.flip(0, 1)]), [cands, cands], [(32, 32), (32, 32)])
    assert chosen == [1, 0]
    assert scores[0] == pytest.approx(box_scores(heat, cands, (32, 32)).tolist())
    assert scores[0][1] > scores[0][2] > scores[0][3] and scores[0][1] > scores[0][0]
    with pytest.raises(ValueError, match="2 maps, 1 candidate lists"):
        choose_boxes(torch.stack([heat, heat]), [cands], [(32, 32)])


def test_cli_evaluate_grounding_and_a_bad_layer(checkpoint, world, tmp_path, capsys) -> None:
    from vlp.cli import main

    args = ["evaluate", "grounding", "--checkpoint", str(checkpoint), "--data", str(world["grounding_test"])]
    assert main([*args, "--train", str(world["grounding_train"]), "--out", str(tmp_path / "cli")]) == 0
    cli = json.loads((tmp_path / "cli" / "metrics.json").read_text())
    lib = run_evaluate_grounding(
        checkpoint, world["grounding_test"], tmp_path / "lib", train=world["grounding_train"], show_progress=False
    )
    assert cli["accuracy"] == lib["accuracy"] and cli["fixed_position"] == lib["fixed_position"]
    capsys.readouterr()
    assert main([*args, "--layer", "5", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["vlp: error: --layer 5: fusion layer 5 does not exist: this model has fusion layers 0..1"]
