"""The generic loop on a toy task: schedule, EMA hook, clipping, bf16 autocast, logs, checkpoints."""

import pytest
import torch
from torch import nn

from vlp.config import TrainConfig
from vlp.train.checkpoint import find_checkpoint, read_state
from vlp.train.logging import read_metrics
from vlp.train.loop import train
from vlp.train.optim import lr_at


class ToyTask(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Linear(4, 1)
        self.hook_steps, self.autocast = [], []

    def forward(self, batch, step=0):
        self.autocast.append(torch.is_autocast_enabled("cpu"))
        pred = self.model(batch["x"]).squeeze(1)
        return {"loss": ((pred.float() - batch["y"]) ** 2).mean()}

    def after_optimizer_step(self, step):
        self.hook_steps.append(step)


def loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    return [{"x": x[i : i + 8], "y": y[i : i + 8], "input_ids": x[i : i + 8]} for i in range(0, 32, 8)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_loop_schedule_hooks_logs_and_checkpoints(tmp_path, precision):
    cfg = TrainConfig(steps=12, lr=0.05, min_lr=0.001, warmup_steps=3, warmup_lr=0.0, log_every=4, ckpt_every=5,
                      precision=precision, progress=False, grad_clip=10.0)
    task = ToyTask()
    last = train(task, loader(), cfg, tmp_path, state={"task": "toy"})
    assert task.hook_steps == list(range(1, 13))
    assert all(a == (precision == "bf16") for a in task.autocast)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [4, 8, 12]
    assert [r["lr"] for r in rows] == pytest.approx([lr_at(s - 1, cfg) for s in (4, 8, 12)])
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert last == rows[-1]
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["step_0000005", "step_0000010", "step_0000012"]
    assert read_state(find_checkpoint(tmp_path)) == {"task": "toy", "step": 12}
