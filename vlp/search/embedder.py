"""What turns images into index rows: the :class:`ImageEmbedder` protocol, and the one backed by a
vlp checkpoint (:class:`ModelEmbedder`, the image tower of a :class:`~vlp.api.VLPModel`).

Another image encoder (the exported ONNX graph of :mod:`vlp.search.onnx_embedder`, say) plugs into
``vlp index`` by offering the same three things; :func:`vlp.search.build.build_index` takes any of them. Its ``meta()`` should name
``checkpoint`` (the vlp checkpoint whose text tower queries the index, ``vlp search``'s default)
and ``embed_dim``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Protocol

import torch

from vlp.api import CONFIG, WEIGHTS, Preprocessor, VLPModel
from vlp.hardware import default_device
from vlp.interop.zoo import resolve_pretrained
from vlp.manifests import file_sha256
from vlp.weights import find_checkpoint


class ImageEmbedder(Protocol):
    """An image encoder of the index.

    ``preprocessor``: how files become pixels (the evaluation transform of
    :class:`~vlp.checkpoint.Preprocessor`: resize to ``image_size`` without crop, normalise; through
    :func:`vlp.api.inputs.image_tensor`, the one preprocessing path of vlp's inference)."""

    preprocessor: Preprocessor

    def embed_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, S, S] preprocessed images -> [B, E] float32 L2-normalised features on the CPU."""
        ...

    def meta(self) -> dict[str, Any]:
        """JSON-ready identity of the encoder (recorded in the index's ``meta.json`` as ``embedder``,
        and compared when an interrupted ``vlp index`` resumes): ``checkpoint``, ``embed_dim``, and
        whatever else tells its features apart (weights' hash, device)."""
        ...


def checkpoint_folder(name_or_path: str | os.PathLike) -> Path:
    """The folder a checkpoint argument loads from: a ``save_pretrained`` directory as it is, a
    checkpoint folder verified, a run directory's newest valid checkpoint (a zoo tag or Hub id
    resolved first, as :meth:`VLPModel.from_pretrained` does); a missing or corrupted one raises
    :class:`~vlp.errors.CheckpointError`."""
    path = resolve_pretrained(name_or_path)
    return path if (path / CONFIG).is_file() else find_checkpoint(path)


def weights_sha256(folder: Path) -> str:
    """SHA-256 of the checkpoint folder's weights file (already hashed when its manifest was
    verified: :func:`vlp.manifests.file_sha256` computes it once per file version)."""
    return file_sha256(folder / WEIGHTS)


class ModelEmbedder:
    """The image tower of a :class:`~vlp.api.VLPModel`: ``embed_images`` is its
    :meth:`~vlp.api.VLPModel.encode_image` on pixels (the ITC projection, L2-normalised).
    ``folder``: the checkpoint folder it was loaded from (recorded with its weights' SHA-256)."""

    def __init__(self, model: VLPModel, folder: Path) -> None:
        self.model, self.folder = model, folder
        self.preprocessor = model.preprocessor
        self.sha256 = weights_sha256(folder)

    @classmethod
    def load(
        cls, checkpoint: str | os.PathLike, device: Optional[str | torch.device] = None, batch_size: int = 64
    ) -> ModelEmbedder:
        """The model of ``checkpoint`` (:func:`checkpoint_folder`) on ``device`` (default CUDA if
        available, else CPU)."""
        folder = checkpoint_folder(checkpoint)
        target = torch.device(device) if device is not None else default_device()
        return cls(VLPModel.from_pretrained(folder, device=target, batch_size=batch_size), folder)

    @property
    def embed_dim(self) -> int:
        """E, the ITC feature width."""
        return int(self.model.model_config.embed_dim)

    @property
    def label(self) -> str:
        """How a message names this encoder."""
        return f"the checkpoint {self.folder}"

    def embed_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, S, S] -> [B, E] float32, L2-normalised, on the CPU (one batch)."""
        return self.model.encode_image(pixels, batch_size=len(pixels)).float()

    def meta(self) -> dict[str, Any]:
        """``embedder: vlp-model``, the checkpoint folder, its weights' SHA-256, step and kind, the
        model's class, ``embed_dim``, ``image_size`` and the device."""
        source = self.model.source or {}
        return {
            "embedder": "vlp-model",
            "checkpoint": str(self.folder.resolve()),
            "weights_sha256": self.sha256,
            "step": source.get("step"),
            "kind": self.model.kind,
            "architecture": type(self.model.model).__name__,
            "embed_dim": self.embed_dim,
            "image_size": self.preprocessor.image_size,
            "device": str(self.model.device),
        }
