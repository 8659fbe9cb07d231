"""Inference API: :class:`VLPModel` loads any vlp checkpoint (or a :meth:`VLPModel.save_pretrained`
directory) and encodes, scores and answers with it, batched and without gradients.

    from vlp import VLPModel
    m = VLPModel.from_pretrained("runs/x")
    m.similarity(["a.jpg"], ["a caption"])

The class holds what a user calls; the work is in the modules of this package, each a function
taking the :class:`VLPModel` first: :mod:`vlp.api.loading` (``from_pretrained`` /
``save_pretrained`` / ``push_to_hub``, the ``save_pretrained`` directory format),
:mod:`vlp.api.inputs` (the argument types and the evaluation preprocessing: :func:`pixel_values`,
:func:`tokenize`), :mod:`vlp.api.capability` (which kinds run which method), and one module per
task: :mod:`vlp.api.retrieval` (encode, similarity, ITM), :mod:`vlp.api.gradcam` (explain,
grounding maps, :func:`gradcam_layer`), :mod:`vlp.api.answer` (VQA) and :mod:`vlp.api.classify`
(NLVR2, SNLI-VE); :mod:`vlp.api.tokenizer` (open_clip's tokenizer: texts -> token ids).
"""

from __future__ import annotations

import os
from typing import Optional

import torch
from torch import nn

from vlp.api import answer as vqa
from vlp.api import classify, loading, retrieval
from vlp.api.capability import UnsupportedKind, checked_kind
from vlp.api.classify import VE_LABELS
from vlp.api.gradcam import Explanation, gradcam_layer, grounding_maps
from vlp.api.gradcam import explain as gradcam_explain
from vlp.api.inputs import ImageLike, Images, Texts, pixel_values, tokenize
from vlp.api.loading import (
    CONFIG,
    DROPPED,
    FORMAT,
    FORMAT_VERSION,
    WEIGHTS,
    build_inference_model,
    config_dict,
    inference_weights,
    load_inference_weights,
)
from vlp.api.tokenizer import Tokenizer
from vlp.checkpoint import PREPROCESSOR, Preprocessor
from vlp.config import ModelConfig
from vlp.hardware import default_device
from vlp.interop.zoo import resolve_pretrained

__all__ = [
    "CONFIG",
    "DROPPED",
    "FORMAT",
    "FORMAT_VERSION",
    "PREPROCESSOR",
    "VE_LABELS",
    "WEIGHTS",
    "Explanation",
    "ImageLike",
    "Images",
    "Preprocessor",
    "Texts",
    "Tokenizer",
    "UnsupportedKind",
    "VLPModel",
    "build_inference_model",
    "config_dict",
    "gradcam_layer",
    "grounding_maps",
    "inference_weights",
    "load_inference_weights",
    "pixel_values",
    "tokenize",
]


class VLPModel:
    """A loaded vlp model with its config, tokenizer and evaluation preprocessing.

    Methods take one or several images (paths, PIL images, or tensors [3, H, W] / [N, 3, H, W]
    already preprocessed like :func:`vlp.api.pixel_values`) and one or several strings
    (``encode_text`` / ``similarity``: or token ids [N, T], as :func:`vlp.get_tokenizer` gives them); they run
    under ``torch.no_grad()`` in eval mode (the model's modes restored after) in batches of
    ``batch_size`` and return CPU tensors. What a kind can do is its registry entry's
    ``capabilities`` (:data:`vlp.kinds.KINDS`, checked by :func:`vlp.api.capability.require`):
    ``encode_image`` / ``encode_text`` / ``similarity``: pretrain, helper, retrieval (ALBEF or dual
    encoder); ``itm_score`` and the Grad-CAM methods: the same kinds with an ALBEF fusion encoder;
    ``answer``: vqa; ``nlvr``: nlvr2; ``entailment``: ve. Anything else raises
    :class:`UnsupportedKind`. Each method is a function of a task module of :mod:`vlp.api` taking
    the VLPModel first (``VLPModel.answer is vlp.api.answer.answer``).

    Attributes: ``model`` (the ``nn.Module``), ``kind``, ``model_config``, ``tokenizer``,
    ``preprocessor`` (:class:`~vlp.checkpoint.Preprocessor`), ``transform`` (its evaluation image
    transform: PIL image -> [3, S, S]), ``answers`` / ``vqa_k_test`` (a VQA checkpoint's candidate
    answers and ``k``), ``source`` (where the weights came from), ``batch_size``, and ``device``:
    the device of the model's parameters when it was wrapped (``from_pretrained``'s ``device``),
    where inputs are sent.
    """

    def __init__(
        self,
        model: nn.Module,
        kind: str,
        model_config: ModelConfig,
        tokenizer,
        preprocessor: Preprocessor,
        answers: Optional[list[str]] = None,
        vqa_k_test: int = 128,
        source: Optional[dict] = None,
        batch_size: int = 64,
    ) -> None:
        self.model, self.kind, self.model_config = model.eval(), checked_kind(kind), model_config
        self.tokenizer, self.preprocessor = tokenizer, preprocessor
        self.answers, self.vqa_k_test, self.source = answers, vqa_k_test, source or {}
        self.batch_size = batch_size
        self.transform = preprocessor.image_transform()
        first = next(model.parameters(), None)
        self.device = first.device if first is not None else torch.device("cpu")

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        device: Optional[str | torch.device] = None,
        batch_size: int = 64,
        revision: Optional[str] = None,
    ) -> VLPModel:
        """Load a :meth:`save_pretrained` directory, a checkpoint folder or a run directory (its
        newest valid checkpoint), a zoo tag (:func:`vlp.list_pretrained`: downloaded and converted
        on first use, :func:`vlp.interop.zoo.fetch`) or a Hugging Face Hub id ``org/name`` (at
        ``revision``; through ``huggingface_hub``'s cache, offline with ``HF_HUB_OFFLINE=1``).
        ``device``: default CUDA if available, else CPU (:func:`vlp.api.loading.load`)."""
        path = resolve_pretrained(name_or_path, revision=revision)
        target = torch.device(device) if device is not None else default_device()
        return cls(*loading.load(path, target), batch_size=batch_size)

    #: write the inference directory (:func:`vlp.api.loading.save_pretrained`)
    save_pretrained = loading.save_pretrained
    #: upload it to the Hugging Face Hub (:func:`vlp.api.loading.push_to_hub`)
    push_to_hub = loading.push_to_hub

    #: ITC features [N, D] and cosines [N_img, N_txt]; ITM probability [N] (:mod:`vlp.api.retrieval`)
    encode_image = retrieval.encode_image
    encode_text = retrieval.encode_text
    similarity = retrieval.similarity
    itm_score = retrieval.itm_score

    #: Grad-CAM: per-token maps of one pair (:mod:`vlp.api.gradcam`; the batched token-mean maps
    #: [N, h, w] of many pairs: the function :func:`vlp.api.grounding_maps`)
    explain = gradcam_explain

    #: VQA answers, NLVR2 probabilities, SNLI-VE probabilities (:mod:`vlp.api.answer`, :mod:`vlp.api.classify`)
    answer = vqa.answer
    nlvr = classify.nlvr
    entailment = classify.entailment

    def eval(self) -> VLPModel:
        """The wrapped ``model`` in eval mode (``nn.Module.eval``); this VLPModel, as open_clip's
        ``model.eval()`` returns the model. The methods above run in eval mode whatever the mode."""
        self.model.eval()
        return self

    def __repr__(self) -> str:
        return (
            f"VLPModel(kind={self.kind!r}, model={type(self.model).__name__}, image_size="
            f"{self.preprocessor.image_size}, device={self.device})"
        )
