"""SIGTERM / SIGUSR1 during `vlp pretrain`: a checkpoint at the next step boundary, a clean exit
(status 0) with the resume instruction. SIGKILL: the steps since the last periodic checkpoint are
lost. Either way `train.resume=auto` continues exactly like an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[2]
STEPS = 40


@pytest.fixture(scope="module")
def srcl_ltd(tmp_path_factory, tiny_model, pairs_file, launch_pretrain) -> list[str]:
    """Overrides that turn on SRCL (a live frozen helper: a tiny 2-step run) and LTD (constraint
    mode, MiniLM targets of the captions): their state - the helper-feature queue, the decoder,
    lambda and its momentum - must survive the resume too."""
    from vlp.cli import main

    tmp = tmp_path_factory.mktemp("srcl_ltd")
    launch_pretrain(
        [
            "--config",
            "configs/pretrain/shapes_tiny.yaml",
            f"data.train=[{pairs_file}]",
            "data.batch_size=4",
            "train.steps=2",
            "train.progress=false",
            f"output_dir={tmp / 'helper'}",
            *tiny_model,
        ]
    )
    assert main(["make-targets", "--data", str(pairs_file), "--out", str(tmp / "targets.safetensors")]) == 0
    return [
        "loss.regulation=srcl",
        "loss.srcl.delta=1.0",
        f"loss.srcl.helper={tmp / 'helper'}",
        "loss.ltd.mode=constraint",
        "loss.ltd.eta=0.1",
        "loss.ltd.hidden=16",
        f"loss.ltd.targets={tmp / 'targets.safetensors'}",
    ]


@pytest.mark.parametrize(
    "sig, objective",
    [
        (signal.SIGTERM, "albef"),
        (signal.SIGUSR1, "albef"),
        (signal.SIGKILL, "albef"),
        (signal.SIGTERM, "srcl+ltd"),
        (signal.SIGKILL, "srcl+ltd"),
    ],
)
def test_stopped_or_killed_run_resumes_exactly(
    sig, objective, tmp_path, tiny_model, pairs_file, launch_pretrain, runs_io, request
) -> None:
    read = runs_io[0]
    extra = request.getfixturevalue("srcl_ltd") if objective == "srcl+ltd" else []
    workers = 2 if objective == "srcl+ltd" else 0  # per-item seeds: exact with loader workers too
    args = [
        "--config",
        "configs/pretrain/shapes_tiny.yaml",
        f"data.train=[{pairs_file}]",
        "data.batch_size=4",
        f"data.num_workers={workers}",
        f"train.steps={STEPS}",
        "train.log_every=1",
        "train.warmup_steps=0",
        "train.progress=false",
        "train.ckpt_every=5",
        "train.keep_last=2",
        *tiny_model,
        *extra,
    ]
    run = tmp_path / "stopped"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vlp.cli", "pretrain", *args, f"output_dir={run}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    log = run / "metrics.jsonl"
    deadline = time.time() + 300
    while not (log.is_file() and len(log.read_text().splitlines()) >= 7):
        assert proc.poll() is None and time.time() < deadline, "the run ended before it could be signalled"
        time.sleep(0.05)
    os.killpg(proc.pid, sig)  # to every process of the run, loader workers included, as a scheduler does
    _, err = proc.communicate(timeout=300)
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
        assert (run / "checkpoints" / "step_0000005" / "train_state").is_dir()  # the last periodic checkpoint
    else:
        assert proc.returncode == 0, err[-3000:]
        stopped = read(run)[-1]["step"]
        assert 7 <= stopped < STEPS  # stopped early, at a step boundary
        ckpt = run / "checkpoints" / f"step_{stopped:07d}"
        assert (ckpt / "model.safetensors").is_file() and (ckpt / "train_state").is_dir()
        assert f"stopped by {sig.name} after step {stopped}" in err and "train.resume=auto" in err

    resume = ["--resume", "auto"] if sig == signal.SIGUSR1 else ["train.resume=auto"]  # the flag = the override
    launch_pretrain([*args, f"output_dir={run}", *resume])
    launch_pretrain([*args, f"output_dir={tmp_path / 'full'}"])
    full, resumed = read(tmp_path / "full"), read(run)
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    keys = ("loss", "itc", "itm", "mlm", "lr", "temp") + (("srcl_w_min", "ltd_rec", "ltd_lambda") if extra else ())
    for a, b in zip(full, resumed):
        assert {k: b[k] for k in keys} == {k: a[k] for k in keys}  # to the last digit
    end_full, end_resumed = read(tmp_path / "full", STEPS), read(run, STEPS)
    assert end_full.keys() == end_resumed.keys() and all(torch.equal(v, end_resumed[k]) for k, v in end_full.items())
    if extra:
        from safetensors.torch import load_file

        task = [
            load_file(str(r / "checkpoints" / f"step_{STEPS:07d}" / "train_state" / "task.safetensors"))
            for r in (tmp_path / "full", run)
        ]
        assert task[0].keys() == task[1].keys() and all(torch.equal(v, task[1][k]) for k, v in task[0].items())


def test_a_run_failing_with_loader_workers_exits_instead_of_hanging(tmp_path, tiny_model, pairs_file) -> None:
    """Workers ignore SIGTERM (above); multiprocessing's exit handler SIGTERMs them and waits. A run
    that raises mid-training, before its loader shut the workers down, must still exit (status 1,
    its traceback printed) rather than wait forever."""
    script = tmp_path / "fail_at_step_3.py"
    script.write_text(
        "import sys\nimport vlp.train.logging as L\nwrite = L.MetricsLog.write\n"
        "def failing(self, record):\n"
        "    if record.get('step') == 3:\n        raise RuntimeError('failed at step 3 on purpose')\n"
        "    return write(self, record)\n"
        "L.MetricsLog.write = failing\nfrom vlp.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    args = [
        "pretrain",
        "--config",
        "configs/pretrain/shapes_tiny.yaml",
        f"data.train=[{pairs_file}]",
        "data.batch_size=4",
        "data.num_workers=2",
        "train.steps=20",
        "train.log_every=1",
        "train.progress=false",
        *tiny_model,
        f"output_dir={tmp_path / 'run'}",
    ]
    try:
        res = subprocess.run(
            [sys.executable, str(script), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the failed run hung at exit (its loader workers were never stopped)")
    assert res.returncode == 1 and "RuntimeError: failed at step 3 on purpose" in res.stderr, res.stderr[-3000:]
    assert "Exception ignored in atexit" not in res.stderr
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2


def test_experiment_scripts_exit_cleanly_when_stopped(capsys) -> None:
    """The experiment scripts run jobs in-process: a stopped run gives status 0 and says to rerun
    the script (which continues), not vlp's --resume hint."""
    from vlp.train.preemption import Preempted, exit_status

    def stopped() -> int:
        raise Preempted(
            "stopped by SIGTERM after step 3 of 9; checkpoint c/step_0000003. Resume: ...",
            "stopped by SIGTERM after step 3 of 9; checkpoint c/step_0000003",
        )

    assert exit_status(stopped, "srcl_shapes.py") == 0
    assert capsys.readouterr().err == (
        "srcl_shapes.py: stopped by SIGTERM after step 3 of 9; checkpoint c/step_0000003. "
        "Run the same script command again to continue.\n"
    )
    assert exit_status(lambda: 3, "x.py") == 3 and exit_status(lambda: None, "x.py") == 0
    assert str(Preempted("the whole message", "where")) == "the whole message"


BLOCKING_SCRIPT = """import os, sys
import vlp.train.loop as L
batches = L.endless_batches
def blocked_at_batch_3(*args, **kwargs):
    for i, batch in enumerate(batches(*args, **kwargs)):
        if i == 3:  # a data read that never returns: opening a FIFO no one writes to
            open(os.environ["MARKER"], "w").close()
            open(os.environ["FIFO"], "rb")
        yield batch
L.endless_batches = blocked_at_batch_3
from vlp.cli import main
sys.exit(main(sys.argv[1:]))
"""


def blocked_run(tmp_path: Path, tiny_model: list[str], pairs_file: Path, grace: float) -> subprocess.Popen:
    """`vlp pretrain` (train.stop_grace_s=``grace``) blocked for good fetching its 4th batch."""
    script, fifo, marker = tmp_path / "blocked.py", tmp_path / "data.fifo", tmp_path / "blocked"
    script.write_text(BLOCKING_SCRIPT)
    os.mkfifo(fifo)
    args = ["--config", "configs/pretrain/shapes_tiny.yaml", f"data.train=[{pairs_file}]", "data.batch_size=4"]
    args += ["train.steps=20", "train.log_every=1", "train.progress=false", f"train.stop_grace_s={grace}"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    env.update(FIFO=str(fifo), MARKER=str(marker))
    proc = subprocess.Popen(
        [sys.executable, str(script), "pretrain", *args, *tiny_model, f"output_dir={tmp_path / 'run'}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while not marker.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    time.sleep(0.5)  # into the open()
    return proc


def ended_within(proc: subprocess.Popen, seconds: float) -> tuple[float, str]:
    """(seconds it took to end, its stderr); fails (and kills it) if it is still running after ``seconds``."""
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the blocked run was still running {seconds} s after the stop signal")
    return time.monotonic() - t0, err


def test_a_blocked_run_exits_after_the_grace_period_of_a_sigterm(tmp_path, tiny_model, pairs_file) -> None:
    """Before: the run sat in the FIFO's open() 10 minutes after SIGTERM (the handler only noted it)."""
    proc = blocked_run(tmp_path, tiny_model, pairs_file, grace=2)
    proc.send_signal(signal.SIGTERM)
    took, err = ended_within(proc, 60)
    assert proc.returncode == 128 + signal.SIGTERM and 2 <= took < 30, (took, err[-3000:])
    assert (
        "vlp: error: stopped by SIGTERM, but the run reached no step boundary within train.stop_grace_s=2 s "
        "(blocked, e.g. waiting for data); exiting without a checkpoint; resume from the last one: run the same "
        "command with --resume auto (or train.resume=auto)"
    ) in err
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())


def test_a_second_signal_ends_a_blocked_run_at_once(tmp_path, tiny_model, pairs_file) -> None:
    proc = blocked_run(tmp_path, tiny_model, pairs_file, grace=600)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.5)  # later than a launcher's copy of the first
    proc.send_signal(signal.SIGINT)
    took, err = ended_within(proc, 60)
    assert proc.returncode == 128 + signal.SIGINT and took < 30, (took, err[-3000:])
    assert "vlp: error: SIGINT after SIGTERM: exiting at once, without a checkpoint" in err
