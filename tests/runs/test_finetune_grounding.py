"""`vlp finetune grounding` through the command line on a tiny shapes world: checkpoints, best-by-val,
results with both baselines, the validation metric against `vlp evaluate grounding` on the saved
best checkpoint, and the config's errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from tests.helpers import FT_STEPS, QUICK, splits
from vlp.cli import main
from vlp.config import load_finetune_config
from vlp.data.grounding import read_grounding_file
from vlp.errors import ConfigError
from vlp.eval.grounding import random_candidate_accuracy
from vlp.runs.evaluation.gradcam_grounding import position_baseline, run_evaluate_grounding
from vlp.weights import read_state

WORLD = dict(seed=0, n_train=40, n_val=4, n_test=20)
# Grad-CAM's middle layer 0 is not the last one
PRETRAIN = ["model.vision.depth=1", "model.text.layers=1", "model.text.fusion_layers=2", "model.embed_dim=32"]
PRETRAIN += [*QUICK, "train.steps=2"]
CONFIG = "configs/finetune/shapes_grounding.yaml"


@pytest.fixture(scope="module")
def setup(world, pretrained, tmp_path_factory) -> dict[str, Path]:
    """The world's paths, ``pre``: the pretrained run, ``root``: a folder for the runs."""
    return {**world, "pre": pretrained, "root": tmp_path_factory.mktemp("grounding_ft")}


def finetune_grounding(setup: dict[str, Path]) -> list[str]:
    """``vlp finetune grounding`` from the pretrained run on the world's grounding splits, 4 steps."""
    args = ["--config", CONFIG, f"pretrained={setup['pre']}", *FT_STEPS, *splits(setup, "grounding")]
    return ["finetune", "grounding", *args]


def test_finetune_grounding_cli(setup) -> None:
    out = setup["root"] / "ft"
    cmd = finetune_grounding(setup)
    assert main([*cmd, f"output_dir={out}"]) == 0
    val = [json.loads(line) for line in (out / "val_metrics.jsonl").read_text().splitlines()]
    assert [v["step"] for v in val] == [2, 4]
    best = max(val, key=lambda v: v["acc"])  # ties keep the first
    state = read_state(out / "checkpoints" / "best")
    # the model is the retrieval ALBEF: checkpoints of kind retrieval, the run's config says grounding
    assert state["task"] == "retrieval" and state["config"]["task"] == "grounding"
    assert state["best"]["step"] == best["step"]
    assert (out / "checkpoints" / "step_0000004" / "model.safetensors").is_file()

    res = json.loads((out / "results.json").read_text())
    assert res["task"] == "grounding" and res["layer"] == 0 and res["words_only"] is False
    assert res["best"].endswith("best") and res["val"]["accuracy"] == best["acc"]
    train = read_grounding_file(setup["grounding_train"])
    for split in ("val", "test"):
        entries = read_grounding_file(setup[f"grounding_{split}"], split_kind="eval")
        got = res[split]
        assert got["n"] == len(entries) > 0 and 0.0 <= got["accuracy"] <= 100.0
        assert got["random_candidate"] == random_candidate_accuracy(
            [e.candidates for e in entries], [e.bbox for e in entries]
        )
        sizes = [e.image_size for e in entries]
        assert got["fixed_position"] == position_baseline(train, entries, sizes)
        assert json.loads((out / split / "metrics.json").read_text()) == got
    assert (out / "test" / "grounding_examples.png").stat().st_size > 0
    with Image.open(out / "test" / "grounding_examples.png") as im:  # the run and its best checkpoint's step
        assert im.text["Title"].splitlines()[0] == f"ft, step {best['step']}"

    # validation scored exactly what `vlp evaluate grounding` scores on the saved best checkpoint
    rec = run_evaluate_grounding(
        out / "checkpoints" / "best",
        setup["grounding_val"],
        setup["root"] / "eval",
        train=setup["grounding_train"],
        batch_size=16,
        device="cpu",
        show_progress=False,
    )
    assert rec["accuracy"] == best["acc"] and rec["checkpoint_kind"] == "retrieval" and rec["layer"] == 0
    assert rec["random_candidate"] == res["val"]["random_candidate"]
    assert rec["fixed_position"]["accuracy"] == res["val"]["fixed_position"]["accuracy"]


def test_a_fusion_layer_the_model_lacks_fails_before_training(setup, capsys) -> None:
    out = setup["root"] / "bad_layer"
    cmd = finetune_grounding(setup)
    capsys.readouterr()
    assert main([*cmd, f"output_dir={out}", "grounding.layer=2"]) == 2
    err = capsys.readouterr().err
    assert "config key 'grounding.layer'" in err and "fusion layers 0..1" in err
    assert not (out / "checkpoints").exists()


@pytest.mark.parametrize(
    "task, overrides, message",
    [
        ("grounding", ["loss.mlm=0.5"], "the grounding model has no MLM head"),
        ("grounding", ["loss.itc_positives=pair"], "grounding positives are by image id"),
        ("grounding", ["loss.regulation=srcl"], "retrieval only"),
        ("retrieval", ["grounding.words_only=true"], "grounding.* set for task=retrieval"),
        ("grounding", ["grounding.layer=-1"], "config key 'grounding.layer': got -1"),
    ],
)
def test_wrong_combinations_are_config_errors(task: str, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("*", r"\*").replace("(", r"\(")):
        load_finetune_config(
            task, CONFIG if task == "grounding" else "configs/finetune/shapes_retrieval.yaml", overrides
        )
