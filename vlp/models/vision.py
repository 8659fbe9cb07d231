"""ViT image tower built with timm; returns every token after the final norm."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

import timm
from torch import nn

from vlp.config import VISION_PRESETS, VisionConfig, resolved


def build_vision(cfg: VisionConfig) -> nn.Module:
    """A timm ``VisionTransformer`` without a head (``num_classes=0``).

    Call ``.forward_features(images [B, 3, H, W])`` for tokens ``[B, 1 + N, width]`` (CLS first).
    ``cfg.pretrained`` may name a local weights file or a timm hub tag; timm resizes the position
    embedding to ``img_size`` (bicubic, CLS entry kept).
    """
    r = resolved(cfg, VISION_PRESETS)
    kwargs = dict(
        img_size=r["img_size"],
        patch_size=r["patch_size"],
        embed_dim=r["width"],
        depth=r["depth"],
        num_heads=r["heads"],
        mlp_ratio=r["mlp_ratio"],
        drop_path_rate=r["drop_path"],
        num_classes=0,
    )
    return create_timm(r["arch"], r["pretrained"], **kwargs)


def create_timm(arch: str, pretrained: Optional[str] = None, **kwargs: Any) -> nn.Module:
    """``timm.create_model(arch)`` with random weights (``pretrained=None``), weights from a local
    file, or a timm hub tag (which replaces ``arch``; needs network or the HF cache)."""
    if pretrained is None:
        return timm.create_model(arch, pretrained=False, **kwargs)
    if Path(pretrained).exists():
        return timm.create_model(arch, pretrained=True, pretrained_cfg_overlay=dict(file=str(pretrained)), **kwargs)
    return timm.create_model(pretrained, pretrained=True, **kwargs)


def resize_pos_embed(pos_embed: torch.Tensor, num_tokens: int, num_prefix: int = 1) -> torch.Tensor:
    """Interpolate a ViT position embedding [1, P + G*G, W] to [1, num_tokens, W] (square grids,
    bicubic, prefix entries such as CLS kept). The same size returns the input unchanged."""
    from timm.layers import resample_abs_pos_embed

    if pos_embed.shape[1] == num_tokens:
        return pos_embed
    old, new = pos_embed.shape[1] - num_prefix, num_tokens - num_prefix
    g_old, g_new = round(old ** 0.5), round(new ** 0.5)
    if g_old * g_old != old or g_new * g_new != new:
        raise ValueError(f"position embedding of {pos_embed.shape[1]} tokens -> {num_tokens}: "
                         f"both must be {num_prefix} + a square grid")
    out = resample_abs_pos_embed(pos_embed.float(), [g_new, g_new], [g_old, g_old], num_prefix_tokens=num_prefix,
                                 interpolation="bicubic", antialias=False)
    return out.to(pos_embed.dtype)
