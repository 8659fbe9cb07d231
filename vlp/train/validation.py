"""Periodic evaluation during training: what to evaluate and how often (:class:`Validation`, given
to :func:`vlp.train.loop.train`), and the :class:`Validator` that runs it on every rank and logs it.

Two kinds share it. Fine-tuning's validation (``select`` set) logs ``val_metrics.jsonl`` and the
sinks (``val/KEY``) and keeps the best checkpoint (``checkpoints/best``) as rank 0 decides.
Pretraining's zero-shot evaluation of ``data.eval`` (``train.eval_every``; ``select`` None) writes
one record per evaluation into the run's ``metrics.jsonl``, its keys prefixed ``eval/``
(:data:`vlp.train.logging.EVAL_PREFIX`), which the sinks receive as they receive the loss records;
it keeps no checkpoint.

A resumed run validates as the uninterrupted one would: the best so far (metric, value, step) is
carried in every step checkpoint's ``state.json`` (``validation``: :meth:`Validator.state`) and
restored from it (:meth:`Validator.resumed`); a checkpoint written before it was carried restores it
from the records of ``val_metrics.jsonl`` up to its step (:func:`logged_best`). The records of later
steps are dropped from ``val_metrics.jsonl`` as from ``metrics.jsonl`` (:meth:`MetricsLog.truncate_after`).

Either way an evaluation leaves the training as it was: eval mode and no gradients while it runs
(each module's own mode restored after), and every random generator the loop draws from (Python,
numpy, torch CPU and the device's) restored to its state before it, so that a data loader or
anything else the evaluation creates draws nothing the training would have drawn.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, cast

import torch
from accelerate import Accelerator
from torch import nn

from vlp.dist import all_gather_nograd
from vlp.eval.mode import evaluating
from vlp.train.checkpoints import Checkpointer
from vlp.train.logging import EVAL_PREFIX, MetricsLog, read_metrics
from vlp.train.state import rng_state, set_rng_state

logger = logging.getLogger(__name__)


@dataclass
class Validation:
    """Periodic evaluation: ``evaluate(task, step) -> metrics`` (the unwrapped task, eval mode, no
    grad) every ``every`` optimizer steps and after the last one. ``select``: the checkpoint with
    the highest ``metrics[select]`` is kept (fine-tuning); None: no checkpoint, the metrics go into
    ``metrics.jsonl`` as ``eval/KEY`` (pretraining). ``shown``: the metrics printed after each
    evaluation besides ``select`` (none: ``select`` alone).

    ``evaluate`` runs on **every rank** (several processes): it may shard its work over the ranks
    (the retrieval, VQA and NLVR2 evaluators do, with collectives every rank must join). Rank 0
    logs, and its decision on the best checkpoint is the one every rank follows."""

    evaluate: Callable[[nn.Module, int], dict[str, float]]
    select: Optional[str]
    every: int
    shown: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"validation every {self.every} steps: expected >= 1")


class Validator:
    """Runs ``validation`` on the prepared ``task`` (``inner``: unwrapped) for a run of ``steps``
    steps, logs to ``log`` (``metrics.jsonl``: the zero-shot evaluation) or to
    ``run_dir/val_metrics.jsonl`` and ``log``'s sinks (prefix ``val/``), and saves the best
    checkpoint with ``checkpointer`` (fine-tuning). ``best``: metric, value and step of the best so far
    (empty before the first validation); ``val_log``: ``val_metrics.jsonl`` (None without ``select``)."""

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
        self.val_log = MetricsLog(run_dir / "val_metrics.jsonl") if validation.select is not None else None

    def state(self) -> dict[str, Any]:
        """What later validations depend on, for a checkpoint's ``state.json``: ``{"best": best}``."""
        return {"best": dict(self.best)}

    def resumed(self, saved: Optional[dict[str, Any]], step: int) -> None:
        """Continue after the checkpoint of ``step``: its :meth:`state` ``saved``, or (None: a
        checkpoint without one) the best that ``val_metrics.jsonl`` marks up to ``step``."""
        select = self.validation.select
        if saved is not None:
            self.best = dict(saved.get("best") or {})
        elif select is not None and self.val_log is not None:
            self.best = logged_best(self.val_log.path, select, step)

    def due(self, step: int) -> bool:
        """Whether to validate after optimizer step ``step``: every ``every`` steps and at the end."""
        return step % self.validation.every == 0 or step == self.steps

    def evaluate(self, step: int) -> dict[str, float]:
        """``validation.evaluate`` after step ``step`` on this rank, in eval mode without gradients;
        the modes and the random generators' states are restored after (module doc)."""
        saved = rng_state()
        try:
            with evaluating(self.task), torch.no_grad():  # eval mode; each module's own mode restored after
                return self.validation.evaluate(self.inner, step)
        finally:
            set_rng_state(saved)

    def __call__(self, step: int) -> None:
        """Every rank evaluates (the evaluators shard the work over the ranks, no rank waits alone
        past the collective timeout); rank 0 logs and keeps the best checkpoint, and its decision
        is shared so that every rank tracks the same best."""
        acc, val, best = self.acc, self.validation, self.best
        acc.wait_for_everyone()
        metrics = self.evaluate(step)
        if val.select is None:
            if acc.is_main_process:
                self.log.write({"step": step, **{f"{EVAL_PREFIX}{k}": v for k, v in metrics.items()}})
                logger.info(f"evaluation at step {step} of {self.steps}: {self._shown(metrics)}")
            acc.wait_for_everyone()
            return
        value = metrics[val.select]
        improved = not best or value > best["value"]
        improved = bool(all_gather_nograd(torch.tensor([float(improved)], device=acc.device))[0] > 0)  # rank 0's
        if acc.is_main_process:
            cast(MetricsLog, self.val_log).write({"step": step, **metrics, "best": improved})
            self.log.sinks.log(metrics, step, prefix="val/")
            logger.info(
                f"validation at step {step}: {self._shown(metrics)}"
                + (" (best so far)" if improved else f" (best {best['value']:.2f} at step {best['step']})")
            )
        if improved:
            best.update(metric=val.select, value=value, step=step)
            if acc.is_main_process:
                self.checkpointer.save_best(step, best, metrics)
        acc.wait_for_everyone()

    def _shown(self, metrics: dict[str, float]) -> str:
        """``select`` and the ``shown`` metrics that ``metrics`` holds, as ``name value`` (2 decimals)."""
        val = self.validation
        names = [k for k in dict.fromkeys([*([val.select] if val.select else []), *val.shown]) if k in metrics]
        return ", ".join(f"{k} {metrics[k]:.2f}" for k in names)


def logged_best(path: Path, select: str, step: int) -> dict[str, Any]:
    """The best so far after ``step`` as the records of ``path`` (a ``val_metrics.jsonl``) up to
    ``step`` mark it: metric ``select``, value and step of the last record with ``best`` true; empty
    when there is none."""
    marked = [r for r in (read_metrics(path) if path.is_file() else []) if r["step"] <= step and r.get("best")]
    return {"metric": select, "value": marked[-1][select], "step": marked[-1]["step"]} if marked else {}
