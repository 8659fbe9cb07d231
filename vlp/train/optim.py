"""Optimizer parameter groups and the learning-rate schedule (warm-up + cosine, in steps)."""

from __future__ import annotations

import math
from typing import Mapping, Optional

import torch
from torch import nn

from vlp.config import TrainConfig
from vlp.errors import ConfigError

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


def lr_scale_of(name: str, lr_scale: Mapping[str, float]) -> tuple[Optional[str], float]:
    """``(path, factor)`` of the longest ``lr_scale`` path whose dotted components appear, in a
    row, in the parameter ``name`` (``vision`` matches ``model.vision.blocks.0.attn.qkv.weight``);
    ``(None, 1.0)`` when none does."""
    parts = name.split(".")
    best: tuple[Optional[str], float] = (None, 1.0)
    for path, scale in lr_scale.items():
        want = path.split(".")
        hit = any(parts[i : i + len(want)] == want for i in range(len(parts) - len(want) + 1))
        if hit and (best[0] is None or len(want) > len(best[0].split("."))):
            best = (path, scale)
    return best


def param_groups(module: nn.Module, weight_decay: float, lr_scale: Optional[Mapping[str, float]] = None) -> list[dict]:
    """AdamW groups over trainable parameters (frozen momentum twins are left out): decayed and
    not decayed, per ``train.lr_scale`` factor (each group's ``lr_scale``, applied by the schedule).
    A path that matches no trainable parameter is a config error."""
    lr_scale = lr_scale or {}
    groups: dict[tuple[float, bool], list[nn.Parameter]] = {}
    used: set[str] = set()
    for name, p in trainable(module):
        path, scale = lr_scale_of(name, lr_scale)
        if path is not None:
            used.add(path)
        groups.setdefault((scale, no_weight_decay(name, p)), []).append(p)
    unused = sorted(set(lr_scale) - used)
    if unused:
        raise ConfigError(
            f"config key 'train.lr_scale': {unused} match no trainable parameter of "
            f"{type(module).__name__} (paths are dotted parts of parameter names, e.g. 'vision', 'text')"
        )
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0]))  # decayed first, as before lr_scale
    return [
        {"params": ps, "weight_decay": 0.0 if nodecay else weight_decay, "lr_scale": scale}
        for (scale, nodecay), ps in ordered
    ]


def build_optimizer(module: nn.Module, cfg: TrainConfig, fused: bool = True) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`. ``fused``: torch's fused kernel (CUDA and CPU) where the
    parameters allow it - one kernel per step instead of a chain of foreach ops, and it skips a
    non-finite step on a device flag (``found_inf``) without a host synchronisation. Falls back to
    the foreach implementation where the fused one is unavailable."""
    groups = param_groups(module, cfg.weight_decay, cfg.lr_scale)
    if fused:
        try:
            return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), fused=True)
        except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
            pass
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up from ``warmup_lr`` to ``lr`` over ``warmup_steps``, then cosine to ``min_lr``
    at ``steps``."""
    if step < cfg.warmup_steps:
        return cfg.warmup_lr + (cfg.lr - cfg.warmup_lr) * step / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    t = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * t))
