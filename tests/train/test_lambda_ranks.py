"""The LTD multiplier lambda is the same on every rank, under DDP and DeepSpeed ZeRO-2 (issue 17,
defect 4). lambda is kept out of the optimizer; ZeRO reduces only the optimizer's parameters, so its
gradient stayed per-rank and lambda drifted apart. The multiplier now averages its gradient over
the ranks itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess  # every test here launches two processes (or uses runs that did)

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("engine", ["ddp", "zero2"])
def test_lambda_is_identical_on_every_rank(engine, tmp_path):
    if engine == "zero2":
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed: pip install -e '.[deepspeed]'")
    from tests.train.conftest import _free_port

    env = dict(os.environ, OMP_NUM_THREADS="1")
    if engine == "zero2":
        env.update(
            ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_CONFIG_FILE=str(ROOT / "configs/deepspeed/zero2.json")
        )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={_free_port()}",
        str(ROOT / "tests" / "train" / "lambda_ranks_script.py"),
        str(tmp_path),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    lam = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert lam[0] != 1.0  # it moved (ascent on a violated constraint)
    assert lam[0] == lam[1], lam
