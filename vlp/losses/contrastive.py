"""Contrastive losses on similarity matrices ``[queries, candidates]``.

Losses take tensors (logits, target distributions, optional log-weights), never models.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def itc_targets(positives: torch.Tensor, momentum_logits: Optional[torch.Tensor] = None, alpha: float = 0.0) -> torch.Tensor:
    """Target distribution per query row.

    ``positives`` [Q, C] bool -> uniform over each row's positives; with ``momentum_logits`` [Q, C]
    and ``alpha`` > 0 (momentum distillation): ``alpha * softmax(m) + (1 - alpha) * y``.
    """
    y = positives.float()
    y = y / y.sum(1, keepdim=True).clamp_min(1.0)
    if momentum_logits is None or alpha == 0.0:
        return y
    return alpha * F.softmax(momentum_logits.float(), dim=1) + (1.0 - alpha) * y


def soft_infonce(logits: torch.Tensor, targets: torch.Tensor, log_weights: Optional[torch.Tensor] = None,
                 removal: bool = False) -> torch.Tensor:
    """``-mean_q sum_c targets[q, c] * log_softmax(logits + log_weights)[q, c]``.

    ``logits`` [Q, C] (already divided by the temperature), ``targets`` [Q, C] rows summing to 1,
    ``log_weights`` [Q, C] optional per-negative log-weights (0 = unweighted). Returns a scalar.
    With ``removal``, a log-weight of ``-inf`` removes that candidate from the contrast: it leaves
    the softmax, and its share of a soft (distillation) target is given to the remaining
    candidates. (Without ``removal`` every log-weight must be finite; skipping the bookkeeping
    saves several passes over ``[B, B + Q]``.)
    """
    logits = logits.float()
    if log_weights is None:
        return -(targets * F.log_softmax(logits, dim=1)).sum(1).mean()
    if not removal:
        return -(targets * F.log_softmax(logits + log_weights, dim=1)).sum(1).mean()
    removed = torch.isneginf(log_weights)
    logp = F.log_softmax(logits + log_weights, dim=1).masked_fill(removed, 0.0)
    kept = targets.masked_fill(removed, 0.0)
    kept = kept / kept.sum(1, keepdim=True).clamp_min(1e-12)
    targets = torch.where(removed.any(1, keepdim=True), kept, targets)  # rows without removals: exact
    return -(targets * logp).sum(1).mean()
