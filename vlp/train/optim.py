"""Optimizer parameter groups and the learning-rate schedule (warm-up + cosine, in steps)."""

from __future__ import annotations

import math

import torch
from torch import nn

from vlp.config import TrainConfig

# Never decayed, whatever their shape (ALBEF decays them; vlp does not, albef.md §14 #19).
NO_DECAY_NAMES = ("pos_embed", "cls_token", "temp")


def no_weight_decay(name: str, p: torch.Tensor) -> bool:
    """Norm weights, biases (any 0/1-d tensor) and pos_embed / cls_token / temperature."""
    return p.ndim <= 1 or name.endswith(".bias") or name.rsplit(".", 1)[-1] in NO_DECAY_NAMES


def self_optimized(module: nn.Module) -> set[int]:
    """Ids of parameters that step themselves (submodules with ``self_optimized = True``, e.g. the
    LTD multiplier): no model optimizer, weight decay, clipping or averaging."""
    return {id(p) for m in module.modules() if getattr(m, "self_optimized", False) for p in m.parameters()}


def trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Parameters the model optimizer trains: requiring grad, not self-optimized, ties once."""
    own = self_optimized(module)
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad and id(p) not in own]


def param_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups over trainable parameters (frozen momentum twins are left out)."""
    decay, no_decay = [], []
    for name, p in trainable(module):
        (no_decay if no_weight_decay(name, p) else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(module: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(module, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas))


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up from ``warmup_lr`` to ``lr`` over ``warmup_steps``, then cosine to ``min_lr``
    at ``steps``."""
    if step < cfg.warmup_steps:
        return cfg.warmup_lr + (cfg.lr - cfg.warmup_lr) * step / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    t = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * t))
