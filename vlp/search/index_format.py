"""The photo index as stored (``vlp index`` writes it, ``vlp search`` reads it): one folder of three
files, read memory-mapped so that an index of a million images costs its rows on disk, not in RAM.

- ``features.npy``: float32 [N, E], row i the L2-normalised ITC image feature of image i (what
  :meth:`vlp.api.VLPModel.encode_image` returns), read with ``np.load(mmap_mode="r")``;
- ``paths.json``: the N image paths relative to the indexed folder (``root`` in the meta), in the
  order of the rows (sorted);
- ``meta.json``: ``format`` (:data:`FORMAT`), ``format_version`` (:data:`FORMAT_VERSION`),
  ``vlp_version``, ``root`` (the indexed folder, absolute), ``count`` (N), ``embed_dim`` (E),
  ``dtype``, ``checkpoint`` (the checkpoint whose text tower queries it: ``vlp search``'s default),
  ``embedder`` (the image encoder's :meth:`~vlp.search.embedder.ImageEmbedder.meta`: checkpoint
  path, its weights' SHA-256, step, kind, architecture, ...), ``options`` (batch size, chunk size,
  device), ``files`` (image files found), ``ignored`` (other files), ``skipped`` (``[{path,
  reason}]``: the files that could not be read, each reason worded as ``vlp data check`` words a
  bad image).

The folder appears whole or not at all: it is assembled in ``OUT.partial/index`` and renamed into
place (:mod:`vlp.search.build`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vlp.errors import DataError

FORMAT = "vlp-image-index"
FORMAT_VERSION = 1
FEATURES = "features.npy"
PATHS = "paths.json"
META = "meta.json"
#: the dtype of ``features.npy``
DTYPE = "float32"


@dataclass
class ImageIndex:
    """An opened index: ``folder``, ``meta`` (``meta.json``), ``features`` (a read-only
    ``np.memmap`` [N, E] float32 of ``features.npy``, nothing read until rows are used) and
    ``paths`` (N paths relative to ``root``)."""

    folder: Path
    meta: dict[str, Any]
    features: np.ndarray
    paths: list[str]

    @property
    def root(self) -> str:
        """The indexed folder (absolute)."""
        return str(self.meta["root"])

    @property
    def embed_dim(self) -> int:
        """E, the feature width."""
        return int(self.features.shape[1])

    def __len__(self) -> int:
        return len(self.paths)

    def file(self, row: int) -> str:
        """The image file of row ``row``: ``root`` joined with its relative path."""
        return os.path.join(self.root, self.paths[row])


def open_index(path: str | os.PathLike) -> ImageIndex:
    """The index folder ``path`` (features memory-mapped). A missing folder, a folder that is no
    index, an index of another format or a newer version, or files that disagree with the meta
    raise one :class:`~vlp.errors.DataError` naming the folder or file."""
    folder = Path(path)
    if not folder.is_dir():
        partial = Path(f"{folder}.partial")
        hint = f" ({partial} holds an unfinished vlp index: run the same command again)" if partial.is_dir() else ""
        raise DataError(f"{folder}: no such index folder{hint}")
    meta = _read_meta(folder)
    try:
        features = np.load(folder / FEATURES, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise DataError(f"{folder / FEATURES}: cannot read the index's features ({e})") from None
    try:
        paths = json.loads((folder / PATHS).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{folder / PATHS}: cannot read the index's paths ({e})") from None
    want = (meta.get("count"), meta.get("embed_dim"))
    if features.ndim != 2 or features.shape != want or features.dtype != np.dtype(DTYPE):
        raise DataError(
            f"{folder / FEATURES}: {features.dtype} {list(features.shape)}, but {META} says {DTYPE} {list(want)}"
        )
    if not isinstance(paths, list) or len(paths) != features.shape[0]:
        raise DataError(f"{folder / PATHS}: expected a list of {features.shape[0]} paths, one per row of {FEATURES}")
    return ImageIndex(folder, meta, features, paths)


def _read_meta(folder: Path) -> dict[str, Any]:
    """``meta.json`` of ``folder``, checked to be this format at a version this vlp reads."""
    file = folder / META
    if not file.is_file():
        raise DataError(f"{folder}: not a vlp image index (no {META}; `vlp index` writes one)")
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as e:
        raise DataError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise DataError(f"{file}: not a vlp image index (format {got!r}, expected {FORMAT!r})")
    version = meta.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise DataError(f"{file}: format_version {version!r}, expected a whole number >= 1")
    if version > FORMAT_VERSION:
        raise DataError(
            f"{file}: index format version {version} is newer than this vlp reads ({FORMAT_VERSION}); upgrade vlp"
        )
    return meta
