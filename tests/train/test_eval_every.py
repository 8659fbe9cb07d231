"""``train.eval_every``: zero-shot retrieval of ``data.eval`` while pretraining (issue 54, item 3).

Runs of ``vlp pretrain`` on a tiny shapes world, in this process: the evaluation records appear in
``metrics.jsonl`` at steps N, 2N, ... and after the last step; the losses and final weights equal a
run without them (text dropout on, so a draw of the evaluation from torch's generator would show);
a run killed during an evaluation and resumed, then resumed once more from a checkpoint with later
records to drop, logs every evaluation once and trains as the uninterrupted run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from tests.helpers import NO_TASKS, QUICK, SHAPES_TINY, TINY_ALBEF, pretrain
from vlp.cli import main
from vlp.config import FinetuneConfig, PretrainConfig, TrainConfig, load_config
from vlp.config.resume import resume_changes
from vlp.errors import ConfigError
from vlp.runs.evaluation.image_text_retrieval import PeriodicRetrieval
from vlp.train.logging import MetricsLog, read_metrics
from vlp.train.step_stats import Reporter

WORLD = dict(seed=0, n_train=16, n_val=0, n_test=8, image_size=32, **NO_TASKS)
STEPS = 6
#: a tiny ALBEF on 32 px images with text dropout (training draws from torch's generator), every step logged
RUN = [
    *TINY_ALBEF,
    "model.vision.img_size=32",
    "model.text.dropout=0.1",
    *QUICK,
    f"train.steps={STEPS}",
    "train.log_every=1",
    "eval.k_test=4",
]
LOSSES = ("loss", "itc", "itm", "mlm", "lr", "temp", "alpha")


def run(out: Path, world: dict[str, Path], *overrides: str) -> Path:
    """``vlp pretrain`` of ``RUN`` on ``world`` with ``data.eval`` set, into ``out``."""
    assert pretrain(out, world["pretrain"], *RUN, f"data.eval={world['retrieval_test']}", *overrides) == 0
    return out


def losses(run_dir: Path) -> list[dict[str, Any]]:
    """The loss records of a run (step and the keys of ``LOSSES``), in order."""
    return [{k: r[k] for k in ("step", *LOSSES)} for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]


def evaluations(run_dir: Path) -> list[dict[str, Any]]:
    """The evaluation records of a run, in order."""
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/r_mean" in r]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step_{STEPS:07d}" / "model.safetensors")


def assert_same_training(a: Path, b: Path) -> None:
    """Every logged loss value and every final weight of ``b`` equal to ``a``'s, bit for bit."""
    assert losses(b) == losses(a) and [r["step"] for r in losses(a)] == list(range(1, STEPS + 1))
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(v, wb[k]) for k, v in wa.items())


@pytest.fixture(scope="module")
def runs(world, tmp_path_factory) -> dict[str, Path]:
    """``plain``: ``data.eval`` after training only; ``every4``: ``train.eval_every=4`` (steps 4 and 6)."""
    tmp = tmp_path_factory.mktemp("eval_every")
    return {"plain": run(tmp / "plain", world), "every4": run(tmp / "every4", world, "train.eval_every=4")}


# ----------------------------------------------------------------------------- the config


def test_the_key_is_checked_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"config key 'train.eval_every': got -1, expected >= 0"):
        load_config(PretrainConfig, SHAPES_TINY, ["train.eval_every=-1"])
    with pytest.raises(ConfigError, match=r"train.eval_every=2 with data.eval unset .*set data.eval"):
        load_config(PretrainConfig, SHAPES_TINY, ["train.eval_every=2"])
    cfg = load_config(PretrainConfig, SHAPES_TINY, ["train.eval_every=2", "data.eval=test.json"])
    assert cfg.train.eval_every == 2 and load_config(PretrainConfig, SHAPES_TINY, []).train.eval_every == 0
    with pytest.raises(ConfigError, match=r"train.eval_every=2 \(pretraining's .*every eval_every steps\)"):
        load_config(FinetuneConfig, None, ["train.eval_every=2"])
    # a resume may turn it on, with the split it evaluates: neither changes the training
    saved = {"train": {"eval_every": 0}, "data": {"eval": None, "relevance": None}}
    new = {"train": {"eval_every": 2}, "data": {"eval": "test.json", "relevance": "rel.json"}}
    assert resume_changes(saved, new, [], "state.json") == {
        "train.eval_every": (0, 2),
        "data.eval": (None, "test.json"),
        "data.relevance": (None, "rel.json"),
    }


# ----------------------------------------------------------------------------- the records


def test_evaluations_every_n_steps_and_at_the_end_change_nothing(runs, capsys) -> None:
    plain, every = runs["plain"], runs["every4"]
    assert evaluations(plain) == []
    records = evaluations(every)
    assert [r["step"] for r in records] == [4, STEPS]
    keys = {"step", "eval/txt_r1", "eval/txt_r5", "eval/txt_r10", "eval/img_r1", "eval/img_r_mean", "eval/rsum"}
    assert all(keys <= r.keys() for r in records)
    assert_same_training(plain, every)
    # the evaluation after the last step is the run's eval/ (not repeated): the checkpoint's evaluation
    final, of_checkpoint = (json.loads((r / "eval" / "metrics.json").read_text()) for r in (every, plain))
    assert final.pop("checkpoint") == str(every / "checkpoints" / f"step_{STEPS:07d}")
    assert final == {k: v for k, v in of_checkpoint.items() if k != "checkpoint"}
    assert {f"eval/{k}": v for k, v in final.items() if f"eval/{k}" in records[-1]} == {
        k: v for k, v in records[-1].items() if k != "step"
    }


def test_the_loss_plot_draws_the_retrieval_curves(runs) -> None:
    assert main(["plot", "losses", str(runs["every4"])]) == 0
    with Image.open(runs["every4"] / "loss_curves.png") as im:  # loss itc itm mlm; R@1 and r_mean below
        assert im.size == (4 * 400, 2 * 320)
    assert main(["plot", "losses", str(runs["plain"]), "--out", str(runs["plain"] / "l.png")]) == 0
    with Image.open(runs["plain"] / "l.png") as im:  # no evaluation logged: the losses alone
        assert im.size == (4 * 400, 320)


def test_an_evaluation_is_left_out_of_the_log_window_time(tmp_path) -> None:
    acc = SimpleNamespace(is_main_process=True, device=torch.device("cpu"), num_processes=1)
    rep = Reporter(cast(Any, acc), TrainConfig(progress=False), MetricsLog(tmp_path / "m.jsonl"), 0)
    with rep.paused():
        time.sleep(0.2)
    assert rep.window_state()["elapsed"] < 0.1


# ----------------------------------------------------------------------------- resume


def test_a_run_killed_during_an_evaluation_resumes_evaluating_at_the_same_steps(
    world, runs, tmp_path, monkeypatch, capsys
) -> None:
    """Killed during the evaluation of step 4 (checkpoints every 2 steps): the checkpoint of step 4
    is not written yet (the evaluation comes first), so the resume from step 2 evaluates step 4
    again. Then a crash after the evaluation of the last step, before its checkpoint: resumed from
    step 4, whose evaluation stays; the records of steps 5 and 6 are dropped and logged again."""
    evaluate = PeriodicRetrieval.__call__

    def killed_at_step_4(self: PeriodicRetrieval, task: Any, step: int) -> dict[str, float]:
        if step == 4:
            raise RuntimeError("killed during the evaluation of step 4")
        return evaluate(self, task, step)

    out, every2 = tmp_path / "every2", ["train.eval_every=2", "train.ckpt_every=2"]
    with monkeypatch.context() as m, pytest.raises(RuntimeError, match="killed during"):
        m.setattr(PeriodicRetrieval, "__call__", killed_at_step_4)
        run(out, world, *every2)
    assert [r["step"] for r in evaluations(out)] == [2] and losses(out)[-1]["step"] == 4
    assert not (out / "checkpoints" / "step_0000004").exists()
    assert main(["pretrain", "--config", str(out / "config.yaml"), "--resume", "auto"]) == 0
    printed = capsys.readouterr().out
    assert "resumed from" in printed and "evaluation at step 4 of 6: txt_r1 " in printed  # as the progress goes
    assert [r["step"] for r in evaluations(out)] == [2, 4, 6]
    assert_same_training(runs["plain"], out)
    first = evaluations(out)
    (out / "checkpoints" / f"step_{STEPS:07d}").rename(tmp_path / "lost")
    assert main(["pretrain", "--config", str(out / "config.yaml"), "--resume", "auto"]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert evaluations(out) == first
    assert_same_training(runs["plain"], out)
