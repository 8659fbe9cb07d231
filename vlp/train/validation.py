"""Periodic validation during training: what to evaluate and how often (:class:`Validation`, given
to :func:`vlp.train.loop.train`), and the :class:`Validator` that runs it on every rank, logs it
(``val_metrics.jsonl`` and the sinks) and keeps the best checkpoint (``checkpoints/best``) as rank 0
decides.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from accelerate import Accelerator
from torch import nn

from vlp.dist import all_gather_nograd
from vlp.eval.mode import evaluating
from vlp.train.checkpoints import Checkpointer
from vlp.train.logging import MetricsLog

logger = logging.getLogger(__name__)


@dataclass
class Validation:
    """Periodic validation: ``evaluate(task, step) -> metrics`` (the unwrapped task, eval mode, no
    grad) every ``every`` optimizer steps; the checkpoint with the highest ``metrics[select]`` is kept.

    ``evaluate`` runs on **every rank** (several processes): it may shard its work over the ranks
    (the retrieval, VQA and NLVR2 evaluators do, with collectives every rank must join). Rank 0
    logs, and its decision on the best checkpoint is the one every rank follows."""

    evaluate: Callable[[nn.Module, int], dict[str, float]]
    select: str
    every: int

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"validation every {self.every} steps: expected >= 1")


class Validator:
    """Runs ``validation`` on the prepared ``task`` (``inner``: unwrapped) for a run of ``steps``
    steps, logs to ``run_dir/val_metrics.jsonl`` and ``log``'s sinks (prefix ``val/``), and saves
    the best checkpoint with ``checkpointer``. ``best``: metric, value and step of the best so far."""

    def __init__(
        self,
        validation: Validation,
        acc: Accelerator,
        task: nn.Module,
        inner: nn.Module,
        steps: int,
        run_dir: Path,
        log: MetricsLog,
        checkpointer: Checkpointer,
    ) -> None:
        self.validation, self.acc, self.task, self.inner, self.steps = validation, acc, task, inner, steps
        self.run_dir, self.log, self.checkpointer = run_dir, log, checkpointer
        self.best: dict[str, Any] = {}

    def due(self, step: int) -> bool:
        """Whether to validate after optimizer step ``step``: every ``every`` steps and at the end."""
        return step % self.validation.every == 0 or step == self.steps

    def __call__(self, step: int) -> None:
        """Every rank evaluates (the evaluators shard the work over the ranks, no rank waits alone
        past the collective timeout); rank 0 logs and keeps the best checkpoint, and its decision
        is shared so that every rank tracks the same best."""
        acc, val, best = self.acc, self.validation, self.best
        acc.wait_for_everyone()
        with evaluating(self.task), torch.no_grad():  # eval mode; each module's own mode restored after
            metrics = val.evaluate(self.inner, step)
        value = metrics[val.select]
        improved = not best or value > best["value"]
        improved = bool(all_gather_nograd(torch.tensor([float(improved)], device=acc.device))[0] > 0)  # rank 0's
        if acc.is_main_process:
            MetricsLog(self.run_dir / "val_metrics.jsonl").write({"step": step, **metrics, "best": improved})
            self.log.sinks.log(metrics, step, prefix="val/")
            logger.info(
                f"validation at step {step}: {val.select} {value:.2f}"
                + (" (best so far)" if improved else f" (best {best['value']:.2f} at step {best['step']})")
            )
        if improved:
            best.update(metric=val.select, value=value, step=step)
            if acc.is_main_process:
                self.checkpointer.save_best(step, best, metrics)
        acc.wait_for_everyone()
