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

from dataclasses import dataclass

import torch

MIN_WEIGHT = 1e-6  # clamp before the log


def alpha_h_at(step: int, span: int) -> float:
    """Helper share of the mixed similarity: 1 at step 0, linearly to 0 at ``span`` (then 0).

    ``span <= 0`` means no helper at all (fine-tuning: the live model alone regulates)."""
    if span <= 0:
        return 0.0
    return max(0.0, 1.0 - step / span)


@torch.no_grad()
def mixed_similarity(cos_live: torch.Tensor, cos_helper: torch.Tensor | None, alpha_h: float, tau_w: float = 1.0) -> torch.Tensor:
    """``s = alpha_h * exp(cos_helper / tau_w) + (1 - alpha_h) * exp(cos_live / tau_w)``, [Q, C].

    ``cos_helper`` may be None only when ``alpha_h == 0``."""
    live = torch.exp(cos_live.detach().float() / tau_w)
    if alpha_h == 0.0:
        return live
    if cos_helper is None:
        raise ValueError("SRCL needs helper similarities while alpha_h > 0")
    return alpha_h * torch.exp(cos_helper.detach().float() / tau_w) + (1.0 - alpha_h) * live


@torch.no_grad()
def srcl_weights(s: torch.Tensor, positives: torch.Tensor, mode: str = "softmax", delta: float = 1.0) -> torch.Tensor:
    """Per-negative weights from similarities ``s`` [Q, C] (> 0); positives get exactly 1.

    ``mean``: ``w = u / mean_neg(u)`` with ``u = 1 / s`` (delta cancels).
    ``softmax``: ``w = n_neg * softmax_neg(delta * u)``; delta -> 0 gives w = 1.
    Either way the mean of ``w`` over each row's negatives is 1 and ``w`` falls as ``s`` grows.
    """
    neg = ~positives
    n_neg = neg.sum(1, keepdim=True).clamp_min(1).float()
    u = 1.0 / s.float()
    if mode == "mean":
        mean_u = (u * neg).sum(1, keepdim=True) / n_neg
        w = u / mean_u
    elif mode == "softmax":
        logits = (delta * u).masked_fill(~neg, float("-inf"))
        w = n_neg * torch.softmax(logits, dim=1).nan_to_num(0.0)  # rows without negatives -> 0
    else:
        raise ValueError(f"SRCL weight mode must be 'softmax' or 'mean', got {mode!r}")
    return torch.where(neg, w, torch.ones_like(w))


@torch.no_grad()
def removal_log_weights(w: torch.Tensor, positives: torch.Tensor, threshold: float) -> torch.Tensor:
    """ALBEF++ removal: negatives with ``w < threshold`` get log-weight -inf (dropped from the
    contrast); every other entry, positives included, keeps log-weight 0 (survivors unweighted)."""
    drop = (w < threshold) & ~positives
    return torch.zeros_like(w).masked_fill(drop, float("-inf"))


@torch.no_grad()
def to_log_weights(w: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """``log(max(w, 1e-6))`` for negatives, exactly 0 for positives."""
    return torch.where(positives, torch.zeros_like(w), torch.log(w.clamp_min(MIN_WEIGHT)))


@dataclass
class WeightStats:
    mean: float
    min: float
    frac_below_0_2: float
    frac_below_0_7: float

    def as_dict(self, prefix: str = "srcl_w_") -> dict[str, float]:
        return {f"{prefix}{k}": v for k, v in vars(self).items()}


@torch.no_grad()
def weight_stats(w: torch.Tensor, positives: torch.Tensor) -> WeightStats:
    """Statistics of the negatives' weights (the diagnostics logged per step)."""
    vals = w[~positives].float()
    if vals.numel() == 0:
        return WeightStats(1.0, 1.0, 0.0, 0.0)
    return WeightStats(vals.mean().item(), vals.min().item(), (vals < 0.2).float().mean().item(),
                       (vals < 0.7).float().mean().item())
