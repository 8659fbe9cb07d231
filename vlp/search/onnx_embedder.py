"""The image tower of a ``vlp export onnx`` folder as an index's encoder: :class:`OnnxEmbedder`
(``vlp index DIR --onnx EXPORT``), an :class:`~vlp.search.embedder.ImageEmbedder` run by onnxruntime
(:class:`~vlp.export.OnnxEncoders`), whose text tower also encodes ``vlp search``'s text queries.

onnxruntime is imported when an export is opened: without the ``export`` extra, one
:class:`~vlp.errors.ConfigError` naming it (:func:`~vlp.export.onnx_runtime.require_onnxruntime`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch

from vlp.checkpoint import Preprocessor
from vlp.export.onnx_runtime import CUDA, IMAGE_FILE, OnnxEncoders, require_onnxruntime
from vlp.manifests import file_sha256

#: the ``embedder`` of an :class:`OnnxEmbedder`'s :meth:`~OnnxEmbedder.meta`
ONNX = "onnx"


class OnnxEmbedder:
    """The towers of an export folder under onnxruntime: ``embed_images`` is its
    ``image_encoder.onnx`` on pixels preprocessed as ``export.json``'s ``preprocessing`` says (the
    model's evaluation transform), ``encode_text`` its ``text_encoder.onnx`` on the texts tokenized
    by its ``tokenizer/``. ``encoders``: the :class:`~vlp.export.OnnxEncoders`; ``device``: ``cpu``
    or ``cuda``, the provider it runs on."""

    def __init__(self, encoders: OnnxEncoders) -> None:
        self.encoders, self.folder = encoders, encoders.folder
        self.preprocessor = Preprocessor(**encoders.preprocessing())
        self.sha256 = file_sha256(self.folder / IMAGE_FILE)
        self.device = "cuda" if encoders.providers[0] == CUDA else "cpu"
        self._tokenizer: Any = None

    @classmethod
    def load(cls, folder: str | os.PathLike, device: Optional[str] = None) -> OnnxEmbedder:
        """The export ``folder`` on ``device`` (``cpu`` or ``cuda``; default ``cuda`` when the installed
        onnxruntime has its CUDA provider, else ``cpu``). A folder that is no export raises
        :class:`~vlp.errors.CheckpointError`; a missing onnxruntime or another device,
        :class:`~vlp.errors.ConfigError`."""
        if device is None:
            device = "cuda" if CUDA in require_onnxruntime().get_available_providers() else "cpu"
        return cls(OnnxEncoders(Path(folder), device))

    @property
    def embed_dim(self) -> int:
        """E, the ITC feature width."""
        return self.encoders.embed_dim

    @property
    def label(self) -> str:
        """How a message names this encoder."""
        return f"the ONNX export {self.folder}"

    def embed_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, S, S] -> [B, E] float32, L2-normalised, on the CPU (one onnxruntime run)."""
        return torch.from_numpy(self.encoders.embed_images(pixels))

    def encode_text(self, texts: list[str]) -> torch.Tensor:
        """N texts -> [N, E] float32, L2-normalised: tokenized as ``vlp.get_tokenizer`` tokenizes
        them (the export's ``tokenizer/``), then ``text_encoder.onnx``."""
        if self._tokenizer is None:
            self._tokenizer = self.encoders.tokenizer()
        return torch.from_numpy(self.encoders.embed_texts(self._tokenizer(texts)))

    def meta(self) -> dict[str, Any]:
        """``embedder: onnx``, the export folder, its ``image_encoder.onnx``'s SHA-256, the
        checkpoint it was exported from and its step (``export.json``'s ``source``; None when it has
        none), the model's kind and class, ``embed_dim``, ``image_size``, the device and
        onnxruntime's providers. ``checkpoint`` is None: no PyTorch checkpoint queries the index by
        default (``vlp search`` uses this export's text tower)."""
        source, export = self.encoders.meta.get("source") or {}, self.encoders.meta
        return {
            "embedder": ONNX,
            "checkpoint": None,
            "export": str(self.folder.resolve()),
            "image_encoder_sha256": self.sha256,
            "exported_from": source.get("checkpoint"),
            "step": source.get("step"),
            "kind": export.get("kind"),
            "architecture": export.get("architecture"),
            "embed_dim": self.embed_dim,
            "image_size": self.preprocessor.image_size,
            "device": self.device,
            "providers": list(self.encoders.providers),
        }


def export_of(index_meta: dict[str, Any]) -> Optional[Path]:
    """The export folder an index was built with (its ``meta.json``'s ``embedder``), None for an index
    of another encoder."""
    embedder = index_meta.get("embedder") or {}
    return Path(embedder["export"]) if embedder.get("embedder") == ONNX and embedder.get("export") else None
