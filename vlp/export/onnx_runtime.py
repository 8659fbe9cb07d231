"""The exported towers run by onnxruntime: :class:`OnnxEncoders` opens a ``vlp export onnx`` folder
(``image_encoder.onnx``, ``text_encoder.onnx``, ``export.json``, ``tokenizer/``) and embeds pixels
and token ids as the PyTorch model's ``encode_image`` / ``encode_text`` do, with no torch.

The folder's file names, the graphs' input and output names and the format marker of
``export.json`` are the constants of this module; :mod:`vlp.export.onnx` writes the folder. This
module imports numpy alone at the top: onnxruntime when a folder is opened, and the tokenizer's
packages (transformers, torch) only in :meth:`OnnxEncoders.tokenizer`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from vlp.errors import CheckpointError, ConfigError

#: the files of an export folder
IMAGE_FILE, TEXT_FILE, EXPORT_JSON, TOKENIZER_DIR = (
    "image_encoder.onnx",
    "text_encoder.onnx",
    "export.json",
    "tokenizer",
)
#: the graphs' inputs and outputs
PIXEL_VALUES, IMAGE_EMBEDS = "pixel_values", "image_embeds"
INPUT_IDS, ATTENTION_MASK, TEXT_EMBEDS = "input_ids", "attention_mask", "text_embeds"
#: ``export.json``'s ``format`` and the newest ``format_version`` this vlp reads
FORMAT, FORMAT_VERSION = "vlp-onnx", 1
#: what ``pip install`` brings the export and :class:`OnnxEncoders`
EXTRA_HINT = "pip install 'vlp[export]'"
CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"


def require_onnxruntime() -> Any:
    """The ``onnxruntime`` module; a :class:`~vlp.errors.ConfigError` naming the extra when it is
    not installed."""
    try:
        import onnxruntime
    except ImportError:
        raise ConfigError(f"running an ONNX export needs the onnxruntime package: {EXTRA_HINT}") from None
    return onnxruntime


def read_export_json(folder: Path) -> dict[str, Any]:
    """``folder/export.json``, checked to be a vlp ONNX export this vlp reads; else
    :class:`~vlp.errors.CheckpointError` naming the file."""
    path = folder / EXPORT_JSON
    if not path.is_file():
        raise CheckpointError(f"{folder}: not a vlp ONNX export (no {EXPORT_JSON}; write one with vlp export onnx)")
    try:
        meta = json.loads(path.read_text())
    except ValueError as e:
        raise CheckpointError(f"{path}: not JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise CheckpointError(f"{path}: not a vlp ONNX export (format {got!r}, expected {FORMAT!r})")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format version {meta['format_version']} is newer than this vlp reads; upgrade vlp"
        )
    return meta


def providers_for(device: str, available: Sequence[str]) -> list[str]:
    """onnxruntime's execution providers for ``device``: ``cpu`` -> CPU; ``cuda`` -> CUDA then CPU
    when ``available`` has CUDA (the onnxruntime-gpu package), else CPU with a warning."""
    if device == "cpu":
        return [CPU]
    if device != "cuda":
        raise ConfigError(f"device {device!r}: expected 'cpu' or 'cuda'")
    if CUDA in available:
        return [CUDA, CPU]
    warnings.warn(
        f"{CUDA} is not available in this onnxruntime (install onnxruntime-gpu); running on the CPU", stacklevel=3
    )
    return [CPU]


def _array(x: Any, dtype: type) -> np.ndarray:
    """``x`` (a numpy array, a torch tensor on any device, or nested lists) as a C-contiguous numpy
    array of ``dtype``."""
    if hasattr(x, "detach"):  # a torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x), dtype=dtype)


class OnnxEncoders:
    """The two towers of a ``vlp export onnx`` folder, run by onnxruntime.

    ``OnnxEncoders(folder, device="cpu", providers=None, threads=None)``: ``device`` ``cuda`` uses
    onnxruntime's CUDA provider where it is available (else the CPU, with a warning); ``providers``
    (a list of onnxruntime provider names) overrides ``device``; ``threads``: onnxruntime's
    intra-op threads (default: its own choice, every core). Attributes: ``folder``, ``meta`` (the
    ``export.json`` content), ``embed_dim`` (E), ``image_size`` (S), ``pad_id``, ``providers`` (the
    providers the sessions run on). A folder that is not an export, or a newer format, raises
    :class:`~vlp.errors.CheckpointError`; without onnxruntime, :class:`~vlp.errors.ConfigError`."""

    def __init__(
        self,
        folder: str | Path,
        device: str = "cpu",
        providers: Optional[Sequence[str]] = None,
        threads: Optional[int] = None,
    ) -> None:
        ort = require_onnxruntime()
        self.folder = Path(folder)
        self.meta = read_export_json(self.folder)
        chosen = list(providers) if providers is not None else providers_for(device, ort.get_available_providers())
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = options.inter_op_num_threads = threads
        self._image = ort.InferenceSession(str(self.folder / IMAGE_FILE), options, providers=chosen)
        self._text = ort.InferenceSession(str(self.folder / TEXT_FILE), options, providers=chosen)
        self.providers: list[str] = self._image.get_providers()
        self.embed_dim: int = self.meta["embed_dim"]
        self.image_size: int = self.meta["preprocessing"]["image_size"]
        self.pad_id: int = self.meta["tokenizer"]["pad_id"]

    def embed_images(self, pixels: Any, batch_size: Optional[int] = None) -> np.ndarray:
        """Image embeddings float32 [B, E], L2-normalised, of preprocessed pixels [B, 3, S, S] (numpy
        or torch; the model's evaluation transform, :meth:`preprocessing`), ``batch_size`` at a time
        (default: all at once)."""
        x = _array(pixels, np.float32)
        if x.ndim != 4 or x.shape[1:] != (3, self.image_size, self.image_size):
            s = self.image_size
            raise ValueError(f"pixels: expected [B, 3, {s}, {s}] (this export's image size), got {list(x.shape)}")
        return self._batched(self._image, {PIXEL_VALUES: x}, batch_size)

    def embed_texts(self, input_ids: Any, attention_mask: Any = None, batch_size: Optional[int] = None) -> np.ndarray:
        """Text embeddings float32 [N, E], L2-normalised, of token ids [N, T] (numpy or torch, as
        :meth:`tokenizer` or ``vlp.get_tokenizer`` gives them) and their ``attention_mask`` [N, T]
        (1 = token; default: the ids that are not the pad id, as ``VLPModel.encode_text`` takes
        ids), ``batch_size`` rows at a time (default: all at once)."""
        ids = _array(input_ids, np.int64)
        ids = ids[None] if ids.ndim == 1 else ids
        mask = (ids != self.pad_id).astype(np.int64) if attention_mask is None else _array(attention_mask, np.int64)
        mask = mask[None] if mask.ndim == 1 else mask
        if ids.ndim != 2 or mask.shape != ids.shape:
            raise ValueError(f"input_ids {list(ids.shape)} and attention_mask {list(mask.shape)}: expected both [N, T]")
        return self._batched(self._text, {INPUT_IDS: ids, ATTENTION_MASK: mask}, batch_size)

    @staticmethod
    def _batched(session: Any, feeds: dict[str, np.ndarray], batch_size: Optional[int]) -> np.ndarray:
        """``session``'s one output over ``feeds`` (arrays of one length), ``batch_size`` rows a run."""
        n = len(next(iter(feeds.values())))
        step = batch_size or max(n, 1)
        runs = [session.run(None, {k: v[s : s + step] for k, v in feeds.items()})[0] for s in range(0, n, step)]
        return np.concatenate(runs) if runs else np.zeros((0, session.get_outputs()[0].shape[1]), np.float32)

    def preprocessing(self) -> dict[str, Any]:
        """What the export recorded of the model's preprocessing (its ``preprocessor.json``):
        ``image_size``, ``mean``, ``std``, ``resize``, ``min_side``, ``caption_cleaning``, ``max_len``,
        ``padding``, ``answer_max_len``. ``vlp.checkpoint.Preprocessor(**enc.preprocessing())`` gives
        the evaluation image transform (``image_transform()``: PIL image -> [3, S, S])."""
        return dict(self.meta["preprocessing"])

    def tokenizer(self) -> Any:
        """The model's tokenizer as :func:`vlp.get_tokenizer` gives it (:class:`vlp.api.Tokenizer`:
        texts -> token ids [N, max_len], cleaned as the model was trained), read from the folder's
        ``tokenizer/`` (imports transformers and torch)."""
        from transformers import BertTokenizerFast  # type: ignore[attr-defined]

        from vlp.api.tokenizer import Tokenizer
        from vlp.checkpoint import Preprocessor
        from vlp.preprocess.transforms import ALBEF_COMPAT_ATTR

        hf = BertTokenizerFast.from_pretrained(str(self.folder / TOKENIZER_DIR))
        setattr(hf, ALBEF_COMPAT_ATTR, bool(self.meta["tokenizer"]["albef_compat"]))
        return Tokenizer(hf, Preprocessor(**self.meta["preprocessing"]))

    def __repr__(self) -> str:
        return f"OnnxEncoders({str(self.folder)!r}, embed_dim={self.embed_dim}, providers={self.providers})"
