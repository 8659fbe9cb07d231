"""Momentum distillation of a classification loss (ALBEF's MLM, NLVR2 and TA heads)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def distilled_ce(
    logits: torch.Tensor,
    labels: torch.Tensor,
    momentum_logits: Optional[torch.Tensor] = None,
    alpha: float | torch.Tensor = 0.0,
    denominator: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``(1 - alpha) * CE(logits, labels) + alpha * soft CE(logits, softmax(momentum_logits))``.

    ``logits``/``momentum_logits`` [B, C], ``labels`` [B] long; rows labelled -100 count for
    nothing (the empty slots of a fixed-capacity gather). Sums over the rows divided by
    ``denominator`` (default: the number of labelled rows, at least 1; so a mean over the batch,
    and 0 when no row is labelled), computed on the device without reading the count back. The
    momentum targets get no gradient. ``alpha == 0`` or no momentum logits: plain CE (a 0-d
    tensor ``alpha``, a compiled step's, always blends: at 0 that is plain CE).
    """
    valid = labels != -100
    logp = F.log_softmax(logits.float(), dim=-1)
    per_row = -logp.gather(1, labels.clamp_min(0)[:, None])[:, 0]
    if momentum_logits is not None and (isinstance(alpha, torch.Tensor) or alpha != 0.0):
        soft = -(F.softmax(momentum_logits.detach().float(), dim=-1) * logp).sum(-1)
        per_row = (1.0 - alpha) * per_row + alpha * soft
    if denominator is None:
        denominator = valid.sum().clamp_min(1)
    return torch.where(valid, per_row, torch.zeros_like(per_row)).sum() / denominator
