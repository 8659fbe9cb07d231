"""Grad-CAM of the ITM score over the cross-attention of one fusion layer (ALBEF's ``Grounding.py``
and visualisation notebook).

For an image-text pair, let ``A`` [heads, T, N] be the cross-attention probabilities of fusion
layer ``l`` (text token ``t`` attending to image token ``n``; ``n = 0`` the image [CLS]) and ``s``
the ITM match logit ``itm_head(fused[CLS])[1]``. The per-token map is

    M[t, i, j] = m_t * mean_heads( A[:, t, p] * max(0, ds/dA[:, t, p]) ),   p = 1 + i w + j

over the ``h x w`` patch grid (the image [CLS] and any other prefix token dropped), ``m_t`` the
text attention mask. The grounding map of the whole text is the mean of ``M[t]`` over the text's
tokens (:func:`token_mean`). The gradient is taken with :func:`torch.autograd.grad` with respect
to the probabilities only, so the model's parameters get no ``.grad``.

The default layer is the middle fusion layer, ``(n_fusion - 1) // 2``: ALBEF's ``block_num = 8``
is BERT layer 8, the third of ALBEF-base's six fusion layers (index 2 = (6 - 1) // 2), and the
middle layer is that choice for any depth (a 2-layer fusion block gets layer 0). It must not be
the last layer: the ITM head reads the fused [CLS] state only, and after the last cross-attention
no other position reaches it, so there every word's gradient, and map, is exactly zero (only the
[CLS] row has a map). ``layer=`` picks another one (``vlp evaluate grounding --layer``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Optional, cast

import torch
from torch import nn

from vlp.models.text import Attention, FusionEncoder

if TYPE_CHECKING:
    from vlp.models.albef import ALBEF

__all__ = [
    "GradCAM",
    "capture_cross_attention",
    "default_layer",
    "fusion_encoder",
    "fusion_layer_index",
    "gradcam",
    "gradcam_maps",
    "token_mean",
]


@dataclass
class GradCAM:
    """Grad-CAM maps [B, T, h, w] (float32, masked text positions zero) and the ITM logits [B, 2]
    of the forward pass they came from (both detached)."""

    maps: torch.Tensor
    itm_logits: torch.Tensor
    layer: int


def default_layer(n_fusion: int) -> int:
    """The middle fusion layer ``(n_fusion - 1) // 2`` (ALBEF-base: 2 of 0..5, its ``block_num = 8``)."""
    if n_fusion < 1:
        raise ValueError(f"a fusion encoder with {n_fusion} layers has no cross-attention")
    return (n_fusion - 1) // 2


def fusion_encoder(model: nn.Module) -> FusionEncoder:
    """The fusion encoder of an ALBEF ``model`` that has the ITM head (what Grad-CAM needs)."""
    fusion = getattr(model, "fusion", None)
    if not isinstance(fusion, FusionEncoder) or getattr(model, "itm_head", None) is None:
        raise ValueError(
            f"Grad-CAM needs a fusion encoder and the ITM head (a pretrain, helper or retrieval ALBEF model); "
            f"got a {type(model).__name__}"
        )
    return fusion


def fusion_layer_index(model: nn.Module, layer: Optional[int]) -> int:
    """``layer``, or the default (:func:`default_layer`) for None, checked to be a fusion layer of ``model``."""
    n = len(fusion_encoder(model).layer)
    chosen = default_layer(n) if layer is None else layer
    if not 0 <= chosen < n:
        raise ValueError(f"fusion layer {chosen} does not exist: this model has fusion layers 0..{n - 1}")
    return chosen


@contextmanager
def capture_cross_attention(fusion: FusionEncoder, layer: int) -> Iterator[Attention]:
    """Inside the block, the cross-attention of fusion layer ``layer`` runs its explicit path and
    keeps its probabilities [B, heads, T, N] in ``.probs`` (:meth:`vlp.models.text.Attention`);
    on exit it is back on SDPA and the probabilities are dropped."""
    attention = fusion.layer[layer].crossattention
    if not isinstance(attention, Attention):
        raise TypeError(f"fusion layer {layer} has no cross-attention module")
    attention.capture = True
    try:
        yield attention
    finally:
        attention.capture, attention.probs = False, None


def _patch_grid(model: nn.Module, images: torch.Tensor) -> tuple[int, int, int]:
    """(prefix tokens, h, w) of the ViT's token sequence for ``images`` [B, 3, H, W]."""
    vit: Any = model.vision
    patch = vit.patch_embed.patch_size
    ph, pw = (patch, patch) if isinstance(patch, int) else patch
    return int(getattr(vit, "num_prefix_tokens", 1)), images.shape[-2] // ph, images.shape[-1] // pw


def gradcam(
    model: nn.Module,  # an ALBEF (or any module with its encode_image / text_states / fuse / itm_logits)
    images: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    layer: Optional[int] = None,
) -> GradCAM:
    """Grad-CAM of the ITM match logit over the cross-attention of fusion layer ``layer`` (default
    :func:`default_layer`) of an ALBEF ``model`` (module docstring): ``images`` [B, 3, H, W],
    ``input_ids`` / ``attention_mask`` [B, T] -> maps [B, T, h, w] (heads averaged, padding zero).

    Runs with gradients on whatever the caller's grad mode; put the model in eval mode first
    (dropout would change the maps)."""
    index = fusion_layer_index(model, layer)
    albef = cast("ALBEF", model)
    prefix, h, w = _patch_grid(model, images)
    with torch.enable_grad(), capture_cross_attention(albef.fusion, index) as attention:
        tokens = albef.encode_image(images).tokens
        fused = albef.fuse(albef.text_states(input_ids, attention_mask), attention_mask, tokens)
        logits = albef.itm_logits(fused)
        probs = attention.probs
        if probs is None or not probs.requires_grad:
            raise RuntimeError("the captured cross-attention kept no probabilities with gradients")
        (grad,) = torch.autograd.grad(logits[:, 1].sum(), probs)
    b, heads, t, n = probs.shape
    if n != prefix + h * w:
        raise ValueError(f"{n} image tokens do not make {prefix} prefix tokens + a {h}x{w} patch grid")
    cam = probs.detach()[..., prefix:].float().reshape(b, heads, t, h, w)
    pos = grad[..., prefix:].float().clamp(min=0).reshape(b, heads, t, h, w)
    mask = attention_mask.to(cam.dtype)[:, None, :, None, None]
    return GradCAM((cam * pos * mask).mean(1), logits.detach().float(), index)


def gradcam_maps(
    model: nn.Module,
    images: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    layer: Optional[int] = None,
) -> torch.Tensor:
    """The maps [B, T, h, w] of :func:`gradcam`."""
    return gradcam(model, images, input_ids, attention_mask, layer).maps


def token_mean(maps: torch.Tensor, attention_mask: torch.Tensor, words_only: bool = False) -> torch.Tensor:
    """The grounding map [B, h, w] of per-token maps [B, T, h, w]: their mean over the text's tokens
    (``attention_mask`` [B, T], 1 = token).

    ``words_only=False`` (ALBEF's ``Grounding.py``) averages every token, [CLS] and [SEP] included;
    ALBEF divides by the padded length T, a positive factor per row that changes no box choice, and
    vlp divides by the row's token count so a row's map does not depend on its batch.
    ``words_only=True`` leaves out each row's first and last token ([CLS] and [SEP])."""
    keep = attention_mask.to(maps.dtype).clone()
    if words_only:
        lengths = attention_mask.long().sum(1)
        if bool((lengths < 3).any()):
            raise ValueError("words_only needs at least one token between [CLS] and [SEP] in every row")
        rows = torch.arange(len(keep), device=keep.device)
        keep[:, 0] = 0
        keep[rows, lengths - 1] = 0
    return (maps * keep[:, :, None, None]).sum(1) / keep.sum(1).clamp(min=1)[:, None, None]
