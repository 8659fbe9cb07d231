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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGKILL])
def test_stopped_or_killed_run_resumes_exactly(sig, tmp_path, tiny_model, pairs_file,
                                                                  launch_pretrain, runs_io) -> None:
    read = runs_io[0]
    args = ["--config", "configs/pretrain/shapes_tiny.yaml", f"data.train=[{pairs_file}]", "data.batch_size=4",
            "data.num_workers=0", f"train.steps={STEPS}", "train.log_every=1", "train.warmup_steps=0",
            "train.progress=false", "train.ckpt_every=5", *tiny_model]
    run = tmp_path / "stopped"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "vlp.cli", "pretrain", *args, f"output_dir={run}"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = run / "metrics.jsonl"
    deadline = time.time() + 300
    while not (log.is_file() and len(log.read_text().splitlines()) >= 7):
        assert proc.poll() is None and time.time() < deadline, "the run ended before it could be signalled"
        time.sleep(0.05)
    proc.send_signal(sig)
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

    launch_pretrain([*args, f"output_dir={run}", "train.resume=auto"])
    launch_pretrain([*args, f"output_dir={tmp_path / 'full'}"])
    full, resumed = read(tmp_path / "full"), read(run)
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    for a, b in zip(full, resumed):
        for key in ("loss", "itc", "itm", "mlm", "lr"):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-7), (key, a, b)
    end_full, end_resumed = read(tmp_path / "full", STEPS), read(run, STEPS)
    assert all(torch.allclose(v, end_resumed[k], rtol=1e-5, atol=1e-7) for k, v in end_full.items())
