"""``run_evaluate`` (:mod:`vlp.runs.evaluation.by_kind`): a checkpoint evaluated by its kind's registered
evaluator; the VQA, NLVR2 and SNLI-VE evaluators on untrained checkpoints of those kinds, through
:func:`run_evaluate` and through ``vlp evaluate vqa|nlvr2|ve``."""

import json
from pathlib import Path

import pytest

from tests.helpers import QUICK, ROOT, SHAPES_TINY, TINY_ALBEF, table_rows
from vlp.cli import main
from vlp.config import FinetuneConfig, FinetuneDataConfig, PretrainConfig, load_config, to_dict
from vlp.data.downstream_formats import load_nlvr, load_ve, load_vqa
from vlp.models.build import build_model_of_kind
from vlp.registry import UnknownName
from vlp.runs.evaluation.by_kind import run_evaluate
from vlp.weights import save_checkpoint

WORLD = dict(seed=4, n_train=8, n_val=4, n_test=4)


def checkpoint(tmp_path: Path, kind: str, **data) -> Path:
    """An untrained checkpoint of ``kind`` (the tiny shapes model) whose config is a fine-tuning run's."""
    model = load_config(PretrainConfig, ROOT / SHAPES_TINY, [*TINY_ALBEF, *QUICK]).model
    ft = FinetuneConfig(task=kind, data=FinetuneDataConfig(max_len=25, **data))
    state = {"task": kind, "config": to_dict(ft), "model": to_dict(model), "step": 1}
    return save_checkpoint(tmp_path / kind, build_model_of_kind(kind, model, 30522), state)


TASKS = [
    ("vqa", "vqa_val", lambda path: len(load_vqa([path]))),
    ("nlvr2", "nlvr_dev", lambda path: len(load_nlvr(path))),
    ("ve", "ve_dev", lambda path: len(load_ve(path))),
]


@pytest.mark.parametrize(("kind", "split", "count"), TASKS)
def test_a_checkpoint_is_evaluated_by_its_kinds_evaluator(world, tmp_path, kind, split, count):
    extra = {"answer_list": str(world["answer_list"])} if kind == "vqa" else {}
    metrics = run_evaluate(checkpoint(tmp_path, kind, **extra), world[split], tmp_path / "ev")
    assert metrics == json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert metrics["n"] == count(world[split]) > 0 and 0.0 <= metrics["acc"] <= 100.0
    if kind == "vqa":
        assert 0.0 <= metrics["acc_official"] <= 100.0


def test_a_kind_without_an_evaluator_is_named(world, tmp_path):
    with pytest.raises(UnknownName, match=r"unknown evaluator 'nlvr-ta'; known: \['pretrain'"):
        run_evaluate(checkpoint(tmp_path, "nlvr-ta"), world["pretrain"], tmp_path / "ev")


@pytest.mark.parametrize(("kind", "split", "count"), TASKS)
def test_vlp_evaluate_task_prints_and_writes_the_metrics(world, tmp_path, capsys, kind, split, count):
    extra = {"answer_list": str(world["answer_list"])} if kind == "vqa" else {}
    ckpt, out = checkpoint(tmp_path, kind, **extra), tmp_path / "ev"
    argv = ["evaluate", kind, "--checkpoint", str(ckpt), "--data", str(world[split]), "--out", str(out)]
    assert main([*argv, "--image-root", str(Path(world[split]).parent)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    printed = capsys.readouterr().out
    rows = table_rows(printed)  # rounded in the table, exact in metrics.json
    assert metrics["n"] == count(world[split]) and rows["acc"] == [f"{metrics['acc']:.2f}"]
    assert rows["n"] == [f"{metrics['n']:,}"] and f"wrote {out / 'metrics.json'}" in printed


def test_vlp_evaluate_task_names_a_checkpoint_it_cannot_read(world, tmp_path, capsys):
    argv = ["evaluate", "ve", "--checkpoint", str(tmp_path / "none"), "--data", str(world["ve_dev"])]
    assert main([*argv, "--out", str(tmp_path / "ev")]) == 2
    assert str(tmp_path / "none") in capsys.readouterr().err
