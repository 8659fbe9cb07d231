"""SRCL: similarity-regulated contrastive weights (Jiang et al., ACL 2023).

Every negative of an anchor row gets a weight ``w_ij = Norm(delta / s_ij)`` from a mixed
cross-modal similarity ``s_ij = alpha_h * exp(cos_helper / tau_w) + (1 - alpha_h) * exp(cos_live /
tau_w)``; ``Norm`` makes the mean weight over the row's negatives exactly 1. Weights carry no
gradient, positives keep weight 1, and the weights enter the loss as ``log w`` added to the
logits (see :func:`vlp.losses.contrastive.soft_infonce`), so ``w == 1`` is exactly the plain loss.

All functions take ``[Q, C]`` tensors (rows = anchors, columns = candidates) and a boolean
``positives`` mask of the same shape; every non-positive column is a negative.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

MIN_WEIGHT = 1e-6  # clamp before the log


def alpha_h_at(step: int, span: int) -> float:
    """Helper share of the mixed similarity: 1 at step 0, linearly to 0 at ``span`` (then 0).

    ``span <= 0`` means no helper at all (fine-tuning: the live model alone regulates)."""
    if span <= 0:
        return 0.0
    return max(0.0, 1.0 - step / span)


@torch.no_grad()
def mixed_similarity(
    cos_live: torch.Tensor, cos_helper: torch.Tensor | None, alpha_h: float, tau_w: float = 1.0
) -> torch.Tensor:
    """``s = alpha_h * exp(cos_helper / tau_w) + (1 - alpha_h) * exp(cos_live / tau_w)``, [Q, C].

    ``cos_helper`` may be None only when ``alpha_h == 0``."""

    def e(c: torch.Tensor) -> torch.Tensor:
        c = c.detach().float()
        return torch.exp(c if tau_w == 1.0 else c / tau_w)

    live = e(cos_live)
    if alpha_h == 0.0:
        return live
    if cos_helper is None:
        raise ValueError("SRCL needs helper similarities while alpha_h > 0")
    helper = e(cos_helper)
    return live.lerp_(helper, alpha_h)  # (1 - a) * live + a * helper, in place


@torch.no_grad()
def srcl_weights(s: torch.Tensor, positives: torch.Tensor, mode: str = "softmax", delta: float = 1.0) -> torch.Tensor:
    """Per-negative weights from similarities ``s`` [Q, C] (> 0); positives get exactly 1.

    ``mean``: ``w = u / mean_neg(u)`` with ``u = 1 / s`` (delta cancels).
    ``softmax``: ``w = n_neg * softmax_neg(delta * u)``; delta -> 0 gives w = 1.
    Either way the mean of ``w`` over each row's negatives is 1 and ``w`` falls as ``s`` grows.
    (Large queues make these [B, B + Q] passes the whole cost of SRCL: they are done in place.)
    """
    n_neg = (s.shape[1] - torch.count_nonzero(positives, dim=1)[:, None]).clamp_min(1).float()
    u = torch.reciprocal(s.float())
    if mode == "mean":
        mean_u = u.masked_fill(positives, 0.0).sum(1, keepdim=True) / n_neg
        w = u.div_(mean_u)
    elif mode == "softmax":
        w = torch.softmax(u.mul_(delta).masked_fill_(positives, float("-inf")), dim=1).mul_(n_neg)
    else:
        raise ValueError(f"SRCL weight mode must be 'softmax' or 'mean', got {mode!r}")
    return w.masked_fill_(positives, 1.0)  # also clears the NaN of rows without any negative


@torch.no_grad()
def removal_log_weights(
    w: torch.Tensor, positives: torch.Tensor, threshold: float, reweight: bool = False
) -> torch.Tensor:
    """ALBEF++ removal: negatives with ``w < threshold`` get log-weight -inf (dropped from the
    contrast). Survivors keep log-weight 0 (unweighted, the paper's ALBEF++), or with ``reweight``
    their SRCL weights renormalised to mean 1 over the surviving negatives. Positives: always 0."""
    drop = (w < threshold) & ~positives
    if reweight:
        keep = ~drop & ~positives
        mean_kept = (w * keep).sum(1, keepdim=True) / keep.sum(1, keepdim=True).clamp_min(1)
        out = to_log_weights(w / mean_kept.clamp_min(MIN_WEIGHT), positives)
    else:
        out = torch.zeros_like(w)
    return out.masked_fill(drop, float("-inf"))


@torch.no_grad()
def to_log_weights(w: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """``log(max(w, 1e-6))`` for negatives, exactly 0 for positives."""
    return w.clamp_min(MIN_WEIGHT).log_().masked_fill_(positives, 0.0)


LEVELS = (0.2, 0.7)  # the paper's false-negative level and its histogram threshold


def level_key(level: float, prefix: str = "srcl_w_") -> str:
    return f"{prefix}below_{str(level).replace('.', '_')}"


@torch.no_grad()
def weight_stats(
    w: torch.Tensor | Sequence[torch.Tensor],
    positives: torch.Tensor,
    levels: tuple[float, ...] = LEVELS,
    prefix: str = "srcl_w_",
) -> dict[str, torch.Tensor]:
    """Statistics of the negatives' weights, as 0-d tensors (no device sync): ``{prefix}mean``,
    ``{prefix}min`` and ``{prefix}below_<level>`` (fraction of negatives below each level).

    ``w`` is one or several matrices (both ITC directions) as :func:`srcl_weights` returns them:
    positives carry weight exactly 1 and each row's negatives average 1. So the sums, the minimum
    and the counts below a level <= 1 can run over whole matrices, without copying out the
    negatives (at ``B + Q = 65k`` columns the copies would cost more than the weights)."""
    if any(lv > 1.0 for lv in levels):
        raise ValueError(f"levels must be <= 1 (positives have weight 1), got {levels}")
    ws = [w] if isinstance(w, torch.Tensor) else list(w)
    n_pos = torch.count_nonzero(positives) * len(ws)
    n_neg = positives.numel() * len(ws) - n_pos
    denom = n_neg.clamp_min(1).float()
    has_neg = n_neg > 0
    one = torch.ones((), device=positives.device)
    total = sum(x.sum() for x in ws) - n_pos
    low = torch.stack([x.min() for x in ws]).min()  # <= 1, so never a positive's weight unless equal
    out = {f"{prefix}mean": torch.where(has_neg, total / denom, one), f"{prefix}min": torch.where(has_neg, low, one)}
    for lv in levels:
        out[level_key(lv, prefix)] = sum(torch.count_nonzero(x < lv) for x in ws) / denom
    return out


@torch.no_grad()
def calibrate_delta(
    s: torch.Tensor,
    positives: torch.Tensor,
    frac_below: float = 0.2,
    level: float = 0.7,
    lo: float = 1e-3,
    hi: float = 1e3,
    iters: int = 60,
) -> float:
    """The ``softmax``-mode delta at which a fraction ``frac_below`` of the negatives gets a weight
    below ``level`` (the paper: about 20% below 0.7). Bisection in log-space; the fraction grows
    with delta (delta -> 0 gives w = 1, nothing below ``level``)."""
    if not 0.0 < frac_below < 1.0:
        raise ValueError(f"frac_below must be in (0, 1), got {frac_below}")

    def frac(delta: float) -> float:
        w = srcl_weights(s, positives, "softmax", delta)
        return float(weight_stats(w, positives, (level,))[level_key(level)])

    lo_l, hi_l = math.log(lo), math.log(hi)
    for _ in range(iters):
        mid = 0.5 * (lo_l + hi_l)
        lo_l, hi_l = (mid, hi_l) if frac(math.exp(mid)) < frac_below else (lo_l, mid)
    return math.exp(0.5 * (lo_l + hi_l))
