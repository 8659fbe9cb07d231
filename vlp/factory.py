"""The entry points open_clip and timm users reach for first: :func:`list_models` (the model
presets) and :func:`create_model_and_transforms` (a model, its image transform and its tokenizer).

A preset names an architecture, as open_clip's model names do: without ``pretrained`` the model is
randomly initialised (no download). Trained weights come from ``pretrained`` (a run, a checkpoint, a
``save_pretrained`` folder, a zoo tag of :func:`vlp.list_pretrained` or a Hub id), or from a
``name_or_path`` that is one of those itself.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Callable, Optional

import torch
from torch import nn

from vlp.api import VLPModel, build_inference_model
from vlp.config import ImageConfig, ModelConfig, from_dict, to_dict
from vlp.errors import ConfigError
from vlp.hardware import default_device
from vlp.models.build import model_image_size
from vlp.preprocess.transforms import load_tokenizer, test_transform

#: preset name -> the ``model`` config section it stands for (unset fields: the towers' presets)
MODELS: dict[str, dict[str, Any]] = {
    # the demo's: ViT 4 layers at 64 px, BERT 2 + 2 layers of width 192
    "albef-tiny": {"vision": {"preset": "tiny"}, "text": {"preset": "tiny"}},
    # ViT-S/16 at 224 px, MiniLM-sized text 3 + 3 layers
    "albef-small": {"vision": {"preset": "small"}, "text": {"preset": "small"}},
    # ALBEF's: ViT-B/16 at 256 px, BERT-base 6 + 6 layers
    "albef-base": {"vision": {"preset": "base"}, "text": {"preset": "base"}},
    # the resource-constrained dual encoder: ResNet-18 and a bi-GRU (docs/methods.md)
    "dual-resnet18": {"arch": "dual"},
}


def list_models() -> list[str]:
    """The model presets :func:`create_model_and_transforms` builds (the zoo's trained models:
    :func:`vlp.list_pretrained`)."""
    return sorted(MODELS)


def model_config(name: str) -> ModelConfig:
    """The :class:`~vlp.config.ModelConfig` of preset ``name``."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; vlp.list_models() has {list_models()}")
    return from_dict(ModelConfig, copy.deepcopy(MODELS[name]))


def create_model_and_transforms(
    name_or_path: str | os.PathLike,
    pretrained: Optional[str | os.PathLike] = None,
    device: Optional[str | torch.device] = None,
) -> tuple[nn.Module, Callable[[Any], torch.Tensor], Any]:
    """``(model, image transform, tokenizer)``, the model in eval mode on ``device`` (default: CUDA
    if available).

    ``name_or_path``: a preset of :func:`list_models` (randomly initialised unless ``pretrained``),
    or anything :meth:`vlp.VLPModel.from_pretrained` loads. ``pretrained``: weights for the preset,
    from anything ``from_pretrained`` loads; its architecture must be the preset's. The transform
    is the evaluation one (PIL image -> normalised ``[3, S, S]`` tensor), the tokenizer a BERT
    WordPiece one (:meth:`vlp.VLPModel.tokenize` pads and truncates as the model was trained)."""
    name = os.fspath(name_or_path)
    if name not in MODELS or pretrained is not None:
        loaded = VLPModel.from_pretrained(pretrained if pretrained is not None else name, device=device)
        if name in MODELS:
            _check_same_architecture(name, loaded.model_config)
        return loaded.model, loaded.transform, loaded.tokenizer
    cfg = model_config(name)
    tokenizer = load_tokenizer(cfg.text)
    model = build_inference_model("pretrain", cfg, len(tokenizer))
    transform = test_transform(model_image_size(cfg), ImageConfig())
    target = torch.device(device) if device is not None else default_device()
    return model.to(target).eval(), transform, tokenizer


def _check_same_architecture(name: str, got: ModelConfig) -> None:
    """``pretrained`` weights for preset ``name`` must have its architecture (arch and tower sizes)."""
    want = model_config(name)
    keys = ("arch", "vision.preset", "text.preset") if want.arch == "albef" else ("arch",)
    a, b = to_dict(want), to_dict(got)

    def at(d: dict, key: str) -> Any:
        for part in key.split("."):
            d = d[part]
        return d

    wrong = [f"{k}: {at(b, k)!r} (the preset has {at(a, k)!r})" for k in keys if at(a, k) != at(b, k)]
    if wrong:
        raise ConfigError(f"pretrained weights are not a {name} model: {'; '.join(wrong)}")
