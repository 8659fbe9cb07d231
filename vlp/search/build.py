"""``vlp index DIR --checkpoint RUN --out INDEX`` (or ``--onnx EXPORT``): every image under a folder through an
:class:`~vlp.search.embedder.ImageEmbedder` into one index (:mod:`vlp.search.index_format`),
resumable after a kill (:mod:`vlp.search.partial`).

Files are read in sorted order, ``chunk_size`` at a time, each chunk in batches of ``batch_size``
files (an unreadable file leaves its batch one image short); a file that cannot be read (missing,
truncated, not an image) is skipped and named with the reason ``vlp data check`` gives for a bad
image. ``workers`` loader processes decode the images (0: this process).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from vlp.api.inputs import image_tensor
from vlp.data.json_entries import plural
from vlp.errors import ConfigError, DataError
from vlp.progress import progress
from vlp.search.embedder import ImageEmbedder, ModelEmbedder
from vlp.search.onnx_embedder import OnnxEmbedder
from vlp.search.partial import Chunk, Partial, build_identity, index_meta
from vlp.search.photo_folder import PhotoFolder, scan_folder, shown_path

#: skipped files named one per line in the report; the rest are counted (all are in meta.json)
SHOWN_SKIPPED = 10


@dataclass
class IndexReport:
    """What :func:`build_index` did: the index ``out``, its ``count`` of images, the folder's
    ``files`` (image files found), ``skipped`` (``{path, reason}``), ``ignored`` (other files), and
    ``resumed`` (files an interrupted run had already embedded)."""

    out: Path
    root: Path
    count: int
    files: int
    skipped: list[dict[str, str]] = field(default_factory=list)
    ignored: int = 0
    resumed: int = 0

    def lines(self) -> list[str]:
        """One line per skipped file (the first :data:`SHOWN_SKIPPED`), then the summary."""
        shown = [f"skipped {s['path']}: {s['reason']}" for s in self.skipped[:SHOWN_SKIPPED]]
        if len(self.skipped) > SHOWN_SKIPPED:
            shown.append(f"... and {len(self.skipped) - SHOWN_SKIPPED} more skipped (all in {self.out}/meta.json)")
        notes = [f"{plural(len(self.skipped), 'bad image')} skipped"]
        if self.ignored:
            notes.append(f"{plural(self.ignored, 'file')} without an image extension ignored")
        if self.resumed:
            notes.append(f"resumed after {plural(self.resumed, 'file')}")
        summary = (
            f"indexed {plural(self.count, 'image')} of {shown_path(self.root)} into {self.out} ({'; '.join(notes)})"
        )
        return [*shown, summary]


class _Files(Dataset):
    """The folder's files by index -> ``(index, pixels [3, S, S] or None, reason or None)``."""

    def __init__(self, photos: PhotoFolder, embedder: ImageEmbedder) -> None:
        self.photos, self.min_side = photos, embedder.preprocessor.min_side
        self.transform = embedder.preprocessor.image_transform()

    def __len__(self) -> int:
        return len(self.photos.files)

    def __getitem__(self, i: int) -> tuple[int, Optional[torch.Tensor], Optional[str]]:
        rel = self.photos.files[i]
        try:
            return i, image_tensor(str(self.photos.root / rel), self.transform, self.min_side, rel), None
        except DataError as e:  # BadImage: missing, unreadable, truncated, too large
            return i, None, str(e).removeprefix(f"{rel}: ")


def _batches(n: int, start_chunk: int, chunk_size: int, batch_size: int) -> list[list[int]]:
    """File indices from chunk ``start_chunk`` on, in batches that never cross a chunk's end."""
    out = []
    for lo in range(start_chunk * chunk_size, n, chunk_size):
        hi = min(n, lo + chunk_size)
        out += [list(range(s, min(hi, s + batch_size))) for s in range(lo, hi, batch_size)]
    return out


def _embed_chunks(
    photos: PhotoFolder,
    embedder: ImageEmbedder,
    partial: Partial,
    start: int,
    sizes: tuple[int, int],
    workers: int,
    bar,
) -> None:
    """Embed chunks ``start``.. of the folder and save each as it completes."""
    chunk_size, batch_size = sizes
    loader = DataLoader(
        _Files(photos, embedder),
        batch_sampler=_batches(len(photos.files), start, chunk_size, batch_size),
        num_workers=workers,
        collate_fn=list,
    )
    rows: list[np.ndarray] = []
    kept: list[int] = []
    skipped: list[dict[str, str]] = []
    for batch in loader:
        good = [(i, x) for i, x, _ in batch if x is not None]
        skipped += [{"path": photos.files[i], "reason": r} for i, x, r in batch if x is None]
        if good:
            rows.append(embedder.embed_images(torch.stack([x for _, x in good])).float().numpy())
            kept += [i for i, _ in good]
        bar.update(len(batch))
        last = batch[-1][0]
        if last + 1 == len(photos.files) or (last + 1) % chunk_size == 0:
            width = rows[0].shape[1] if rows else 0
            partial.save(
                last // chunk_size, Chunk(np.concatenate(rows) if rows else np.zeros((0, width)), kept, skipped)
            )
            rows, kept, skipped = [], [], []


def build_index(
    folder: Union[str, os.PathLike, PhotoFolder],
    embedder: ImageEmbedder,
    out: str | os.PathLike,
    batch_size: int = 64,
    chunk_size: int = 4096,
    workers: int = 0,
    show_progress: bool = True,
) -> IndexReport:
    """Index every image of ``folder`` (:func:`~vlp.search.photo_folder.scan_folder`) with
    ``embedder`` into the folder ``out``; continues an interrupted build of the same folder,
    embedder and options (``OUT.partial``), refuses one that differs."""
    if batch_size < 1 or chunk_size < 1 or workers < 0:
        raise ConfigError(
            f"--batch-size {batch_size}, --chunk-size {chunk_size}, --workers {workers}: expected "
            "whole numbers >= 1 (workers >= 0)"
        )
    photos = folder if isinstance(folder, PhotoFolder) else scan_folder(folder)
    identity = build_identity(photos, embedder.meta(), batch_size, chunk_size)
    partial = Partial.open(Path(out), identity)
    n, n_chunks = len(photos.files), -(-len(photos.files) // chunk_size)
    start = partial.done()
    bar = progress(n, "index", show_progress)
    bar.update(min(n, start * chunk_size))
    if start < n_chunks:
        _embed_chunks(photos, embedder, partial, start, (chunk_size, batch_size), workers, bar)
    bar.close()
    meta = partial.publish(photos, n_chunks, index_meta(identity, photos.ignored))
    return IndexReport(
        Path(out), photos.root, meta["count"], n, meta["skipped"], photos.ignored, min(n, start * chunk_size)
    )


def run_index(
    folder: str,
    out: str,
    checkpoint: Optional[str] = None,
    onnx: Optional[str] = None,
    batch_size: int = 64,
    chunk_size: int = 4096,
    device: Optional[str] = None,
    workers: int = 0,
    show_progress: bool = True,
) -> IndexReport:
    """``vlp index``: the folder scanned and ``out`` checked first, then the image tower of
    ``checkpoint`` (:class:`~vlp.search.embedder.ModelEmbedder`) or of the ONNX export ``onnx``
    (:class:`~vlp.search.onnx_embedder.OnnxEmbedder`), exactly one of them, indexes it
    (:func:`build_index`)."""
    if checkpoint is not None and onnx is not None:
        raise ConfigError("give --checkpoint RUN or --onnx EXPORT (the image tower that embeds the images), not both")
    if checkpoint is None and onnx is None:
        raise ConfigError("give --checkpoint RUN or --onnx EXPORT: the image tower that embeds the images")
    photos = scan_folder(folder)
    if Path(out).exists():
        raise ConfigError(f"{out} already exists: remove it, or choose another --out")
    embedder: ImageEmbedder
    if checkpoint is not None:
        embedder = ModelEmbedder.load(checkpoint, device, batch_size)
    elif onnx is not None:
        embedder = OnnxEmbedder.load(onnx, device)
    return build_index(photos, embedder, out, batch_size, chunk_size, workers, show_progress)
