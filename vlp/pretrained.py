"""The older names of the read side of a vlp checkpoint, kept for callers that import them:
:func:`load_model` is :func:`vlp.checkpoint.open_checkpoint` as ``(model, config, tokenizer)``.
vlp's own code opens checkpoints with :func:`vlp.checkpoint.open_checkpoint`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from vlp.checkpoint import checkpoint_model_config, image_size, open_checkpoint
from vlp.config import PretrainConfig

__all__ = ["checkpoint_model_config", "image_size", "load_model"]


def load_model(checkpoint: str | Path, device: Optional[torch.device] = None) -> tuple[nn.Module, PretrainConfig, Any]:
    """Model, config and tokenizer from a checkpoint folder or run directory (strict load): the
    ``model``, ``pretrain_config`` and ``tokenizer`` of :func:`vlp.checkpoint.open_checkpoint`."""
    ckpt = open_checkpoint(checkpoint, device)
    return ckpt.load(), ckpt.pretrain_config, ckpt.tokenizer
