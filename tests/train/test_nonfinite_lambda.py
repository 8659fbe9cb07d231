"""A skipped non-finite step leaves no trace in the LTD multiplier lambda (issue 17, defect 5).

The skip used to clear the optimizer's gradients only; lambda is outside the optimizer, so its NaN
gradient stayed and was added at the next good step - lambda became NaN and every later step was
skipped. Now every gradient is cleared and lambda's step obeys the skip flag: a run with a NaN at
step 3 follows exactly the run that never saw that batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlp.config import MultiplierConfig, TrainConfig
from vlp.losses.ltd import LagrangeMultiplier, constrained
from vlp.train.loop import train


class Toy(nn.Module):
    def __init__(self, nan_batches=()):
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Linear(4, 1)
        self.lam = LagrangeMultiplier(MultiplierConfig(init=1.0, lr=0.3, momentum=0.5))
        self.nan_batches = set(nan_batches)
        self.trajectory: list[tuple[float, torch.Tensor]] = []  # (lambda, weights) after each applied step

    def forward(self, batch, step=0):
        pred = self.model(batch["x"]).squeeze(1)
        loss = constrained(((pred - batch["y"]) ** 2).mean(), (pred**2).mean(), self.lam.value(), eta=0.5)
        if int(batch["id"]) in self.nan_batches:
            loss = loss * float("nan")
        return {"loss": loss}

    def batch_report(self, batch):
        return len(batch["input_ids"]), batch.get("bad_samples")

    def after_optimizer_step(self, step, skipped=None):
        self.lam.step(skipped)
        if skipped is None or not bool(skipped):
            self.trajectory.append((float(self.lam.lam.detach()[0]), self.model.weight.detach().clone()))


def batches(ids):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 8, 4, generator=g)
    return [{"x": x[i], "y": F.normalize(x[i], dim=1).sum(1), "id": torch.tensor(i), "input_ids": x[i]} for i in ids]


def test_a_nan_step_leaves_lambda_as_if_the_batch_had_never_come(tmp_path):
    cfg = dict(lr=0.05, min_lr=0.05, warmup_steps=0, log_every=10, progress=False, save_state=False)
    with_nan = Toy(nan_batches={2})
    train(with_nan, batches(range(6)), TrainConfig(steps=6, **cfg), tmp_path / "nan")
    without = Toy()
    train(without, batches([0, 1, 3, 4, 5]), TrainConfig(steps=5, **cfg), tmp_path / "clean")
    assert len(with_nan.trajectory) == len(without.trajectory) == 5
    for (lam_a, w_a), (lam_b, w_b) in zip(with_nan.trajectory, without.trajectory):
        assert lam_a == lam_b and torch.equal(w_a, w_b)
    assert all(lam == lam for lam, _ in with_nan.trajectory)  # never NaN
    assert len({lam for lam, _ in with_nan.trajectory}) == 5  # lambda moved at every applied step
