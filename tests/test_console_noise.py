"""Console noise on every command (issue 31, item 7): what vlp's own imports print."""

import importlib.util
import subprocess
import sys

import pytest

#: what every training command does: accelerate's ``unwrap_model`` imports DeepSpeed when installed
UNWRAP = """
import sys, torch
from vlp.config import TrainConfig
from vlp.train.setup import make_accelerator
make_accelerator(TrainConfig(progress=False)).unwrap_model(torch.nn.Linear(1, 1))
print("cuda", torch.cuda.is_available(), "deepspeed", "deepspeed" in sys.modules)
"""


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed: no warning")
def test_a_training_command_does_not_print_deepspeeds_accelerator_warning():
    """DeepSpeed, imported by accelerate, warns "Setting accelerator to CPU" on a machine without a
    GPU: on every training command, DeepSpeed config or not."""
    done = subprocess.run([sys.executable, "-c", UNWRAP], capture_output=True, text=True, check=True)
    if "cuda True" in done.stdout:
        pytest.skip("a CUDA device: DeepSpeed has no reason to warn")
    assert "deepspeed True" in done.stdout  # it was imported: the warning is not avoided by its absence
    assert "Setting accelerator to CPU" not in done.stdout + done.stderr
