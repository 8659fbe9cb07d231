"""The eager attention of ``reference_step.py``'s reference ALBEF step: timm's unfused attention in the
ViT, and a hand-written BERT-style forward (matmul, softmax, dropout, matmul) over vlp's text tower and
fusion parameters, with the image K/V projected again in every cross-attention layer of every call."""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vlp.models.albef import ALBEF
from vlp.models.text import FusionEncoder, TextEncoder


def use_eager_attention(model: ALBEF) -> None:
    """Switch the ViT (online and momentum) to timm's unfused attention. The text towers and the
    fusion encoder are run by :func:`text_forward` and :func:`fusion_forward`."""
    for tower in (model.vision, model.momentum["vision"]):
        for m in tower.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = False


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:  # [B, L, H] -> [B, heads, L, H/heads]
    b, n, h = x.shape
    return x.view(b, n, heads, h // heads).permute(0, 2, 1, 3)


def _projections(att: nn.Module) -> tuple[Callable, Callable, Callable]:
    """The query, key and value projections of ``att``, BERT's three Linears written out from vlp's
    fused ones: a self-attention's ``qkv`` split into its three row blocks, a cross-attention's
    ``query`` and its ``kv`` split into two."""
    s = att.self
    if hasattr(s, "qkv"):
        ws, bs = s.qkv.weight.chunk(3), s.qkv.bias.chunk(3)
    else:
        ws, bs = (s.query.weight, *s.kv.weight.chunk(2)), (s.query.bias, *s.kv.bias.chunk(2))
    return tuple(functools.partial(F.linear, weight=w, bias=b) for w, b in zip(ws, bs))  # type: ignore[return-value]


def eager_attention(
    att: nn.Module, x: torch.Tensor, context: torch.Tensor, additive_mask: Optional[torch.Tensor], training: bool
) -> torch.Tensor:
    """One BERT-style attention block of vlp's fusion layer (``att``: ``vlp.models.text.Attention``),
    written out: Q from ``x`` [B, T, H], K/V projected from ``context`` [B, N, W] here and now,
    matmul, softmax, dropout, matmul, output dense + residual + LayerNorm."""
    query, key, value = _projections(att)
    q = _heads(query(x), att.heads)
    k = _heads(key(context), att.heads)
    v = _heads(value(context), att.heads)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if additive_mask is not None:
        scores = scores + additive_mask
    probs = F.dropout(F.softmax(scores, dim=-1), att.dropout_p, training)
    ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(x.shape)
    return att.output(ctx, x)


def fusion_forward(
    fusion: FusionEncoder, text_hidden: torch.Tensor, text_mask: torch.Tensor, image_tokens: Optional[torch.Tensor]
) -> torch.Tensor:
    """vlp's fusion layers (self-attention, cross-attention to ``image_tokens`` [B, N, W], FFN),
    eager, with the image K/V projected inside every layer of every call. Returns [B, T, H].
    Layers without cross-attention (the text tower's) take ``image_tokens=None``."""
    add = (1.0 - text_mask[:, None, None, :].to(text_hidden.dtype)) * torch.finfo(text_hidden.dtype).min
    x = text_hidden
    for layer in fusion.layer:
        x = eager_attention(layer.attention, x, x, add, fusion.training)
        if layer.crossattention is not None:
            x = eager_attention(layer.crossattention, x, image_tokens, None, fusion.training)
        x = layer.output(F.gelu(layer.intermediate.dense(x)), x)
    return x


def text_forward(text: TextEncoder, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """vlp's BERT text tower, eager: embeddings, then BERT layers with additive-mask attention."""
    return fusion_forward(text.encoder, text.embeddings(input_ids=ids), mask, None)
