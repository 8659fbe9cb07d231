"""A model, its config and tokenizer from a checkpoint (the read side of a vlp checkpoint).

Shared by the commands (:mod:`vlp.runs`), the inference API (:mod:`vlp.api`) and the ALBEF
converter (:mod:`vlp.interop.albef`); it imports no training or command code. The model itself is
built by :func:`vlp.models.build.build_task_model`; this module adds the tokenizer
(:mod:`vlp.data.transforms`), which ``vlp.models`` must not import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from vlp.config import ModelConfig, PretrainConfig, from_dict
from vlp.data.transforms import load_tokenizer
from vlp.hardware import default_device
from vlp.models.build import build_task_model, model_image_size, without_init_sources
from vlp.weights import find_checkpoint, load_weights, read_state


def image_size(cfg: PretrainConfig) -> int:
    """Input resolution of a run config's model."""
    return model_image_size(cfg.model)


def checkpoint_model_config(state: dict) -> ModelConfig:
    """The model config recorded in a checkpoint's ``state.json`` (fine-tuned checkpoints carry it
    under "model"; pretraining ones inside their "config")."""
    if "model" in state:
        return from_dict(ModelConfig, state["model"])
    return from_dict(PretrainConfig, state["config"]).model


def load_model(checkpoint: str | Path, device: Optional[torch.device] = None):
    """Model, config and tokenizer from a checkpoint folder or run directory (strict load). The
    model is the checkpoint's kind (pretraining ALBEF, dual encoder, retrieval, VQA, NLVR2); the
    config is a :class:`PretrainConfig` (a fine-tuned checkpoint's model, image and eval settings)."""
    from vlp.config import FINETUNE_TASKS, FinetuneConfig

    ckpt = find_checkpoint(checkpoint)
    state = read_state(ckpt)
    kind = state.get("task", "pretrain")
    if kind in FINETUNE_TASKS:
        ft = from_dict(FinetuneConfig, state["config"])
        cfg = PretrainConfig(model=checkpoint_model_config(state), eval=ft.eval)
        cfg.data.image = ft.data.image
    else:
        cfg = from_dict(PretrainConfig, state["config"])
    without_init_sources(cfg.model)  # the checkpoint holds every weight: skip initial-weight loading
    tokenizer = load_tokenizer(cfg.model.text)
    model = build_task_model(kind, cfg.model, len(tokenizer))
    load_weights(model, ckpt)
    model.eval()
    return model.to(device or default_device()), cfg, tokenizer
