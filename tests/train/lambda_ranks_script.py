"""Launched by tests/train/test_lambda_ranks.py under torchrun (2 CPU processes, DDP or DeepSpeed):
a toy regression with an LTD-style Lagrange multiplier whose constraint value differs per rank;
writes each rank's final lambda to OUT/rank{r}.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

from vlp.config import MultiplierConfig, TrainConfig
from vlp.dist import rank
from vlp.losses.ltd import LagrangeMultiplier, constrained
from vlp.train.loop import train
from vlp.train.setup import make_accelerator


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Linear(4, 1)
        self.lam = LagrangeMultiplier(MultiplierConfig(init=1.0, lr=0.5, momentum=0.0))

    def forward(self, batch, step=0):
        pred = self.model(batch["x"]).squeeze(1)
        loss = ((pred - batch["y"]) ** 2).mean()
        rec = (pred**2).mean() * batch["scale"][0]  # differs per rank: so does lambda's local gradient
        return {"loss": constrained(loss, rec, self.lam.value(), eta=0.5)}

    def batch_report(self, batch):
        return len(batch["input_ids"]), batch.get("bad_samples")

    def after_optimizer_step(self, step, skipped=None):
        self.lam.step(skipped)


def main(out: str) -> None:
    cfg = TrainConfig(steps=4, lr=0.01, warmup_steps=0, log_every=2, progress=False, save_state=False)
    acc = make_accelerator(cfg, micro_batch=8)
    torch.manual_seed(0)
    task = Toy()
    g = torch.Generator().manual_seed(1 + acc.process_index)
    x = torch.randn(32, 4, generator=g)
    scale = torch.full((8,), 1.0 + 3.0 * acc.process_index)
    batches = [
        {"x": x[i : i + 8], "y": x[i : i + 8].sum(1), "scale": scale, "input_ids": x[i : i + 8]}
        for i in range(0, 32, 8)
    ]
    train(task, batches, cfg, Path(out) / "run", accelerator=acc)
    Path(out, f"rank{rank()}.json").write_text(json.dumps(float(task.lam.lam.detach()[0])))


if __name__ == "__main__":
    main(sys.argv[1])
