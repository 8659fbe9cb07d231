"""Checkpoint averaging: the snapshot schedule, the running mean, and the loop's averaged checkpoint."""

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from vlp.config import AverageConfig, MultiplierConfig, TrainConfig
from vlp.errors import ConfigError
from vlp.losses.ltd import LagrangeMultiplier
from vlp.train.loop import train
from vlp.train.optim import build_optimizer
from vlp.train.swa import WeightAverager, snapshot_steps
from vlp.weights import find_checkpoint, read_state


def test_snapshot_schedule():
    assert snapshot_steps(100, 5, 0.1) == [92, 94, 96, 98, 100]
    assert snapshot_steps(100, 5, 0.1, epoch_steps=50) == [46, 47, 48, 49, 50, 96, 97, 98, 99, 100]
    assert snapshot_steps(10, 3, 0.1) == [8, 9, 10]  # at least one step per snapshot
    assert snapshot_steps(10, 0, 0.1) == []
    with pytest.raises(ValueError):
        snapshot_steps(4, 5, 1.0)
    with pytest.raises(ConfigError, match="train.average"):
        AverageConfig(fraction=0.0)


def test_averager_means_snapshots_and_per_epoch_continues_from_the_average():
    p = nn.Parameter(torch.zeros(2))
    avg = WeightAverager([p], AverageConfig(snapshots=2, fraction=0.5, per_epoch=True), total_steps=8, epoch_steps=4)
    assert avg.steps == {3, 4, 7, 8}
    applied = []
    for step in range(1, 9):
        with torch.no_grad():
            p.add_(1.0)  # the "training" update
        applied.append(avg.after_step(step))
        if step == 4:  # mean of the values after steps 3 and 4 (3 and 4) replaces the weights
            assert p.tolist() == [3.5, 3.5]
    assert applied == [False, False, False, True, False, False, False, True]
    assert p.tolist() == [(6.5 + 7.5) / 2] * 2  # epoch 2 went on from 3.5: 4.5, 5.5, 6.5, 7.5
    assert avg.history == [[3, 4], [7, 8]]


class Task(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Linear(3, 1)
        self.lam = LagrangeMultiplier(MultiplierConfig())  # self-optimized: not averaged, not in the optimizer
        self.seen = {}

    def forward(self, batch, step=0):
        loss = ((self.model(batch["x"]).squeeze(1) - batch["y"]) ** 2).mean()
        return {"loss": loss + self.lam.value() * (loss.detach() - 1.0)}

    def batch_report(self, batch):
        return len(batch["input_ids"]), batch.get("bad_samples")

    def after_optimizer_step(self, step, skipped=None):
        self.lam.step(skipped)
        self.seen[step] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def test_loop_saves_the_average_of_the_snapshot_weights(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g)
    loader = [{"x": x[i : i + 8], "y": x[i : i + 8].sum(1), "input_ids": x[i : i + 8]} for i in range(0, 40, 8)]
    cfg = TrainConfig(
        steps=10,
        lr=0.05,
        warmup_steps=0,
        log_every=5,
        progress=False,
        grad_clip=0.1,
        average=AverageConfig(snapshots=3, fraction=0.3),
    )
    task = Task()
    assert id(task.lam.lam) not in {id(p) for grp in build_optimizer(task, cfg).param_groups for p in grp["params"]}
    train(task, loader, cfg, tmp_path)
    ckpt = find_checkpoint(tmp_path)
    assert read_state(ckpt)["averaged"] == [[8, 9, 10]]
    saved = load_file(str(ckpt / "model.safetensors"))
    for k, v in saved.items():
        expected = sum(task.seen[s][k] for s in (8, 9, 10)) / 3
        assert torch.allclose(v, expected, atol=1e-6), k
    assert not torch.allclose(saved["weight"], task.seen[10]["weight"])
    assert task.lam.lam.item() != 1.0  # lambda was stepped (by itself), never averaged
