"""A stop is a checkpoint (issue 52, break 6): a run that stops after step 1 for a reason it can name
writes a checkpoint first, as SIGTERM does, and its one error line says where it stopped and how to
resume. Before: the bucket deleted after step 1 gave 8 "skipped a bad shard" lines, then "hold no
readable samples", status 2 and no checkpoint: every step since the last periodic one was lost.

The faults here: the data folder vanishes between two steps (a deleted bucket: every shard unreadable,
skipped, then none readable), a shard that turns bad mid-run under ``data.on_bad_sample=raise``, and
bad samples past ``data.max_bad_fraction``. ``--resume auto`` continues from the checkpoint."""

from __future__ import annotations

import json
import os
import re
import tarfile
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.data.test_img2dataset_shards import tiny_run, write_img2dataset
from vlp.cli import main

CONFIG = "configs/pretrain/shapes_tiny.yaml"
# 4 shards of 5 images, batches of 4: 5 batches an epoch; the fault strikes before step 6
STEPS, FAULT_AT = 8, 5


def args(data: Path, run: Path, *extra: str) -> list[str]:
    """``vlp pretrain`` of a tiny ALBEF on the shards in ``data`` into ``run``, logging every step, no
    periodic checkpoint (the one the stop writes is the only one)."""
    keys = ("data.batch_size=4", "data.shuffle_buffer=4", f"train.steps={STEPS}", "train.log_every=1")
    return ["pretrain", "--config", CONFIG, *tiny_run(run, data, *keys, *extra)]


def fault_before_step(monkeypatch: pytest.MonkeyPatch, at: int, fault: Callable[[], Any]) -> None:
    """Run ``fault()`` once, just before the loop's optimizer step ``at`` (0-based) fetches its batch."""
    import vlp.train.loop as loop

    real = loop.train_step

    def step(*a: Any, **kw: Any) -> Any:
        if a[6] == at:
            fault()
        return real(*a, **kw)

    monkeypatch.setattr(loop, "train_step", step)


def records(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def stop_line(err: str) -> str:
    """The one ``vlp: error:`` line of a stopped run."""
    lines = [x for x in err.splitlines() if x.startswith("vlp: error:")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_vanished_data_folder_stops_the_run_with_a_checkpoint_that_resumes(
    workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    """With a loader worker too: its error arrives wrapped in the worker's traceback; the line keeps
    the original message."""
    data, gone = write_img2dataset(tmp_path / "bucket"), tmp_path / "deleted"
    run = tmp_path / "run"
    fault_before_step(monkeypatch, FAULT_AT, lambda: os.rename(data, gone))
    argv = [a.replace("data.num_workers=0", f"data.num_workers={workers}") for a in args(data, run)]
    assert main(argv) == 2
    err = capfd.readouterr().err
    line = stop_line(err)
    assert "Traceback" not in err
    ckpt = run / "checkpoints" / f"step_{FAULT_AT:07d}"
    assert "hold no readable samples" in line
    assert f"the run stopped after step {FAULT_AT} of {STEPS}; checkpoint {ckpt}" in line
    assert line.endswith("Resume: run the same command with --resume auto (or train.resume=auto)"), line
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "train_state").is_dir()
    assert records(run) == list(range(1, FAULT_AT + 1))

    monkeypatch.undo()
    os.rename(gone, data)  # the bucket is back
    assert main([*argv, "--resume", "auto"]) == 0
    assert f"resumed from {ckpt} at step {FAULT_AT} of {STEPS}" in capfd.readouterr().out
    assert records(run) == list(range(1, STEPS + 1))
    assert (run / "checkpoints" / f"step_{STEPS:07d}" / "model.safetensors").is_file()


def test_a_shard_that_turns_bad_under_raise_stops_with_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    data = write_img2dataset(tmp_path / "shards")
    run = tmp_path / "run"

    def cut() -> None:  # every shard cut in the middle of its first member
        for tar in data.glob("*.tar"):
            with tarfile.open(tar) as tf:
                first = tf.getmembers()[0]
            with open(tar, "r+b") as f:
                f.truncate(first.offset_data + first.size // 2)

    fault_before_step(monkeypatch, FAULT_AT, cut)
    raising = [a.replace("data.on_bad_sample=skip", "data.on_bad_sample=raise") for a in args(data, run)]
    assert main(raising) == 2
    line = stop_line(capfd.readouterr().err)
    ckpt = run / "checkpoints" / f"step_{FAULT_AT:07d}"
    assert re.search(r"\.tar", line) and f"the run stopped after step {FAULT_AT} of {STEPS}; checkpoint {ckpt}" in line
    assert "Resume: run the same command with --resume auto" in line and (ckpt / "model.safetensors").is_file()


def test_a_fault_before_the_first_step_writes_nothing_and_gives_no_resume_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    data, gone = write_img2dataset(tmp_path / "bucket"), tmp_path / "deleted"
    run = tmp_path / "run"
    fault_before_step(monkeypatch, 0, lambda: os.rename(data, gone))
    assert main(args(data, run)) == 2
    line = stop_line(capfd.readouterr().err)
    assert "hold no readable samples" in line and "Resume" not in line and "checkpoint" not in line
    assert not any((run / "checkpoints").iterdir())


def test_bad_samples_past_max_bad_fraction_say_where_the_checkpoint_is_and_how_to_resume(tmp_path: Path, capfd) -> None:
    from tests.data.test_shard_faults import broken_world

    data = broken_world(tmp_path / "w")
    run = tmp_path / "run"
    extra = ("data.batch_size=4", "data.shuffle_buffer=8", "train.steps=40", "train.log_every=4")
    assert main(["pretrain", "--config", CONFIG, *tiny_run(run, data, "data.max_bad_fraction=0.05", *extra)]) == 2
    line = stop_line(capfd.readouterr().err)
    step = int(re.search(r"the run stopped after step (\d+) of 40", line).group(1))
    ckpt = run / "checkpoints" / f"step_{step:07d}"
    assert "more than data.max_bad_fraction=0.05" in line and f"checkpoint {ckpt}" in line
    assert "Resume: run the same command with --resume auto" in line and (ckpt / "model.safetensors").is_file()
