"""Latent target decoding (Bleeker et al., TMLR 2023): reconstruction losses and the Lagrange multiplier.

- ``cosine_reconstruction``: LTD's ``L_rec = mean_b (1 - cos(y_hat_b, y_b))``.
- ``token_nll``: ITD's caption reconstruction, a masked token NLL with the log-softmax over the
  **vocabulary** axis (the reference took it over time; ``time_axis_bug=True`` reproduces that).
- ``constrained``: ``L_con + lambda * (L_rec / eta - 1)``; ``weighted``: ``L_con + beta * L_rec``.
- :class:`LagrangeMultiplier`: lambda as an fp32 parameter with its own SGD *ascent* (momentum,
  dampening), projected into ``[0, max]`` after every step, its state saved with checkpoints.
- ``reconstruction_floor``: the lowest ``L_rec`` a decoder can reach when it only knows which group
  each caption is in (the captions an encoder that suppresses an attribute cannot tell apart).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vlp.config import MultiplierConfig
from vlp.dist import all_reduce_, world_size


def cosine_reconstruction(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``pred``, ``target`` [B, D] -> scalar ``mean(1 - cos)`` (fp32; scale of either is irrelevant)."""
    return (1.0 - F.cosine_similarity(pred.float(), target.float(), dim=-1)).mean()


def token_nll(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, time_axis_bug: bool = False
) -> torch.Tensor:
    """Masked token NLL, summed over tokens and divided by the batch size (the reference reduction,
    which keeps ITD's eta on the reference scale).

    ``logits`` [B, T, V] predictions for ``targets`` [B, T] (already shifted: position t predicts
    token t), ``mask`` [B, T] 1 = real token. The log-softmax runs over the vocabulary axis;
    ``time_axis_bug`` runs it over time (dim 1, padding included) as the reference code did.
    """
    logp = F.log_softmax(logits.float(), dim=1 if time_axis_bug else -1)
    nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (nll * mask.float()).sum() / logits.shape[0]


def reconstruction_floor(targets: torch.Tensor, groups: torch.Tensor) -> float:
    """The lowest mean ``1 - cos`` any decoder reaches when its input only tells which group each
    caption is in: ``targets`` [N, D] (one row per caption occurrence), ``groups`` [N] long.

    For a group G the best single prediction maximises ``sum_{n in G} cos(p, y_n) = p . s / |p|``
    with ``s = sum_{n in G} y_n / |y_n|``, so ``p = s`` and the floor is
    ``mean_n (1 - cos(y_n, normalize(mean of the unit targets of n's group)))`` (float64; a group of
    one caption contributes 0; one group for all captions gives the caption-ignorant floor)."""
    if targets.ndim != 2 or groups.shape != targets.shape[:1]:
        raise ValueError(
            f"targets [N, D] and groups [N] expected, got {tuple(targets.shape)} and {tuple(groups.shape)}"
        )
    unit = F.normalize(targets.detach().double().cpu(), dim=-1)
    _, inverse = torch.unique(groups.cpu(), return_inverse=True)
    sums = torch.zeros(int(inverse.max()) + 1, unit.shape[1], dtype=torch.float64).index_add_(0, inverse, unit)
    cos = (unit * F.normalize(sums, dim=-1)[inverse]).sum(-1)
    return float((1.0 - cos).clamp_min(0.0).mean())  # rounding can put cos a hair above 1


def constrained(l_con: torch.Tensor, l_rec: torch.Tensor, lam: torch.Tensor, eta: float) -> torch.Tensor:
    """``L_con + lambda * (L_rec / eta - 1)``: the model sees the reconstruction gradient with weight
    ``lambda / eta``; lambda receives ``L_rec / eta - 1`` (positive while the bound is violated)."""
    if eta <= 0:
        raise ValueError(f"eta must be > 0, got {eta}")
    return l_con + lam.float() * (l_rec / eta - 1.0)


def weighted(l_con: torch.Tensor, l_rec: torch.Tensor, beta: float) -> torch.Tensor:
    """Dual objective ``L_con + beta * L_rec``."""
    return l_con + beta * l_rec


class LagrangeMultiplier(nn.Module):
    """lambda >= 0 maximised by SGD ascent on its gradient ``L_rec / eta - 1``.

    Kept out of the model optimizer, weight decay, gradient clipping and weight averaging
    (``self_optimized``): the owner calls :meth:`step` after the model's optimizer step. The
    update is torch SGD's with ``maximize``: ``buf = g`` at the first step, then
    ``buf = momentum * buf + (1 - dampening) * g``; ``lambda += lr * buf``; then lambda is
    clamped into ``[0, max]`` (projection). With ``straight_through`` the parameter is left
    unprojected and only the value used is clamped (the reference; lambda then sticks at a
    bound). The first ``warmup_steps`` steps leave lambda at ``init`` and the buffer empty (the
    momentum starts at the first step after them: anti-windup while the decoder learns).
    Parameter and momentum buffer are fp32 and part of ``state_dict`` (exact resume).
    The gradient is averaged over the ranks here: DDP averages it like any parameter's (averaging
    again changes nothing), but DeepSpeed ZeRO reduces only the parameters of its optimizer, and
    lambda is kept out of it - without this, lambda would drift apart across ranks.
    """

    self_optimized = True

    def __init__(self, cfg: MultiplierConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.lam = nn.Parameter(torch.tensor([float(cfg.init)], dtype=torch.float32))
        self.momentum_buffer: torch.Tensor
        self.steps: torch.Tensor
        self.register_buffer("momentum_buffer", torch.zeros(1, dtype=torch.float32))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def value(self) -> torch.Tensor:
        """The lambda the loss uses (0-d, fp32, carries the gradient to the parameter)."""
        lam = self.lam[0]
        if self.cfg.straight_through:
            return lam + (lam.clamp(0.0, self.cfg.max) - lam).detach()
        return lam

    @torch.no_grad()
    def step(self, skipped: Optional[torch.Tensor] = None) -> None:
        """One ascent step on the gradient averaged over the ranks, then projection and
        ``grad = None``. ``skipped`` (0-d bool on the device): lambda, its momentum and step count
        stay as they are (the gradient is still cleared). No host read."""
        g = self.lam.grad
        if g is None:
            return
        self.lam.grad = None
        g = all_reduce_(g.detach().float().clone()) / world_size()
        c, buf = self.cfg, self.momentum_buffer
        first = self.steps == c.warmup_steps
        new_buf = torch.where(first, g, buf * c.momentum + (1.0 - c.dampening) * g)
        new_lam = self.lam + c.lr * new_buf
        if not c.straight_through:
            new_lam = new_lam.clamp(0.0, c.max)
        keep = torch.zeros((), dtype=torch.bool, device=g.device) if skipped is None else skipped.to(g.device)
        hold = keep | (self.steps < c.warmup_steps)  # a skipped or warm-up step leaves lambda and buf
        buf.copy_(torch.where(hold, buf, new_buf))
        self.lam.copy_(torch.where(hold, self.lam, new_lam))
        self.steps += (~keep).long()
