"""One run per folder (issue 52, break 10): ``output_dir`` is locked for the run's life (``flock`` on
``output_dir/.lock``, released by the kernel when the process ends, however it ends); a second run
into it is refused in one line naming the process that holds it, before it writes anything. Before:
two runs 2 s apart both exited 0, ``metrics.jsonl`` held two records of one step and one checkpoint
overwrote the other (the check looked for files; a resume skips even that)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, SHAPES_TINY, TINY_ALBEF_32, launch

HOLD = """import sys, time
from pathlib import Path
from vlp.locks import lock_folder
lock_folder(Path(sys.argv[1]), "output_dir")
print("held", flush=True)
time.sleep(600)
"""


def holder(folder: Path) -> subprocess.Popen:
    """Another process holding ``folder``'s run lock (as a run does), until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def run_args(data: Path, run: Path, *extra: str) -> list[str]:
    """``vlp pretrain`` of the tiny ALBEF on ``data`` into ``run``."""
    quick = ["data.batch_size=4", "data.num_workers=0", "train.progress=false", "train.warmup_steps=0"]
    return [
        "pretrain",
        "--config",
        SHAPES_TINY,
        f"data.train=[{data}]",
        f"output_dir={run}",
        *quick,
        *TINY_ALBEF_32,
        *extra,
    ]


@pytest.fixture(scope="module")
def pairs(make_world) -> Path:
    world = make_world("lock", seed=0, n_train=16, n_val=0, n_test=0, image_size=32, vqa_per_image=0, nlvr_per_image=0)
    return world["pretrain"]


def test_a_second_run_into_a_running_runs_folder_is_refused_naming_it(pairs: Path, tmp_path: Path) -> None:
    """Run A trains; run B resumes into A's folder meanwhile (a resume passes the files check): B is
    refused at once, in one line naming A's process; A, stopped then, holds one record per step."""
    run = tmp_path / "run"
    args = run_args(pairs, run, "train.steps=100000", "train.log_every=1", "train.ckpt_every=2")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    a = subprocess.Popen(
        [sys.executable, "-m", "vlp.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 300
        while not (run / "checkpoints" / "step_0000002").is_dir():
            assert a.poll() is None and time.time() < deadline, "run A ended before run B started"
            time.sleep(0.1)
        b = launch(["-m", "vlp.cli", *args, "--resume", "auto"], check=False, timeout=120)
        assert a.poll() is None, "run A ended before run B was refused: the test proves nothing"
        a.send_signal(signal.SIGTERM)  # A checkpoints at the next step boundary and exits 0
        _, err = a.communicate(timeout=300)
    finally:
        if a.poll() is None:
            a.kill()
    assert b.returncode == 2, b.stderr[-3000:]
    lines = [x for x in b.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"vlp: error: output_dir {run} is in use"), b.stderr[-3000:]
    assert f"in use by another run: pid {a.pid} on {socket.gethostname()}" in lines[0] and "pretrain" in lines[0]
    assert a.returncode == 0, err[-3000:]
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 2  # one record per step: B wrote nothing
    assert json.loads((run / "run_info.json").read_text()).get("resumes", []) == []


def test_a_held_folder_refuses_a_fresh_run_before_anything_is_written(pairs: Path, tmp_path: Path, capsys) -> None:
    from vlp.cli import main

    run = tmp_path / "run"
    proc = holder(run)
    try:
        assert main(run_args(pairs, run, "train.steps=1")) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"in use by another run: pid {proc.pid} on {socket.gethostname()}" in err
        assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing written
    finally:
        proc.kill()
        proc.wait()
    # the holder died (SIGKILL): the kernel released its lock; its lock file does not stop the next run
    assert json.loads((run / ".lock").read_text())["pid"] == proc.pid
    assert main(run_args(pairs, run, "train.steps=1")) == 0
    assert (run / "checkpoints" / "step_0000001").is_dir()
    # and this process let go of it when the command ended: another process may take it now
    again = holder(run)
    again.send_signal(signal.SIGTERM)
    again.wait()


def test_a_run_in_this_process_may_use_its_folder_again(pairs: Path, tmp_path: Path) -> None:
    """Commands called in-process one after the other (tests, the experiment scripts) each take the
    folder's lock and let go of it when they end: a resume after a run in the same process works."""
    from vlp.cli import main

    run = tmp_path / "run"
    assert main(run_args(pairs, run, "train.steps=2")) == 0
    assert main(run_args(pairs, run, "train.steps=2", "--resume", "auto")) == 0


@pytest.mark.multiprocess
def test_two_ranks_into_a_held_folder_are_refused_and_two_ranks_alone_run(pairs: Path, tmp_path: Path) -> None:
    """Ranks share ``output_dir``: rank 0 holds the lock for the launch, the other ranks write nothing
    there before the process group forms (which a refused rank 0 never joins)."""
    run = tmp_path / "run"
    proc = holder(run)
    try:
        res = launch(["-m", "vlp.cli", *run_args(pairs, run, "train.steps=2")], processes=2, check=False, timeout=300)
    finally:
        proc.kill()
        proc.wait()
    assert res.returncode != 0
    assert f"vlp: error: output_dir {run} is in use by another run: pid {proc.pid}" in res.stderr, res.stderr[-3000:]
    assert sorted(p.name for p in run.iterdir()) in ([".lock"], [".lock", "checkpoints"])  # no config.yaml
    assert not any((run / "checkpoints").glob("*")) if (run / "checkpoints").exists() else True
    launch(["-m", "vlp.cli", *run_args(pairs, run, "train.steps=2")], processes=2, timeout=300)
    assert (run / "checkpoints" / "step_0000002").is_dir()


def test_a_forked_child_such_as_a_loader_worker_does_not_keep_the_lock(tmp_path: Path) -> None:
    """A data loader worker is forked with the lock file open: it closes its copy, so the lock ends
    with the run, not with a worker left behind (before: a resume in the same process was refused)."""
    from vlp.locks import lock_folder, release_folder

    run = tmp_path / "run"
    lock_folder(run, "output_dir")
    child = os.fork()
    if child == 0:  # the worker: alive past its parent's release
        time.sleep(60)
        os._exit(0)
    try:
        release_folder(run)
        other = holder(run)  # would block forever on the lock the child kept
        other.kill()
        other.wait()
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
