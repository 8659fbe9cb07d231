"""The accelerate launch configs load with accelerate's own parser, and the SLURM script parses."""

import subprocess
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file

from vlp.errors import ConfigError

ROOT = Path(__file__).parents[2]
EXPECTED = {  # file -> (distributed_type, machines, processes)
    "single_gpu.yaml": ("NO", 1, 1),
    "multi_gpu.yaml": ("MULTI_GPU", 1, 8),
    "multi_node.yaml": ("MULTI_GPU", 2, 16),
    "deepspeed_zero2.yaml": ("DEEPSPEED", 1, 8),
}


def test_every_launch_config_is_listed():
    assert sorted(p.name for p in (ROOT / "configs" / "accelerate").glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_launch_config_loads_with_accelerate(name):
    cfg = load_config_from_file(str(ROOT / "configs" / "accelerate" / name))  # unknown keys raise
    kind, machines, processes = EXPECTED[name]
    assert str(cfg.distributed_type).split(".")[-1] == kind
    assert (cfg.num_machines, cfg.num_processes) == (machines, processes)
    # the precision comes from train.precision (DeepSpeed: accelerate refuses mixed_precision next to a JSON)
    precision = "none" if kind == "DEEPSPEED" else "no"
    assert str(cfg.mixed_precision).split(".")[-1].lower() == precision and not cfg.use_cpu


def test_deepspeed_launch_config_points_at_a_zero2_json_vlp_accepts():
    import json

    from vlp.config import TrainConfig
    from vlp.train.setup import configure_deepspeed

    cfg = load_config_from_file(str(ROOT / "configs" / "accelerate" / "deepspeed_zero2.yaml"))
    ds = json.loads((ROOT / cfg.deepspeed_config["deepspeed_config_file"]).read_text())
    assert ds["zero_optimization"]["stage"] == 2
    configure_deepspeed(ds, TrainConfig(precision="bf16", grad_clip=1.0, grad_accum_steps=2), micro_batch=64)
    assert ds["bf16"] == {"enabled": False} and ds["torch_autocast"] == {
        "enabled": True,
        "dtype": "bfloat16",
        "lower_precision_safe_modules": [],
    }
    assert (ds["gradient_clipping"], ds["gradient_accumulation_steps"], ds["train_micro_batch_size_per_gpu"]) == (
        1.0,
        2,
        64,
    )
    for bad in ({"zero_optimization": {"stage": 3}}, {"bf16": {"enabled": True}}):
        with pytest.raises(ConfigError, match="stage 3|bf16.enabled"):
            configure_deepspeed(bad, TrainConfig(), None)


def test_slurm_script_is_valid_bash_and_uses_the_multi_node_config():
    script = ROOT / "scripts" / "slurm_pretrain.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "configs/accelerate/multi_node.yaml" in text and "--machine_rank" in text


def test_file_making_commands_run_on_rank_zero_only(tmp_path, monkeypatch):
    """Under a multi-process launch, commands that only write files run on rank 0; the others exit 0."""
    from vlp.cli import MULTI_PROCESS, main

    args = ["make-world", "--out", str(tmp_path / "w"), "--images", "8", "--seed", "0"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main(args) == 0 and not (tmp_path / "w").exists()
    monkeypatch.setenv("RANK", "0")
    assert main(args) == 0 and (tmp_path / "w" / "pretrain.json").is_file()
    assert {"pretrain", "finetune", "evaluate", "bench"} <= MULTI_PROCESS and "make-world" not in MULTI_PROCESS
