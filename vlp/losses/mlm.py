"""Masked language modelling: BERT masking (15%, 80/10/10) and the (distilled) MLM loss."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from vlp.losses.distill import distilled_ce


@torch.no_grad()
def mask_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    special_ids: Sequence[int] | torch.Tensor,
    mask_id: int,
    vocab_size: int,
    probability: float = 0.15,
    generator: Optional[torch.Generator] = None,
    length: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Select tokens with ``probability`` (never padding or special tokens such as [CLS]/[SEP]).

    ``special_ids``: a tensor already on the device avoids a copy from host memory at every call.
    Of the selected: 80% -> ``mask_id``, 10% -> a random token, 10% unchanged.
    Returns ``(masked_ids [B, T], labels [B, T])`` with label -100 at unselected positions.
    ``length`` (>= T, e.g. the tokenizer's max_len): the random numbers are drawn for [B, length]
    and the first T columns used, so the masks do not depend on how far the batch is padded.
    """
    dev = input_ids.device
    b, t = input_ids.shape
    if length is not None and length < t:
        raise ValueError(f"mask_tokens: length {length} is shorter than the batch's {t} tokens")
    shape = (b, t if length is None else length)
    special = (
        special_ids.to(dev, input_ids.dtype)
        if isinstance(special_ids, torch.Tensor)
        else torch.tensor(list(special_ids), device=dev, dtype=input_ids.dtype)
    )
    selectable = attention_mask.bool() & ~torch.isin(input_ids, special)
    u = torch.rand(shape, generator=generator, device=dev)[:, :t]
    selected = selectable & (u < probability)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
    r = torch.rand(shape, generator=generator, device=dev)[:, :t]
    random_tokens = torch.randint(vocab_size, shape, generator=generator, device=dev, dtype=input_ids.dtype)[:, :t]
    masked = torch.where(selected & (r < 0.8), torch.full_like(input_ids, mask_id), input_ids)
    masked = torch.where(selected & (r >= 0.8) & (r < 0.9), random_tokens, masked)
    return masked, labels


#: The MLM loss ``(1 - alpha) * CE + alpha * D`` over masked positions: :func:`distilled_ce` with
#: ``logits`` [M, V] and ``labels`` [M] for M gathered positions, -100 where a slot holds no masked
#: token (:func:`gather_masked`), ``momentum_logits`` [M, V] the momentum model's logits (D: the soft
#: cross-entropy against their softmax, over the vocabulary axis), and as denominator the global
#: count of masked tokens (:func:`vlp.tasks.objectives.draw_masks`) instead of the local one. No
#: masked token: 0, with a gradient.
mlm_loss = distilled_ce


def mlm_capacity(positions: int, probability: float) -> int:
    """Slots for the masked tokens of ``positions`` token positions: the mean ``p n`` plus 8 standard
    deviations plus 8 (at most ``n``). A batch masks more with probability below 1e-15; the
    excess tokens then stay masked in the input but leave the loss."""
    p = min(max(probability, 0.0), 1.0)
    return min(positions, math.ceil(p * positions + 8 * math.sqrt(positions * p * (1 - p))) + 8)


def gather_masked(labels: torch.Tensor, capacity: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The masked positions of ``labels`` [B, T] (label != -100) in row-major order.

    ``capacity`` slots: without a device synchronisation (a stable sort puts the masked positions
    first; boolean indexing would wait for the count). None: exactly the M masked positions (one
    sync). Returns ``(index [C], labels [C])``: flat indices into [B * T], and their labels, -100
    in the slots past the last masked token.
    """
    flat = labels.flatten()
    chosen = flat != -100
    if capacity is None:
        index = chosen.nonzero()[:, 0]
        return index, flat[index]
    index = torch.argsort((~chosen).to(torch.uint8), stable=True)[:capacity]
    return index, torch.where(chosen[index], flat[index], torch.full_like(flat[index], -100))
