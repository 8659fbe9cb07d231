"""Momentum distillation of a classification loss (ALBEF's MLM, NLVR2 and TA heads)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def distilled_ce(
    logits: torch.Tensor,
    labels: torch.Tensor,
    momentum_logits: Optional[torch.Tensor] = None,
    alpha: float = 0.0,
) -> torch.Tensor:
    """``(1 - alpha) * CE(logits, labels) + alpha * soft CE(logits, softmax(momentum_logits))``.

    ``logits``/``momentum_logits`` [B, C], ``labels`` [B] long. Means over the batch; the
    momentum targets get no gradient. ``alpha == 0`` or no momentum logits: plain CE.
    """
    logp = F.log_softmax(logits.float(), dim=-1)
    ce = F.nll_loss(logp, labels)
    if momentum_logits is None or alpha == 0.0:
        return ce
    soft = -(F.softmax(momentum_logits.detach().float(), dim=-1) * logp).sum(-1).mean()
    return (1.0 - alpha) * ce + alpha * soft
