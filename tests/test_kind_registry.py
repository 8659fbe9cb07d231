"""The kind registry (:data:`vlp.kinds.KINDS`, issues 43 and 53): every built-in kind has its model
builder, runner and evaluator registered where they are defined, and a binary image-text task defined
entirely outside vlp (tests/toy_task.py: a Kind, a model builder, the generic classification recipe's
runner and evaluator) runs through ``vlp finetune`` and ``vlp evaluate`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tests import toy_task
from tests.helpers import FT, QUICK, TINY_ALBEF, table_rows
from vlp.checkpoint import open_checkpoint
from vlp.cli import build_parser, main
from vlp.config import FinetuneConfig, ModelConfig, TextConfig, VisionConfig
from vlp.kinds import KINDS, Kind, checkpoint_kinds, finetune_kinds, kinds_with
from vlp.models.build import MODEL_BUILDERS, build_model_of_kind
from vlp.registry import UnknownName
from vlp.runs.evaluation import EVALUATORS
from vlp.runs.training.finetune import RUNNERS

WORLD = dict(seed=5, n_train=16, n_val=4, n_test=4)
PRETRAIN = [*TINY_ALBEF, "model.queue_size=16", "model.embed_dim=32", *QUICK, "train.steps=2"]
TOY = toy_task.NAME


@pytest.fixture
def toy_kind():
    toy_task.register()
    try:
        yield KINDS.get(TOY)
    finally:
        toy_task.unregister()


def write_toy_file(world: dict[str, Path], path: Path) -> Path:
    """Each pretraining image of the world with its first caption (a match) and with another image's
    (a mismatch)."""
    pairs = json.loads(world["pretrain"].read_text())
    root = world["pretrain"].parent
    captions = [e["caption"][0] if isinstance(e["caption"], list) else e["caption"] for e in pairs]
    rows = []
    for i, e in enumerate(pairs):
        image = str((root / e["image"]).resolve())
        rows += [
            {"image": image, "caption": captions[i], "match": 1},
            {"image": image, "caption": captions[(i + len(pairs) // 2) % len(pairs)], "match": 0},
        ]
    path.write_text(json.dumps(rows))
    return path


def test_a_task_registered_outside_vlp_finetunes_and_evaluates_through_the_cli(
    world, pretrained, tmp_path, capsys, toy_kind
):
    data = write_toy_file(world, tmp_path / "toy.json")
    config = tmp_path / "toy.yaml"
    config.write_text(f"task: {TOY}\ndata:\n  max_len: 32\n")
    out = tmp_path / "run"
    assert TOY in finetune_kinds()
    args = ["finetune", TOY, "--config", str(config), f"output_dir={out}", f"pretrained={pretrained}"]
    assert main([*args, *FT, f"data.train=[{data}]", f"data.val={data}"]) == 0
    results = json.loads((out / "results.json").read_text())
    state = json.loads((Path(results["best"]) / "state.json").read_text())
    assert results["task"] == TOY and state["task"] == TOY and results["majority_class"] in ("mismatch", "match")
    assert 0.0 <= results["val"]["acc"] <= 100.0 and results["val"]["n"] == len(json.loads(data.read_text()))
    ckpt = open_checkpoint(out, torch.device("cpu"))  # its kind builds the toy model and reads its config
    assert (
        ckpt.kind == TOY and isinstance(ckpt.model, toy_task.ToyMatchModel) and isinstance(ckpt.config, FinetuneConfig)
    )
    capsys.readouterr()
    assert main(["evaluate", TOY, "--checkpoint", str(out), "--data", str(data), "--out", str(tmp_path / "ev")]) == 0
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert metrics["n"] == len(json.loads(data.read_text())) and 0.0 <= metrics["acc"] <= 100.0
    assert table_rows(capsys.readouterr().out)["acc"] == [f"{metrics['acc']:.2f}"]


def test_the_toy_task_is_offered_only_while_registered(toy_kind):
    parser = build_parser()
    assert parser.parse_args(["evaluate", TOY, "--checkpoint", "c", "--data", "d", "--out", "o"]).what == TOY
    assert parser.parse_args(["finetune", TOY, "--config", "c.yaml"]).task == TOY
    toy_task.unregister()
    try:
        with pytest.raises(UnknownName, match=r"unknown kind 'toy-match'; known: \['pretrain'"):
            KINDS.get(TOY)
        with pytest.raises(SystemExit):
            build_parser().parse_args(["evaluate", TOY, "--checkpoint", "c", "--data", "d", "--out", "o"])
    finally:
        toy_task.register()  # for the fixture's teardown
    with pytest.raises(ValueError, match="registered already"):
        KINDS.register(TOY, toy_kind)


def test_every_built_in_kind_has_its_model_runner_and_evaluator():
    cfg = ModelConfig(
        vision=VisionConfig(depth=1, img_size=32),
        text=TextConfig(layers=1, fusion_layers=1),
        queue_size=0,
        embed_dim=16,
    )
    for name in checkpoint_kinds():
        assert isinstance(build_model_of_kind(name, cfg, 30522), nn.Module), name
    for name, entry in KINDS.items():
        assert isinstance(entry, Kind) and entry.name == name and callable(MODEL_BUILDERS.get(name)), name
        assert entry.saves_as in checkpoint_kinds(), name
        assert (name in RUNNERS) == entry.finetuned, name
    assert set(finetune_kinds()) == {"retrieval", "vqa", "nlvr2", "nlvr-ta", "ve", "grounding"}
    assert kinds_with("similarity") == ("pretrain", "helper", "retrieval")
    assert set(KINDS.names()) - set(EVALUATORS.names()) == {"nlvr-ta"}
    assert EVALUATORS.get("pretrain") is EVALUATORS.get("helper") is EVALUATORS.get("retrieval")


def test_an_unknown_kind_names_the_known_ones():
    with pytest.raises(UnknownName, match=r"unknown kind 'nope'; known: \['pretrain', 'helper'"):
        build_model_of_kind("nope", ModelConfig(), 30522)
    with pytest.raises(UnknownName, match=r"config key 'task': unknown fine-tuning runner 'nope'"):
        RUNNERS.get("nope")
