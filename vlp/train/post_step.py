"""``train.compile=full``'s second graph: the work between a step's backward and the next step.

Clipping, the non-finite check (agreed over the ranks), AdamW, the task's post-step hook (the
momentum EMA), the feature queues' keep-or-undo and the step statistics run as one compiled graph
(:class:`PostStep`). Nothing in it changes between steps except tensors: the step number and the
scheduled learning rate enter as 0-d device tensors, filled before the graph, and the EMA momentum
is computed from the step inside it. So neither the lr warm-up nor the momentum ramp recompiles it.

torch's own AdamW cannot be that graph's optimizer (torch 2.14): the fused one is wrapped in
``torch.compiler.disable`` (a graph break at every step) and its tensor-lr kernel has no fake
implementation for tracing; the foreach one refuses ``found_inf``, so it cannot skip a non-finite
step on the device. :func:`adamw_` is AdamW written with foreach ops, the fused kernel's formula,
skipping on a device flag by arithmetic that leaves every tensor bit for bit as it was. It updates
the state torch's AdamW keeps (``exp_avg``, ``exp_avg_sq``, ``step``), so checkpoints are the same
and a run can resume compiled or eager.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Optional, cast

import torch
from accelerate import Accelerator
from torch import nn

from vlp.config import TrainConfig
from vlp.dist import any_over_ranks
from vlp.train.setup import uses_deepspeed
from vlp.train.step import no_phase, non_finite
from vlp.train.step_stats import StepStats


@torch.no_grad()
def adamw_(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    lr: torch.Tensor,
    keep: torch.Tensor,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> None:
    """One AdamW step in place (decoupled weight decay, bias-corrected moments; the formula of
    torch's fused kernel), or none when ``keep`` (0-d bool, device) is false.

    ``grads`` may be non-finite when ``keep`` is false: they enter as ``where(keep, g, 0)``, the
    moments' decay becomes 1, the learning rate 0 and the step count does not move, so every tensor
    is left exactly as it was. ``lr``: 0-d device tensor; ``steps``: 0-d fp32 device tensors (the
    optimizer's ``step`` state, 1-based after the update)."""
    b1, b2 = betas
    keep_f = keep.to(torch.float32)
    g = [torch.where(keep, x, 0.0) for x in grads]
    lr_kept = lr * keep_f
    torch._foreach_add_(steps, keep_f)
    torch._foreach_mul_(exp_avgs, torch.where(keep, b1, 1.0))
    torch._foreach_add_(exp_avgs, g, alpha=1.0 - b1)
    torch._foreach_mul_(exp_avg_sqs, torch.where(keep, b2, 1.0))
    torch._foreach_addcmul_(exp_avg_sqs, g, g, value=1.0 - b2)
    if weight_decay:
        torch._foreach_mul_(params, 1.0 - lr_kept * weight_decay)
    counted = torch._foreach_maximum(steps, 1.0)  # a skipped first step: no 0 / 0 below
    bias1 = torch._foreach_pow(b1, counted)  # b1 ** t
    torch._foreach_sub_(bias1, 1.0)  # -(1 - b1 ** t)
    bias2 = torch._foreach_pow(b2, counted)
    torch._foreach_neg_(bias2)
    torch._foreach_add_(bias2, 1.0)
    torch._foreach_sqrt_(bias2)  # sqrt(1 - b2 ** t)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, bias2)
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(exp_avgs, denom)
    scale = torch._foreach_reciprocal(bias1)  # -1 / (1 - b1 ** t)
    torch._foreach_mul_(scale, lr_kept)  # -lr / (1 - b1 ** t): 0 when skipped
    torch._foreach_mul_(update, scale)
    torch._foreach_add_(params, update)


@dataclass
class GroupTensors:
    """One optimizer parameter group's tensors for :func:`adamw_` (parameters with a gradient)."""

    params: list[torch.Tensor]
    grads: list[torch.Tensor]
    exp_avgs: list[torch.Tensor]
    exp_avg_sqs: list[torch.Tensor]
    steps: list[torch.Tensor]
    lr_scale: float
    weight_decay: float


class PostStep:
    """The post-backward work of ``train.compile=full`` as one graph (module doc). Call it after the
    last micro-batch's backward with the step's outputs; it returns ``(norm, skipped)`` as
    :func:`vlp.train.step.train_step` does, has recorded the step in ``stats`` and has cleared the
    gradients.

    ``optimizer``: torch's AdamW (behind accelerate's wrapper); ``inner``: the unwrapped task
    (its ``after_optimizer_step`` hook); ``params``: those clipped; ``undo``: the stateful modules
    (feature queues); ``backend``: ``train.compile_backend``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        inner: nn.Module,
        params: list[torch.Tensor],
        undo: list[nn.Module],
        cfg: TrainConfig,
        device: torch.device,
        backend: str = "inductor",
    ) -> None:
        self.optimizer: torch.optim.Optimizer = getattr(optimizer, "optimizer", optimizer)
        self.inner, self.params, self.undo, self.cfg, self.device = inner, params, undo, cfg, device
        self.step_t = torch.zeros((), dtype=torch.float64, device=device)  # the step done, 1-based
        self.lr_t = torch.zeros((), dtype=torch.float32, device=device)
        self._graph = torch.compile(self._run, backend=backend, fullgraph=True, dynamic=False)

    def __call__(
        self,
        outs: list[dict[str, torch.Tensor]],
        step: int,
        lr: float,
        stats: StepStats,
        phase: Callable[[str], ContextManager[None]] = no_phase,
    ) -> tuple[Optional[torch.Tensor], torch.Tensor]:
        """Optimizer step ``step`` (0-based) at the scheduled (unscaled) learning rate ``lr``."""
        groups = self._groups()
        stats.prepare(outs)
        self.step_t.fill_(step + 1)
        self.lr_t.fill_(lr)
        with phase("post_step"):
            norm, skipped, rec = self._graph(outs, groups, stats, self.step_t, self.lr_t)
        stats.record(step + 1, norm is not None, rec)
        self.optimizer.zero_grad(set_to_none=True)
        self.inner.zero_grad(set_to_none=True)
        return norm, skipped

    def _groups(self) -> list[GroupTensors]:
        """The optimizer's groups as tensor lists, its state created as torch's fused AdamW creates
        it where it is missing (the first step), every ``step`` a 0-d fp32 tensor on the device."""
        out = []
        for group in self.optimizer.param_groups:
            live = [p for p in group["params"] if p.grad is not None]
            for p in live:
                st = self.optimizer.state[p]
                if not st:
                    st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                elif st["step"].device != p.device or st["step"].dtype != torch.float32:
                    st["step"] = st["step"].to(device=p.device, dtype=torch.float32)
            state = [self.optimizer.state[p] for p in live]
            out.append(
                GroupTensors(
                    live,
                    [cast(torch.Tensor, p.grad) for p in live],
                    [s["exp_avg"] for s in state],
                    [s["exp_avg_sq"] for s in state],
                    [s["step"] for s in state],
                    float(group.get("lr_scale", 1.0)),
                    float(group["weight_decay"]),
                )
            )
        return out

    def _run(
        self,
        outs: list[dict[str, torch.Tensor]],
        groups: list[GroupTensors],
        stats: StepStats,
        step: torch.Tensor,
        lr: torch.Tensor,
    ) -> tuple[Optional[torch.Tensor], torch.Tensor, torch.Tensor]:
        """The graph: what :func:`vlp.train.step.train_step`'s eager path does after the backward."""
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else None
        skipped = stats.skip(any_over_ranks([non_finite(outs, norm)], device=self.device)[0])
        keep = ~skipped
        clip = self.cfg.grad_clip
        coef = (clip / (norm + 1e-6)).clamp(max=1.0) if clip and norm is not None else None
        betas = cast(tuple[float, float], tuple(self.optimizer.defaults["betas"]))
        for g in groups:
            scaled = g.grads if coef is None else [x * coef for x in g.grads]
            adamw_(
                g.params,
                scaled,
                g.exp_avgs,
                g.exp_avg_sqs,
                g.steps,
                lr * g.lr_scale,
                keep,
                betas,
                self.optimizer.defaults["eps"],
                g.weight_decay,
            )
        hook = getattr(self.inner, "after_optimizer_step", None)
        if hook is not None:
            hook(step, skipped=skipped)
        for m in self.undo:
            cast(Any, m).end_step(skipped)
        return norm, skipped, stats.update(step, outs, norm, skipped)


def compiled_post_step(
    acc: Accelerator,
    optimizer: torch.optim.Optimizer,
    inner: nn.Module,
    params: list[torch.Tensor],
    undo: list[nn.Module],
    cfg: TrainConfig,
) -> Optional[PostStep]:
    """The run's :class:`PostStep` under ``train.compile=full``, else None (the eager post-step).
    Under DeepSpeed the engine steps inside ``backward``, so there is nothing to compile; an
    optimizer other than torch's plain AdamW (no amsgrad) stays eager too."""
    inner_opt = getattr(optimizer, "optimizer", optimizer)
    plain = isinstance(inner_opt, torch.optim.AdamW) and not any(
        inner_opt.defaults.get(k) for k in ("amsgrad", "maximize", "differentiable")
    )
    if cfg.compile != "full" or uses_deepspeed(acc) or not plain:
        return None
    return PostStep(optimizer, inner, params, undo, cfg, acc.device, cfg.compile_backend)
