"""Image-text matching: safe, vectorised hard-negative sampling and the ITM loss."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

#: ITM's pairs per positive: one negative image per text and one negative text per image
#: (:func:`vlp.tasks.objectives.itm_pairs`), so 1 positive : 2 negatives
ITM_NEGATIVES_PER_POSITIVE = 2


def itm_prior_loss(negatives_per_positive: int = ITM_NEGATIVES_PER_POSITIVE) -> float:
    """The ITM loss (mean cross-entropy, nats) of a classifier that always predicts the class
    prior, p(match) = 1 / (1 + ``negatives_per_positive``): the entropy of that prior, 0.6365 for
    ALBEF's 1 : 2. An ITM loss at this level means the head has learned nothing about the pairs."""
    p = 1.0 / (1 + negatives_per_positive)
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


@torch.no_grad()
def sample_hard_negatives(
    sim: torch.Tensor,
    image_ids: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
    hardness: float = 1.0,
    noise: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one negative column per row, with probability ``softmax(hardness * sim)`` over valid
    negatives (``hardness`` 1: ALBEF; 0: uniform random negatives; between: softer mining).

    ``sim`` [B, B] (row = anchor, column = candidate of the other modality, same batch order).
    Invalid negatives - the diagonal and, given ``image_ids`` [B], every column with the anchor's
    image id - are set to -inf *before* the softmax, so a dominant diagonal cannot underflow the
    row. NaN similarities count as -inf; a row whose valid entries are all -inf falls back to
    uniform over its valid negatives.

    The draw is ``argmax(p / q)`` with ``q`` ~ Exp(1) per entry (the exponential race: column j
    wins with probability p_j), which is what ``torch.multinomial(p, 1)`` computes, with the same
    draws from ``generator``, minus its host-synchronising check of ``p``. ``noise`` [B, B]:
    :func:`race_noise` drawn beforehand (outside a compiled graph) instead of ``generator``.

    Returns ``(index [B] long, valid [B] bool)``; ``valid`` is False for rows that have no valid
    negative at all (batch of 1, or every item from the anchor's image). Their index points at the
    row itself and must be ignored by the loss.
    """
    b = sim.shape[0]
    invalid = torch.eye(b, dtype=torch.bool, device=sim.device)
    if image_ids is not None:
        invalid |= image_ids[:, None] == image_ids[None, :]
    s = sim.float().nan_to_num(nan=float("-inf"))
    if hardness != 1.0:
        s = torch.where(torch.isfinite(s), s * hardness, s)  # -inf stays -inf (0 * -inf would be NaN)
    s = s.masked_fill(invalid, float("-inf"))
    has_valid = (~invalid).any(1)
    has_mass = torch.isfinite(s).any(1)
    probs = F.softmax(s.masked_fill(~has_mass[:, None], 0.0), dim=1)  # rows w/o mass: uniform...
    uniform_valid = (~invalid).float()
    probs = torch.where(has_mass[:, None], probs, uniform_valid)  # ... over the valid negatives
    probs = torch.where(has_valid[:, None], probs, torch.eye(b, device=sim.device))
    q = race_noise(probs.shape[0], probs.shape[1], probs.device, generator) if noise is None else noise
    return (probs / q).argmax(1), has_valid


def race_noise(rows: int, cols: int, device: torch.device, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Exp(1) draws [rows, cols] fp32 for :func:`sample_hard_negatives` (``multinomial``'s own)."""
    return torch.empty(rows, cols, dtype=torch.float32, device=device).exponential_(1.0, generator=generator)


def itm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    valid: Optional[torch.Tensor] = None,
    total: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` [N, 2] against ``labels`` [N] over rows with ``valid`` [N].

    ``total`` (scalar): divide the sum over the valid rows by ``total`` instead of their count (the
    global normalisation of :func:`vlp.tasks.objectives.itm_pairs`)."""
    ce = F.cross_entropy(logits.float(), labels, reduction="none")
    w = torch.ones_like(ce) if valid is None else valid.float()
    if total is not None:
        return (ce * w).sum() / total
    if valid is None:
        return ce.mean()
    return (ce * w).sum() / w.sum().clamp_min(1.0)
