"""Checkpoint averaging (SWA as the LTD paper uses it): an equal-weight mean of K weight snapshots.

Snapshots are taken evenly over the last ``fraction`` of the run (``per_epoch=False``: averaged
once, at the end) or of every epoch (``per_epoch=True``, the LTD reference: the average is loaded
at each epoch's end and training continues from it). Only trainable weights are averaged, in
fp32, outside the optimizer (the reference's fp16 double-unscale cannot happen): momentum twins,
queues, normalisation statistics and self-optimized parameters (lambda) keep their current values.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from vlp.config import AverageConfig, TrainConfig
from vlp.train.optim import trainable


def snapshot_steps(total: int, k: int, fraction: float, epoch_steps: Optional[int] = None) -> list[int]:
    """Optimizer steps (1-based, after the update) at which snapshots are taken: ``k`` evenly spaced
    steps ending at ``total`` within its last ``fraction`` (or, with ``epoch_steps``, within the last
    ``fraction`` of every complete epoch)."""
    if k <= 0:
        return []
    ends = [total] if epoch_steps is None else list(range(epoch_steps, total + 1, epoch_steps))
    length = total if epoch_steps is None else epoch_steps
    span = max(k, round(fraction * length))
    if span > length:
        raise ValueError(f"train.average: {k} snapshots do not fit in {length} steps")
    return sorted({end - span + round((i + 1) * span / k) for end in ends for i in range(k)})


class WeightAverager:
    """Running equal-weight mean of ``params`` at the scheduled steps; see the module docstring."""

    def __init__(
        self, params: list[nn.Parameter], cfg: AverageConfig, total_steps: int, epoch_steps: Optional[int] = None
    ) -> None:
        if cfg.per_epoch and epoch_steps is None:
            raise ValueError("train.average.per_epoch needs a loader with a length")
        self.params = params
        self.k = cfg.snapshots
        self.per_epoch = cfg.per_epoch
        self.steps = set(
            snapshot_steps(total_steps, cfg.snapshots, cfg.fraction, epoch_steps if cfg.per_epoch else None)
        )
        self.mean: Optional[list[torch.Tensor]] = None
        self.count = 0
        self.history: list[list[int]] = []  # snapshot steps of every applied average
        self._taken: list[int] = []

    @torch.no_grad()
    def after_step(self, done: int) -> bool:
        """Call after optimizer step ``done``; returns True when an average was just loaded."""
        if done not in self.steps:
            return False
        x = [p.detach().float() for p in self.params]
        if self.mean is None:
            self.mean = [t.clone() for t in x]
        else:
            torch._foreach_lerp_(self.mean, x, 1.0 / (self.count + 1))
        self.count += 1
        self._taken.append(done)
        if self.count < self.k:
            return False
        for p, m in zip(self.params, self.mean):
            p.copy_(m.to(p.dtype))
        self.history.append(self._taken)
        self.mean, self.count, self._taken = None, 0, []
        return True


def snapshot_averager(task: nn.Module, loader: Any, cfg: TrainConfig) -> Optional[WeightAverager]:
    """The averager of ``train.average`` over the trainable weights of ``task`` (None: no averaging);
    per-epoch snapshots need the (prepared) ``loader``'s length."""
    if not cfg.average.snapshots:
        return None
    epoch_steps = len(loader) if hasattr(loader, "__len__") else None
    return WeightAverager([p for _, p in trainable(task)], cfg.average, cfg.steps, epoch_steps)
