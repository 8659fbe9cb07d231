"""An index being built: the staging folder ``OUT.partial`` that makes ``vlp index`` resumable and
its result atomic.

``OUT.partial/progress.json`` records what the build is (:func:`build_identity`: the folder and a
digest of its files, the embedder's identity, the options that change the rows); each finished chunk
of ``chunk_size`` files is ``chunks/NNNNNN.npy`` (its rows) and then ``chunks/NNNNNN.json`` (which
files it kept, which it skipped and why), each written to a temporary file and renamed, so a chunk
exists whole or not at all. Running the same command again continues after the last whole chunk
(:meth:`Partial.open`), and refuses in one line when the folder, the checkpoint (or ONNX export) or an
option differs.
When every chunk is there, :meth:`Partial.publish` writes the index into ``OUT.partial/index``
(features streamed into a memory-mapped ``features.npy``), renames it to ``OUT`` and removes the
staging folder: a killed run leaves ``OUT.partial`` and no ``OUT``.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from vlp.data.json_entries import write_atomic, write_json_atomic
from vlp.errors import ConfigError, DataError
from vlp.search.index_format import DTYPE, FEATURES, FORMAT, FORMAT_VERSION, META, PATHS
from vlp.search.photo_folder import PhotoFolder
from vlp.version import __version__

PROGRESS = "progress.json"
CHUNKS = "chunks"
STAGED = "index"
#: how a differing key of the identity is named in the refusal, in the order they are looked at
_NAMES = {
    "root": "the folder",
    "files": "the folder's image files",
    "embedder.embedder": "the image encoder (--checkpoint or --onnx)",
    "embedder.checkpoint": "the checkpoint",
    "embedder.weights_sha256": "the checkpoint's weights",
    "embedder.export": "the ONNX export",
    "embedder.image_encoder_sha256": "the export's image_encoder.onnx",
    "embedder.device": "--device",
    "embedder.providers": "onnxruntime's providers",
    "options.batch_size": "--batch-size",
    "options.chunk_size": "--chunk-size",
}


def build_identity(photos: PhotoFolder, embedder_meta: dict[str, Any], batch_size: int, chunk_size: int) -> dict:
    """What an index build is: the same identity gives the same rows, bit for bit."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "root": str(photos.root),
        "files": len(photos.files),
        "digest": photos.digest,
        "embedder": embedder_meta,
        "options": {"batch_size": batch_size, "chunk_size": chunk_size},
    }


@dataclass
class Chunk:
    """One finished chunk: ``rows`` [n, E] float32 of the files ``kept`` (indices into the folder's
    files), ``skipped`` (``{path, reason}``)."""

    rows: np.ndarray
    kept: list[int]
    skipped: list[dict[str, str]]


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


class Partial:
    """The staging folder ``OUT.partial`` of the index ``out`` (module doc)."""

    def __init__(self, out: Path, identity: dict[str, Any]) -> None:
        self.out, self.identity = out, identity
        self.folder = Path(f"{out}.partial")
        self.chunks = self.folder / CHUNKS

    @classmethod
    def open(cls, out: Path, identity: dict[str, Any]) -> Partial:
        """The staging folder of ``out``: a new one, or an interrupted build's with the same
        identity. Raises :class:`~vlp.errors.ConfigError` (one line) when ``out`` exists, when the
        interrupted build differs (naming what), or when ``OUT.partial`` is not vlp's."""
        if out.exists():
            raise ConfigError(f"{out} already exists: remove it, or choose another --out")
        p = cls(out, identity)
        record = p.folder / PROGRESS
        if record.is_file():
            p._check_same(json.loads(record.read_text(encoding="utf-8")))
        elif p.folder.exists() and any(p.folder.iterdir()):
            raise ConfigError(f"{p.folder} exists and is not an unfinished `vlp index` (no {PROGRESS}); remove it")
        else:
            write_json_atomic(record, identity, indent=1)
        p.chunks.mkdir(parents=True, exist_ok=True)
        return p

    def _check_same(self, before: dict[str, Any]) -> None:
        """Refuse to continue an interrupted build that ``before`` describes if it differs."""
        old, new = _flat(before), _flat(self.identity)
        order = list(_NAMES)
        keys = sorted(set(old) | set(new), key=lambda k: (order.index(k) if k in order else len(order), k))
        for key in keys:
            if old.get(key) == new.get(key):
                continue
            if key == "digest":
                what = "the folder's image files changed since (one added, removed or rewritten)"
            else:
                what = f"{_NAMES.get(key, key)} was {old.get(key)!r}, now {new.get(key)!r}"
            raise ConfigError(
                f"{self.folder} holds an interrupted `vlp index` of other settings: {what}; run it again with "
                f"the same folder, checkpoint and options to continue, or remove {self.folder} to start afresh"
            )

    def _files(self, c: int) -> tuple[Path, Path]:
        return self.chunks / f"{c:06d}.npy", self.chunks / f"{c:06d}.json"

    def done(self) -> int:
        """How many chunks, from the first, are whole."""
        c = 0
        while all(f.is_file() for f in self._files(c)):
            c += 1
        return c

    def save(self, c: int, chunk: Chunk) -> None:
        """Chunk ``c``: its rows, then its record (the record makes it count as done)."""
        rows_file, record = self._files(c)
        write_atomic(rows_file, lambda f: np.save(f, np.ascontiguousarray(chunk.rows, dtype=DTYPE)), binary=True)
        write_json_atomic(record, {"kept": chunk.kept, "skipped": chunk.skipped})

    def load(self, c: int) -> Chunk:
        """Chunk ``c`` as saved."""
        rows_file, record = self._files(c)
        saved = json.loads(record.read_text(encoding="utf-8"))
        return Chunk(np.load(rows_file, mmap_mode="r"), saved["kept"], saved["skipped"])

    def _all(self, n: int) -> Iterator[Chunk]:
        return (self.load(c) for c in range(n))

    def publish(self, photos: PhotoFolder, n_chunks: int, meta: dict[str, Any]) -> dict[str, Any]:
        """Write the index from the ``n_chunks`` chunks into ``OUT.partial/index``, rename it to
        ``OUT``, remove the staging folder; the index's meta (``meta`` plus count, embed_dim,
        skipped). No image read at all: :class:`~vlp.errors.DataError`, the staging folder kept."""
        kept, skipped, dim = 0, [], 0
        for chunk in self._all(n_chunks):
            kept += len(chunk.kept)
            skipped += chunk.skipped
            dim = chunk.rows.shape[1] if len(chunk.kept) else dim
        if kept == 0:
            first = f": {skipped[0]['path']}: {skipped[0]['reason']}" if skipped else ""
            raise DataError(f"{photos.root}: none of its {len(photos.files)} image files could be read{first}")
        staged = self.folder / STAGED
        shutil.rmtree(staged, ignore_errors=True)  # an assembly a kill interrupted
        staged.mkdir()
        features = np.lib.format.open_memmap(staged / FEATURES, mode="w+", dtype=DTYPE, shape=(kept, dim))
        paths, at = [], 0
        for chunk in self._all(n_chunks):
            features[at : at + len(chunk.kept)] = chunk.rows
            at += len(chunk.kept)
            paths += [photos.files[i] for i in chunk.kept]
        features.flush()
        del features
        meta = {**meta, "count": kept, "embed_dim": dim, "dtype": DTYPE, "skipped": skipped}
        write_json_atomic(staged / PATHS, paths)
        write_json_atomic(staged / META, meta, indent=1)
        os.rename(staged, self.out)
        shutil.rmtree(self.folder)
        return meta


def index_meta(identity: dict[str, Any], ignored: int) -> dict[str, Any]:
    """The ``meta.json`` fields known before the rows (:mod:`vlp.search.index_format`)."""
    embedder = identity["embedder"]
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "vlp_version": __version__,
        "root": identity["root"],
        "checkpoint": embedder.get("checkpoint"),
        "embedder": embedder,
        "options": {**identity["options"], "device": embedder.get("device")},
        "files": identity["files"],
        "ignored": ignored,
    }
