"""The entry points open_clip and timm users reach for first: :func:`list_models` (the model
presets), :func:`create_model_and_transforms` (``(model, preprocess_train, preprocess_val)``, as
open_clip returns them) and :func:`get_tokenizer` (texts -> token ids).

A preset (:mod:`vlp.config.presets`, the one registry) names an architecture, as open_clip's model
names do: without ``pretrained`` the model is randomly initialised (no download) and its image
transform is the preset's preprocessing (:func:`preset_preprocessor`). Trained weights come from
``pretrained`` (a run, a checkpoint, a ``save_pretrained`` folder, a zoo tag of
:func:`vlp.list_pretrained` or a Hub id, ``hf-hub:org/name``), or from a ``name_or_path`` that is
one of those itself.

Which a name is: a model preset is that preset (a folder of its name is not looked at);
``hf-hub:org/name`` is always the Hugging Face Hub; otherwise an existing path is that path, even
when it also reads as a zoo tag or a Hub id ``org/name``; then a zoo tag; then a Hub id
(:func:`vlp.interop.zoo.resolve_pretrained`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

import torch
from PIL import Image
from torchvision import transforms as T

from vlp.api import Tokenizer, VLPModel, build_inference_model
from vlp.api.loading import load_text_side
from vlp.checkpoint import Preprocessor
from vlp.config import PRESETS, ModelConfig, preset_model_config
from vlp.config.model import architecture_differences
from vlp.config.presets import list_presets
from vlp.errors import ConfigError
from vlp.hardware import default_device
from vlp.interop.zoo import resolve_pretrained
from vlp.kinds import PRETRAIN
from vlp.models.build import model_image_size
from vlp.preprocess.images import to_rgb
from vlp.preprocess.transforms import load_tokenizer

#: an image transform: PIL image -> normalised [3, S, S]
ImageTransform = Callable[[Image.Image], torch.Tensor]


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
) -> tuple[VLPModel, ImageTransform, ImageTransform]:
    """``(model, preprocess_train, preprocess_val)`` as open_clip returns them: the
    :class:`~vlp.VLPModel` (its ``nn.Module`` in eval mode on ``device``, default CUDA if
    available), the training transform and the evaluation transform (each: PIL image of any mode ->
    normalised RGB ``[3, S, S]``). The text side: :func:`get_tokenizer` (or the model's own strings).

    ``name_or_path``: a preset of :func:`list_models` (randomly initialised unless ``pretrained``),
    or anything :meth:`vlp.VLPModel.from_pretrained` loads (a zoo tag, a path, ``hf-hub:org/name``
    or ``org/name``). ``pretrained``: weights for the preset, from anything ``from_pretrained`` loads
    (the pairs of :func:`vlp.list_pretrained`); its architecture must be the preset's. The transforms
    are the weights' (:class:`~vlp.checkpoint.Preprocessor`: ``train_transform`` and
    ``image_transform``), else the preset's (:func:`preset_preprocessor`)."""
    name = os.fspath(name_or_path)
    if not _is_architecture(name) or pretrained is not None:
        loaded = VLPModel.from_pretrained(pretrained if pretrained is not None else name, device=device)
        if _is_architecture(name):
            _check_same_architecture(name, loaded.model_config)
        return (loaded, *_rgb_transforms(loaded.preprocessor))
    cfg, pre = model_config(name), preset_preprocessor(name)
    tokenizer = load_tokenizer(cfg.text)
    model = build_inference_model(PRETRAIN, cfg, len(tokenizer))
    target = torch.device(device) if device is not None else default_device()
    vm = VLPModel(model.to(target), PRETRAIN, cfg, tokenizer, pre, source={"preset": name})
    return (vm, *_rgb_transforms(pre))


def get_tokenizer(name_or_path: str | os.PathLike) -> Tokenizer:
    """open_clip's ``get_tokenizer``: a callable ``texts -> LongTensor [N, max_len]`` of token ids
    (:class:`vlp.api.Tokenizer`: texts cleaned as the model was trained, padded to its text length)
    that ``model.encode_text`` takes. ``name_or_path``: what :func:`create_model_and_transforms`
    takes; a preset or a zoo tag is read from the registry (no download), anything else
    (a path, ``hf-hub:org/name``, ``org/name``) without building its model."""
    name = os.fspath(name_or_path)
    if _is_architecture(name) or (name in PRESETS and not Path(name).exists()):
        return Tokenizer(load_tokenizer(model_config(name).text), preset_preprocessor(name))
    return Tokenizer(*load_text_side(resolve_pretrained(name)))


def _rgb_transforms(pre: Preprocessor) -> tuple[ImageTransform, ImageTransform]:
    """(training, evaluation) transforms of ``pre``, each taking a PIL image of any mode (converted
    to RGB first, as vlp's loaders do: :func:`vlp.preprocess.images.to_rgb`)."""
    return T.Compose([to_rgb, pre.train_transform()]), T.Compose([to_rgb, pre.image_transform()])


def _check_same_architecture(name: str, got: ModelConfig) -> None:
    """``pretrained`` weights for preset ``name`` must have its architecture (arch and tower sizes)."""
    wrong = architecture_differences(model_config(name), got)
    if wrong:
        raise ConfigError(f"pretrained weights are not a {name} model: {'; '.join(wrong)}")
