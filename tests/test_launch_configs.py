"""The accelerate launch configs load with accelerate's own parser, and the SLURM script parses."""

import subprocess
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file

ROOT = Path(__file__).parents[1]
EXPECTED = {  # file -> (distributed_type, machines, processes)
    "single_gpu.yaml": ("NO", 1, 1),
    "multi_gpu.yaml": ("MULTI_GPU", 1, 8),
    "multi_node.yaml": ("MULTI_GPU", 2, 16),
}


def test_every_launch_config_is_listed():
    assert sorted(p.name for p in (ROOT / "configs" / "accelerate").glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_launch_config_loads_with_accelerate(name):
    cfg = load_config_from_file(str(ROOT / "configs" / "accelerate" / name))  # unknown keys raise
    kind, machines, processes = EXPECTED[name]
    assert str(cfg.distributed_type).split(".")[-1] == kind
    assert (cfg.num_machines, cfg.num_processes) == (machines, processes)
    assert str(cfg.mixed_precision).split(".")[-1].lower() == "bf16" and not cfg.use_cpu


def test_slurm_script_is_valid_bash_and_uses_the_multi_node_config():
    script = ROOT / "scripts" / "slurm_pretrain.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "configs/accelerate/multi_node.yaml" in text and "--machine_rank" in text
