"""The entry points open_clip and timm users reach for first: :func:`list_models` (the model
presets) and :func:`create_model_and_transforms` (a model, its image transform and its tokenizer).

A preset (:mod:`vlp.config.presets`, the one registry) names an architecture, as open_clip's model
names do: without ``pretrained`` the model is randomly initialised (no download) and its image
transform is the preset's preprocessing (:func:`preset_preprocessor`). Trained weights come from
``pretrained`` (a run, a checkpoint, a ``save_pretrained`` folder, a zoo tag of
:func:`vlp.list_pretrained` or a Hub id), or from a ``name_or_path`` that is one of those itself.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import torch
from torch import nn

from vlp.api import VLPModel, build_inference_model
from vlp.checkpoint import Preprocessor
from vlp.config import PRESETS, ModelConfig, preset_model_config, to_dict
from vlp.config.model import ARCH_ALBEF
from vlp.config.presets import list_presets
from vlp.errors import ConfigError
from vlp.hardware import default_device
from vlp.kinds import PRETRAIN
from vlp.models.build import model_image_size
from vlp.preprocess.transforms import load_tokenizer


def list_models() -> list[str]:
    """The model presets :func:`create_model_and_transforms` builds, sorted: the registry's presets
    without released weights (:mod:`vlp.config.presets`; those with weights, the zoo's trained
    models: :func:`vlp.list_pretrained`)."""
    return sorted(p.name for p in list_presets(released=False))


def model_config(name: str) -> ModelConfig:
    """The :class:`~vlp.config.ModelConfig` of preset ``name`` (a fresh copy)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown model {name!r}; vlp.list_models() has {list_models()}")
    return preset_model_config(name)


def preset_preprocessor(name: str) -> Preprocessor:
    """How preset ``name``'s inputs are prepared, as a checkpoint's ``preprocessor.json`` says it: its
    architecture's resolution, its preprocessing's mean/std, text length (else the architecture's
    ``text.max_len``) and cleaning."""
    cfg, pre = model_config(name), PRESETS.get(name).preprocessing
    return Preprocessor(
        model_image_size(cfg),
        list(pre.mean),
        list(pre.std),
        pre.max_len if pre.max_len is not None else cfg.text.max_len,
        caption_cleaning=pre.caption_cleaning,
        answer_max_len=pre.answer_max_len,
    )


def _is_architecture(name: str) -> bool:
    """Whether ``name`` is a preset without released weights (built randomly initialised)."""
    return name in PRESETS and PRESETS.get(name).weights is None


def create_model_and_transforms(
    name_or_path: str | os.PathLike,
    pretrained: Optional[str | os.PathLike] = None,
    device: Optional[str | torch.device] = None,
) -> tuple[nn.Module, Callable[[Any], torch.Tensor], Any]:
    """``(model, image transform, tokenizer)``, the model in eval mode on ``device`` (default: CUDA
    if available).

    ``name_or_path``: a preset of :func:`list_models` (randomly initialised unless ``pretrained``;
    the transform its preprocessing's), or anything :meth:`vlp.VLPModel.from_pretrained` loads.
    ``pretrained``: weights for the preset, from anything ``from_pretrained`` loads; its
    architecture must be the preset's. The transform is the evaluation one (PIL image ->
    normalised ``[3, S, S]`` tensor), the tokenizer a BERT WordPiece one (:meth:`vlp.VLPModel.tokenize` pads and truncates as the model was trained)."""
    name = os.fspath(name_or_path)
    if not _is_architecture(name) or pretrained is not None:
        loaded = VLPModel.from_pretrained(pretrained if pretrained is not None else name, device=device)
        if _is_architecture(name):
            _check_same_architecture(name, loaded.model_config)
        return loaded.model, loaded.transform, loaded.tokenizer
    cfg = model_config(name)
    tokenizer = load_tokenizer(cfg.text)
    model = build_inference_model(PRETRAIN, cfg, len(tokenizer))
    transform = preset_preprocessor(name).image_transform()
    target = torch.device(device) if device is not None else default_device()
    return model.to(target).eval(), transform, tokenizer


def _check_same_architecture(name: str, got: ModelConfig) -> None:
    """``pretrained`` weights for preset ``name`` must have its architecture (arch and tower sizes)."""
    want = model_config(name)
    keys = ("arch", "vision.preset", "text.preset") if want.arch == ARCH_ALBEF else ("arch",)
    a, b = to_dict(want), to_dict(got)

    def at(d: dict, key: str) -> Any:
        for part in key.split("."):
            d = d[part]
        return d

    wrong = [f"{k}: {at(b, k)!r} (the preset has {at(a, k)!r})" for k in keys if at(a, k) != at(b, k)]
    if wrong:
        raise ConfigError(f"pretrained weights are not a {name} model: {'; '.join(wrong)}")
