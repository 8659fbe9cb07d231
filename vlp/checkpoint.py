"""Opening a vlp checkpoint, in one place: :func:`open_checkpoint`.

    from vlp.checkpoint import open_checkpoint
    ckpt = open_checkpoint("runs/x")                # newest valid checkpoint of a run, on the default device
    ckpt.kind, ckpt.step, ckpt.model, ckpt.tokenizer, ckpt.preprocessor

It finds the checkpoint (a checkpoint folder, or a run directory's newest valid ``checkpoints/step_*``:
:func:`vlp.weights.find_checkpoint`), verifies it against its manifest, reads ``state.json`` once,
and builds the model of the checkpoint's kind with its weights (one read of ``model.safetensors``)
and its tokenizer. Every command of :mod:`vlp.runs`, the fine-tuning job, :class:`vlp.api.VLPModel`
and the ALBEF exporter open checkpoints here. A zoo tag or a Hugging Face Hub id is resolved to a
folder first, by the caller (:func:`vlp.interop.zoo.resolve_pretrained`, a layer above this one;
``VLPModel.from_pretrained`` does it).

The image and text preprocessing (:class:`Preprocessor`) is read from the checkpoint's
``preprocessor.json``, which training writes into every checkpoint folder (as
``VLPModel.save_pretrained`` does into its directories); a checkpoint without one (older vlp, a
converted ALBEF file) gets it from its config, as the training run saved it (:func:`preprocessor_of`).

It imports no training or command code (:mod:`vlp.api` loads through it).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from PIL import Image
from torch import nn

from vlp.config import FinetuneConfig, ImageConfig, ModelConfig, PretrainConfig, from_dict
from vlp.errors import CheckpointError
from vlp.hardware import default_device
from vlp.kinds import KINDS, PRETRAIN, is_finetuned
from vlp.models.build import build_model_of_kind, model_image_size, without_init_sources
from vlp.preprocess.images import MIN_SIDE
from vlp.preprocess.transforms import load_tokenizer, test_transform, train_transform
from vlp.weights import KIND_KEY, find_checkpoint, load_weights, read_state

#: the preprocessing file of a checkpoint folder and of a ``save_pretrained`` directory
PREPROCESSOR = "preprocessor.json"

RunConfig = Union[PretrainConfig, FinetuneConfig]


@dataclass
class Preprocessor:
    """How inputs become model inputs (``preprocessor.json``): evaluation images are
    ``Resize((image_size, image_size), bicubic)`` without crop, then normalised with ``mean``/``std``
    (images whose shorter side is below ``min_side`` are first upscaled to it, as
    :func:`vlp.preprocess.images.open_image` does); texts are cleaned (``pre_caption``, or ALBEF's
    ``pre_question`` for VQA questions), tokenized, truncated at ``max_len`` tokens and padded to the
    longest text of a call. ``answer_max_len``: VQA candidate answers' token limit (VQA only)."""

    image_size: int
    mean: list[float]
    std: list[float]
    max_len: int
    resize: str = "bicubic, no crop"
    min_side: int = MIN_SIDE
    caption_cleaning: str = "pre_caption"
    padding: str = "longest"
    answer_max_len: Optional[int] = None

    def image_transform(self) -> Callable[[Image.Image], torch.Tensor]:
        """The evaluation transform (:func:`vlp.preprocess.transforms.test_transform`)."""
        return test_transform(self.image_size, ImageConfig(mean=list(self.mean), std=list(self.std)))

    def train_transform(self) -> Callable[[Image.Image], torch.Tensor]:
        """The training transform at this resolution and normalisation, with vlp's default
        augmentation (``data.image``'s defaults: ``RandomResizedCrop`` scale [0.2, 1], horizontal
        flip, RandAugment; :func:`vlp.preprocess.transforms.train_transform`): PIL image -> [3, S, S]."""
        return train_transform(self.image_size, ImageConfig(mean=list(self.mean), std=list(self.std)))

    def to_json(self) -> str:
        """The content of ``preprocessor.json``."""
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def read(cls, path: Path) -> Preprocessor:
        """A ``preprocessor.json`` file; a malformed one raises :class:`CheckpointError` naming it."""
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{path}: not a vlp preprocessor.json ({e})") from None


def preprocessor_of(kind: str, config: RunConfig, model: ModelConfig) -> Preprocessor:
    """The preprocessing a run of checkpoint kind ``kind`` trained with: ``model``'s resolution, the
    run's image mean/std, and the model's ``text.max_len`` (pretraining) or the fine-tuning run's
    ``data.max_len``; texts cleaned as the kind's entry says (:attr:`vlp.kinds.Kind.text_cleaning`:
    VQA questions with ``pre_question``), and the candidate answers of a kind that ranks them cut at
    ``vqa.answer_max_len``. What training writes as ``preprocessor.json`` and what an older
    checkpoint without that file is read with."""
    entry = KINDS.get(kind) if kind in KINDS else None
    ft = config if isinstance(config, FinetuneConfig) else None
    image = ft.data.image if ft is not None else config.data.image
    return Preprocessor(
        model_image_size(model),
        list(image.mean),
        list(image.std),
        ft.data.max_len if ft is not None else model.text.max_len,
        caption_cleaning=entry.text_cleaning if entry is not None else "pre_caption",
        answer_max_len=ft.vqa.answer_max_len
        if ft is not None and entry is not None and entry.candidate_answers
        else None,
    )


def image_size(cfg: PretrainConfig) -> int:
    """Input resolution of a run config's model."""
    return model_image_size(cfg.model)


def checkpoint_model_config(state: dict[str, Any]) -> ModelConfig:
    """The model config recorded in a checkpoint's ``state.json`` (fine-tuned checkpoints carry it
    under "model"; pretraining ones inside their "config")."""
    if "model" in state:
        return from_dict(ModelConfig, state["model"])
    return from_dict(PretrainConfig, state["config"]).model


@dataclass
class Checkpoint:
    """An opened checkpoint (:func:`open_checkpoint`).

    ``path``: the verified checkpoint folder (a run directory's newest valid one); ``kind``: its
    ``state.json`` "task" (one of :func:`vlp.kinds.checkpoint_kinds`), which model it is; ``state``: ``state.json`` as read (step, vlp version, ...);
    ``config``: the run's config (a :class:`PretrainConfig`, or the :class:`FinetuneConfig` of a
    fine-tuned kind); ``model_config``: the config the model is built from, every initialisation
    source off (the weights come from the file); ``pretrain_config``: the settings the commands
    evaluate with as a :class:`PretrainConfig`, overrides applied to it (the run's own config for a
    pretraining checkpoint; for a fine-tuned one, its model, ``eval`` and ``data.image`` settings);
    ``preprocessor``: the image and text preprocessing (``preprocessor.json``, or derived from the
    config); ``model`` (eval mode) and ``tokenizer``: set by :meth:`load`, None before."""

    path: Path
    kind: str
    state: dict[str, Any]
    config: RunConfig
    model_config: ModelConfig
    pretrain_config: PretrainConfig
    preprocessor: Preprocessor
    model: Optional[nn.Module] = None
    tokenizer: Any = None

    @property
    def step(self) -> Optional[int]:
        """The training step the checkpoint was saved at (None if it does not say)."""
        step = self.state.get("step")
        return None if step is None else int(step)

    def load(self, device: Optional[str | torch.device] = None) -> nn.Module:
        """The model of the checkpoint's kind with its weights (strict load, eval mode, on ``device``:
        default CUDA if available), built once (with the tokenizer); later calls return it."""
        if self.model is None:
            self.tokenizer = load_tokenizer(self.model_config.text)
            model = build_model_of_kind(self.kind, self.model_config, len(self.tokenizer))
            load_weights(model, self.path)
            model.eval()
            self.model = model.to(torch.device(device) if device is not None else default_device())
        return self.model


def open_checkpoint(
    path: str | os.PathLike, device: Optional[str | torch.device] = None, load: bool = True
) -> Checkpoint:
    """Find, verify and read the checkpoint folder or run directory ``path`` once (see the module
    docstring). ``load``: build the model with its weights and the tokenizer now (on ``device``);
    without it, ``model`` and ``tokenizer`` wait for :meth:`Checkpoint.load`, e.g. until the
    checkpoint's kind has been checked, or for a caller that moves the weights into another model
    (fine-tuning)."""
    ckpt = find_checkpoint(Path(path))
    state = read_state(ckpt)
    kind = str(state.get(KIND_KEY, PRETRAIN))
    config: RunConfig
    if is_finetuned(kind):
        config = from_dict(FinetuneConfig, state["config"])
        settings = PretrainConfig(model=checkpoint_model_config(state), eval=config.eval)
        settings.data.image = config.data.image
    else:
        config = settings = from_dict(PretrainConfig, state["config"])
    without_init_sources(settings.model)  # the checkpoint holds every weight: skip initial-weight loading
    saved = ckpt / PREPROCESSOR
    pre = Preprocessor.read(saved) if saved.is_file() else preprocessor_of(kind, config, settings.model)
    opened = Checkpoint(ckpt, kind, state, config, settings.model, settings, pre)
    if load:
        opened.load(device)
    return opened


def load_model(checkpoint: str | os.PathLike, device: Optional[str | torch.device] = None) -> tuple[Any, Any, Any]:
    """:func:`open_checkpoint` as the older ``(model, pretrain_config, tokenizer)`` triple (strict load);
    kept for callers of ``vlp.pretrained.load_model``, which it replaces."""
    ckpt = open_checkpoint(checkpoint, device)
    return ckpt.load(), ckpt.pretrain_config, ckpt.tokenizer
