"""NLVR2 losses and text-assignment (TA) pair sampling, on tensors only."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from vlp.losses.distill import distilled_ce

#: TA labels: the text describes image 0 of the pair, image 1, or neither.
TA_FIRST, TA_SECOND, TA_NEITHER = 0, 1, 2

__all__ = ["distilled_ce", "accuracy", "assign_pairs", "hard_image_probs", "TA_FIRST", "TA_SECOND", "TA_NEITHER"]


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Share of rows of ``logits`` [B, C] whose argmax equals ``labels`` [B] (a 0-d tensor)."""
    return (logits.detach().argmax(-1) == labels).float().mean()


def _first_of_id(image_ids: torch.Tensor) -> torch.Tensor:
    """[B] index of the first batch position holding each position's image id."""
    b = image_ids.shape[0]
    same = image_ids[:, None] == image_ids[None, :]
    pos = torch.arange(b, device=image_ids.device).expand(b, b)
    return torch.where(same, pos, torch.full_like(pos, b)).amin(1)


@torch.no_grad()
def hard_image_probs(sim: torch.Tensor, image_ids: torch.Tensor) -> torch.Tensor:
    """Per-row sampling weights over OTHER images -> [B, B], each image id counted once.

    ``sim`` [B, B] image-image logits (similarity / temperature). Entries with the row's own image
    id (the diagonal included) are set to -inf BEFORE the softmax; NaN counts as -inf; a row whose
    valid entries are all -inf is uniform over them. The mass of every image id is then moved to
    its first batch position, so two draws without replacement are two distinct image ids. Every
    valid column keeps a tiny positive weight, so it always beats an invalid (zero) one.
    """
    b = sim.shape[0]
    invalid = image_ids[:, None] == image_ids[None, :]
    s = sim.float().nan_to_num(nan=float("-inf")).masked_fill(invalid, float("-inf"))
    has_mass = torch.isfinite(s).any(1, keepdim=True)
    probs = F.softmax(s.masked_fill(~has_mass, 0.0), dim=1)
    valid = (~invalid).float()
    uniform = valid / valid.sum(1, keepdim=True).clamp_min(1.0)
    probs = torch.where(has_mass, probs, uniform)  # a row without mass: uniform over its valid entries
    first = _first_of_id(image_ids)
    merged = torch.zeros_like(probs).scatter_add_(1, first.expand(b, b), probs)
    representative = (first == torch.arange(b, device=sim.device))[None, :] & ~invalid
    return torch.where(representative, merged.clamp_min(1e-30), torch.zeros_like(merged))


@torch.no_grad()
def assign_pairs(
    sim: torch.Tensor,
    image_ids: torch.Tensor,
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Text-assignment pairs for B texts whose own image is batch position b.

    ``sim`` [B, B] image-image logits, ``image_ids`` [B]. Per text, with probability 1/3 each:
    label 0 = (own image, hard image), label 1 = (hard image, own image), label 2 = two hard images
    of distinct image ids, neither with the own id. Hard images are drawn from
    :func:`hard_image_probs`. One ``multinomial`` call (two draws per row without replacement) and
    one ``rand`` call, no per-row Python loop.

    Returns ``(idx0 [B], idx1 [B], labels [B])``: batch positions of image 0 / image 1 and labels.
    Raises ``ValueError`` unless the batch has at least 3 distinct image ids (one host sync).
    """
    if torch.unique(image_ids).numel() < 3:
        raise ValueError(
            "text assignment needs at least 3 distinct image ids per batch "
            f"(got {torch.unique(image_ids).numel()} in a batch of {image_ids.shape[0]}); "
            "use a larger batch or fewer captions per image"
        )
    b = sim.shape[0]
    probs = hard_image_probs(sim, image_ids)
    hard = torch.multinomial(probs, 2, replacement=False, generator=generator)  # [B, 2]
    u = torch.rand(b, generator=generator, device=sim.device)
    labels = (u * 3).long().clamp_max(TA_NEITHER)
    own = torch.arange(b, device=sim.device)
    idx0 = torch.where(labels == TA_FIRST, own, hard[:, 0])
    idx1 = torch.where(labels == TA_SECOND, own, torch.where(labels == TA_FIRST, hard[:, 0], hard[:, 1]))
    return idx0, idx1, labels
