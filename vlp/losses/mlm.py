"""Masked language modelling: BERT masking (15%, 80/10/10) and the (distilled) MLM loss."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from vlp.losses.distill import distilled_ce


@torch.no_grad()
def mask_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    special_ids: Sequence[int],
    mask_id: int,
    vocab_size: int,
    probability: float = 0.15,
    generator: Optional[torch.Generator] = None,
    length: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Select tokens with ``probability`` (never padding or special tokens such as [CLS]/[SEP]).

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
    special = torch.tensor(list(special_ids), device=dev, dtype=input_ids.dtype)
    selectable = attention_mask.bool() & ~torch.isin(input_ids, special)
    u = torch.rand(shape, generator=generator, device=dev)[:, :t]
    selected = selectable & (u < probability)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
    r = torch.rand(shape, generator=generator, device=dev)[:, :t]
    random_tokens = torch.randint(vocab_size, shape, generator=generator, device=dev, dtype=input_ids.dtype)[:, :t]
    masked = torch.where(selected & (r < 0.8), torch.full_like(input_ids, mask_id), input_ids)
    masked = torch.where(selected & (r >= 0.8) & (r < 0.9), random_tokens, masked)
    return masked, labels


def mlm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    momentum_logits: Optional[torch.Tensor] = None,
    alpha: float = 0.0,
    total: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``(1 - alpha) * CE + alpha * D`` over masked positions.

    ``logits`` [M, V] and ``labels`` [M] for the M selected positions only; ``momentum_logits``
    [M, V] the momentum model's logits. D = mean over positions of
    ``-sum_v softmax(momentum)_v * log_softmax(logits)_v`` - both over the vocabulary axis.
    ``total`` (scalar): divide the sum over the M positions by ``total`` instead of M (the global
    normalisation of :func:`vlp.tasks.objectives.mlm_step`).
    """
    if logits.shape[0] == 0:  # nothing selected in this batch
        return logits.sum() * 0.0
    loss = distilled_ce(logits, labels, momentum_logits, alpha)
    return loss if total is None else loss * (logits.shape[0] / total)
