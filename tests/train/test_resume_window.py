"""A checkpoint taken between two log steps carries the open log window (issue 41, item 2b): its
host counters and every rank's device sums, so that after a kill or a preemption and a resume the
next log record, the run's sample counts and the ``data.max_bad_fraction`` judgement are exactly an
uninterrupted run's."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from tests.train.test_reliability import Toy, cfg, loader, step_dir
from vlp.errors import DataError
from vlp.train.checkpoints import Checkpointer
from vlp.train.logging import read_metrics
from vlp.train.loop import train
from vlp.train.preemption import Preempted
from vlp.weights import read_state

TIMING = ("pairs_per_s", "data_time")  # wall-clock measurements: never equal between two runs
BAD = [0, 1, 2, 3]  # bad samples of the loader's 4 batches


class Killed(Exception):
    """The process died here (in-process stand-in for SIGKILL: nothing after this point runs)."""


def killed_after_checkpoint(monkeypatch: pytest.MonkeyPatch, at: int) -> None:
    """The run dies right after its checkpoint of step ``at`` is published."""
    save = Checkpointer.save

    def save_then_die(self: Checkpointer, step: int) -> None:
        save(self, step)
        if step == at:
            raise Killed(step)

    monkeypatch.setattr(Checkpointer, "save", save_then_die)


def records(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(run / "metrics.jsonl")]


def reference(run: Path, steps: int = 10, bad: list[int] = BAD) -> None:
    torch.manual_seed(0)
    train(Toy(), loader(bad=bad), cfg(steps=steps, log_every=4, ckpt_every=3), run)


def assert_same_run(a: Path, b: Path, steps: int) -> None:
    assert records(b) == records(a)  # losses and bad-sample counts of every window, to the last bit
    assert read_state(step_dir(b, steps))["samples"] == read_state(step_dir(a, steps))["samples"]


@pytest.mark.parametrize("at", [3, 6, 9])
def test_a_kill_between_log_steps_loses_no_part_of_the_window(tmp_path: Path, monkeypatch, at: int) -> None:
    """log_every=4, ckpt_every=3: the checkpoints of steps 3, 6 and 9 fall inside a window."""
    reference(tmp_path / "full")
    torch.manual_seed(0)
    with monkeypatch.context() as m:
        killed_after_checkpoint(m, at)
        with pytest.raises(Killed):
            train(Toy(), loader(bad=BAD), cfg(steps=10, log_every=4, ckpt_every=3), tmp_path / "run")
    torch.manual_seed(1)  # the resumed run's generators come from the checkpoint, not from here
    train(Toy(), loader(bad=BAD), cfg(steps=10, log_every=4, ckpt_every=3, resume="auto"), tmp_path / "run")
    assert_same_run(tmp_path / "full", tmp_path / "run", 10)


def test_a_preempted_run_keeps_its_open_window(tmp_path: Path) -> None:
    """SIGTERM during step 5: the run checkpoints step 5 (one step into the window of steps 5-8) and stops."""
    reference(tmp_path / "full")

    class Preempt(Toy):
        def forward(self, batch, step=0):
            if step + 1 == 5:
                os.kill(os.getpid(), signal.SIGTERM)  # recorded by the loop's handler, acted on after the step
            return super().forward(batch, step)

    torch.manual_seed(0)
    with pytest.raises(Preempted, match="after step 5 of 10"):
        train(Preempt(), loader(bad=BAD), cfg(steps=10, log_every=4, ckpt_every=3), tmp_path / "run")
    train(Toy(), loader(bad=BAD), cfg(steps=10, log_every=4, ckpt_every=3, resume="auto"), tmp_path / "run")
    assert_same_run(tmp_path / "full", tmp_path / "run", 10)


def test_the_bad_share_is_judged_on_the_same_counts_after_a_resume(tmp_path: Path, monkeypatch) -> None:
    """Half the samples bad: the uninterrupted run stops at its first log step past 100 samples
    (step 16); killed after step 3 and resumed, it stops there too, with the same numbers."""
    args = dict(steps=20, log_every=4, ckpt_every=3)
    torch.manual_seed(0)
    with pytest.raises(DataError) as full:
        train(Toy(), loader(bad=[4] * 4), cfg(**args), tmp_path / "full", max_bad_fraction=0.1)
    assert str(full.value).startswith("64 of the 128 samples loaded so far were bad")
    torch.manual_seed(0)
    with monkeypatch.context() as m:
        killed_after_checkpoint(m, 3)
        with pytest.raises(Killed):
            train(Toy(), loader(bad=[4] * 4), cfg(**args), tmp_path / "run", max_bad_fraction=0.1)
    with pytest.raises(DataError) as resumed:
        train(Toy(), loader(bad=[4] * 4), cfg(**args, resume="auto"), tmp_path / "run", max_bad_fraction=0.1)
    # the same numbers and step; each message names its own run's checkpoint
    assert str(resumed.value).replace(str(tmp_path / "run"), "RUN") == str(full.value).replace(
        str(tmp_path / "full"), "RUN"
    )
    assert_same_run(tmp_path / "full", tmp_path / "run", 16)
