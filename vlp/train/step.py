"""One optimizer step of the training loop, as a function: what ``vlp pretrain`` runs at every step and
what ``vlp bench --count-ops`` counts.

forward and backward over ``train.grad_accum_steps`` micro-batches, clipping, the agreed
non-finite check, the optimizer, the task's post-step hook (momentum EMA, LTD multiplier), the
stateful modules keeping or undoing the step (feature queues) and the step's statistics - all on
the device, with no host read (:mod:`vlp.train.step_stats`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Optional, cast

import torch
from accelerate import Accelerator
from torch import nn

from vlp.config import TrainConfig
from vlp.dist import any_over_ranks
from vlp.train.optim import lr_at
from vlp.train.setup import uses_deepspeed
from vlp.train.step_stats import StepStats


def set_lr(optimizer: torch.optim.Optimizer, step: int, cfg: TrainConfig) -> float:
    """The scheduled learning rate of ``step`` (0-based) into every parameter group, times the
    group's ``lr_scale`` (``train.lr_scale``); returns the unscaled rate."""
    lr = lr_at(step, cfg)
    for g in optimizer.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    return lr


def clip_gradients(acc: Accelerator, params: list[torch.Tensor], cfg: TrainConfig) -> Optional[torch.Tensor]:
    """Clip to ``train.grad_clip``; returns the total gradient norm before clipping, or None under
    DeepSpeed (whose engine clips its own gradient partitions, inside ``acc.backward``)."""
    if uses_deepspeed(acc):
        return None
    if cfg.grad_clip:
        return acc.clip_grad_norm_(params, cfg.grad_clip)
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else None


def non_finite(outs: list[dict[str, torch.Tensor]], norm: Optional[torch.Tensor]) -> torch.Tensor:
    """Whether a step's losses or its gradient norm are not finite (a 0-d bool tensor, no sync)."""
    vals = [o["loss"].detach().float().reshape(()) for o in outs] + (
        [norm.float().reshape(())] if norm is not None else []
    )
    return ~torch.isfinite(torch.stack(vals)).all()


def skips_on_device(optimizer: Any) -> bool:
    """Whether the optimizer (behind accelerate's wrapper) skips a step on a device flag: torch's
    fused Adam/AdamW read ``found_inf`` inside their kernel, with no host synchronisation."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return isinstance(inner, torch.optim.Adam | torch.optim.AdamW) and bool(inner.defaults.get("fused"))


def optimizer_step(
    acc: Accelerator,
    optimizer: torch.optim.Optimizer,
    inner: nn.Module,
    params: list[torch.Tensor],
    step: int,
    cfg: TrainConfig,
    clipped: bool = False,
    skipped: Optional[torch.Tensor] = None,
) -> None:
    """Clip (unless ``clipped``), step, clear every gradient of the task (the self-optimised LTD
    multiplier's too), then the task's post-step hook (momentum EMA, LTD multiplier).

    ``skipped`` (0-d bool on the device): the step must leave no trace. A fused optimizer skips on
    the device (``found_inf``); another reads the flag (a host synchronisation); under DeepSpeed
    the engine has already stepped inside ``backward`` and skips a non-finite gradient itself."""
    if not clipped:
        clip_gradients(acc, params, cfg)
    if skipped is None or uses_deepspeed(acc):
        optimizer.step()
    elif skips_on_device(optimizer):
        torch_opt: Any = getattr(optimizer, "optimizer", optimizer)
        torch_opt.found_inf = skipped.to(torch.float32)
        try:
            optimizer.step()
        finally:
            delattr(torch_opt, "found_inf")
    elif not bool(skipped):
        optimizer.step()
    hook = getattr(inner, "after_optimizer_step", None)
    if hook is not None:  # before the gradients go: the LTD multiplier steps on its own
        hook(step + 1, skipped=skipped)
    optimizer.zero_grad(set_to_none=True)
    inner.zero_grad(set_to_none=True)


@dataclass
class StepResult:
    """What the loop needs of a finished step (device tensors; nothing was read back)."""

    outs: list[dict[str, torch.Tensor]]  # each micro-batch's outputs (0-d tensors)
    norm: Optional[torch.Tensor]  # gradient norm before clipping (None under DeepSpeed)
    skipped: torch.Tensor  # 0-d bool: non-finite on some rank, or the run has halted
    pairs: int  # the last micro-batch's pairs on this rank
    lr: float  # the step's scheduled learning rate (before each group's lr_scale)


def stateful_modules(inner: nn.Module) -> list[nn.Module]:
    """The modules that keep or undo a step's writes (``begin_step`` / ``end_step``: feature queues)."""
    return [m for m in inner.modules() if hasattr(m, "end_step")]


#: the post-backward work as one callable (``train.compile=full``'s graph,
#: :class:`vlp.train.post_step.PostStep`): ``(outs, step, lr, stats, phase) -> (norm, skipped)``,
#: clip, check, step, EMA, queues and the step's statistics; it clears the gradients
PostBackward = Callable[..., tuple[Optional[torch.Tensor], torch.Tensor]]


def no_phase(name: str) -> ContextManager[None]:
    """No context: :func:`train_step`'s ``phase`` when nobody attributes its work."""
    return contextlib.nullcontext()


def train_step(
    acc: Accelerator,
    task: nn.Module,
    inner: nn.Module,
    optimizer: torch.optim.Optimizer,
    params: list[torch.Tensor],
    batches: Iterator[Any] | Callable[[], Any],
    step: int,
    cfg: TrainConfig,
    stats: StepStats,
    phase: Callable[[str], ContextManager[None]] = no_phase,
    undo: Optional[list[nn.Module]] = None,
    post: Optional[PostBackward] = None,
) -> StepResult:
    """Optimizer step ``step`` (0-based) of ``task`` (the prepared task; ``inner`` unwrapped).

    ``batches``: the next micro-batch (an iterator, or a callable that returns it: the loop times
    its wait). ``stats``: the window's device-side accumulators, which get the step.
    ``phase(name)``: a context for each phase (``data``, ``forward``, ``backward``, ``optimizer``,
    ``statistics``; :class:`~vlp.train.dispatch_counts.DispatchCounter` attributes ops with it).
    ``undo``: :func:`stateful_modules` of ``inner``, found once by the caller (else at every step).
    ``post``: the compiled post-backward work (``train.compile=full``,
    :func:`vlp.train.post_step.compiled_post_step`) instead of the eager clip / optimizer / EMA /
    queues / statistics below."""
    micro, deepspeed = cfg.grad_accum_steps, uses_deepspeed(acc)
    fetch = batches if callable(batches) else (lambda: next(batches))  # type: ignore[arg-type]
    undo = stateful_modules(inner) if undo is None else undo
    hooks: Any = inner  # the task's hooks (batch_report, ...) and the modules' begin_step / end_step
    lr = set_lr(optimizer, step, cfg)
    for m in undo:
        cast(Any, m).begin_step()
    outs, pairs = [], 0
    for i in range(micro):  # gradients of `micro` batches, one optimizer step (docs/training.md)
        with phase("data"):
            batch = fetch()
        # forward and backward; DDP synchronises the gradients at the last micro-step only
        with acc.no_sync(task) if i < micro - 1 and not deepspeed else contextlib.nullcontext():
            with phase("forward"):
                out = task(batch, step=step)
            with phase("backward"):
                acc.backward(out["loss"] if deepspeed else out["loss"] / micro)
        outs.append(out)
        with phase("statistics"):
            pairs, bad = hooks.batch_report(batch)
            stats.add_bad_samples(bad)
    # clip, agree over the ranks on finiteness, step: no update when any rank saw a non-finite loss or
    # gradient (weights, optimizer, momentum twins, queues and LTD multiplier stay; decided on the device)
    with phase("optimizer"):
        if post is not None:  # all of it, statistics included, as one compiled graph
            norm, skipped = post(outs, step, lr, stats, phase)
            return StepResult(outs, norm, skipped, pairs, lr)
        norm = clip_gradients(acc, params, cfg)
        skipped = stats.skip(any_over_ranks([non_finite(outs, norm)], device=acc.device)[0])
        optimizer_step(acc, optimizer, inner, params, step, cfg, clipped=True, skipped=skipped)
        for m in undo:  # the queues keep or undo the step
            cast(Any, m).end_step(skipped)
    with phase("statistics"):
        stats.add_step(step + 1, outs, norm, skipped)
    return StepResult(outs, norm, skipped, pairs, lr)
