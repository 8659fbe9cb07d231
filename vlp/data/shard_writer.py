"""Writing webdataset tar shards from ALBEF annotation files (``vlp make-shards``): images grouped
with their captions, resized and JPEG-encoded in worker processes, written with webdataset's
``TarWriter`` (mtime 0: byte-identical shards for the same inputs) plus ``sizes.json``, and beside each
tar img2dataset's ``{name}_stats.json`` (its count, ``successes``), by which the folder is counted when it
is read by URL (:mod:`vlp.data.shard_counts`). The format and the reading side are
:mod:`vlp.data.shard_format` and :mod:`vlp.data.shards`.
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from PIL import Image, UnidentifiedImageError

from vlp.data.formats import load_pairs
from vlp.data.json_entries import write_atomic
from vlp.data.shard_counts import stats_url
from vlp.data.shard_format import SHARD_NAME, SIZES_FILE
from vlp.errors import DataError


def resize_shorter(im: Image.Image, size: int) -> Image.Image:
    """Resize so the shorter side is ``size`` (bicubic, aspect kept); smaller images are kept as they are."""
    w, h = im.size
    if min(w, h) <= size:
        return im
    tw, th = (size, max(1, round(h * size / w))) if w <= h else (max(1, round(w * size / h)), size)
    return im.resize((tw, th), Image.Resampling.BICUBIC)


def encode_image(path: str, origin: str, size: int, quality: int) -> bytes:
    """Read an image, resize its shorter side to ``size`` (never up) and re-encode it as RGB JPEG.

    JPEG sources are decoded in draft mode (DCT scaling) when much larger than ``size``. A missing or
    unreadable file raises one :class:`DataError` naming ``origin`` and the path."""
    try:
        with Image.open(path) as im:
            w, h = im.size
            if min(w, h) > size and im.format == "JPEG":
                im.draft("RGB", (w * size // min(w, h), h * size // min(w, h)))
            rgb = im.convert("RGB")
    except FileNotFoundError:
        raise DataError(f"{origin}: image file not found: {path}") from None
    except (UnidentifiedImageError, OSError) as e:
        raise DataError(f"{origin}: cannot read image {path}: {e}") from None
    if rgb.size != (w, h):  # draft mode decoded at a reduced scale: resize from the original geometry
        scale = size / min(w, h)
        rgb = rgb.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    resize_shorter(rgb, size).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _encode_task(task: tuple[str, str, int, int]) -> bytes:
    return encode_image(*task)


@dataclass
class ImageRecord:
    """One image of the source data with all its captions (one shard sample)."""

    image: str  # resolved path
    captions: list[str]
    image_key: str
    image_id: int
    source: str  # annotation file
    origin: str  # first entry, for error messages


def group_images(files: Sequence[str | Path], image_root: Optional[str | Path] = None) -> list[ImageRecord]:
    """Read pretraining / retrieval-train files and group their entries by image key; ``image_id`` is
    the index in the sorted keys (the numbering of :class:`ImageTextDataset`)."""
    by_key: dict[str, ImageRecord] = {}
    for f in files:
        for s in load_pairs([f], image_root):
            rec = by_key.get(s.image_key)
            if rec is None:
                by_key[s.image_key] = ImageRecord(s.image, list(s.captions), s.image_key, -1, str(f), s.origin)
            else:
                rec.captions.extend(s.captions)
    records = [by_key[k] for k in sorted(by_key)]
    for i, r in enumerate(records):
        r.image_id = i
    return records


def write_shards(
    files: Sequence[str | Path],
    out_dir: str | Path,
    image_root: Optional[str | Path] = None,
    size: int = 256,
    max_per_shard: int = 5000,
    seed: int = 0,
    quality: int = 90,
    show_progress: bool = True,
    workers: int = 0,
) -> Path:
    """Write ALBEF-format annotation ``files`` (and their images) as webdataset shards in ``out_dir``.

    One sample per image with all its captions, shuffled globally with ``seed``, at most
    ``max_per_shard`` per shard; images are resized so the shorter side is ``size`` and re-encoded
    as JPEG ``quality``; ``workers`` > 0 encodes in that many processes. Beside each tar its
    img2dataset stats file (:func:`stats_json`), so that the folder copied to object storage is
    counted without ``vlp data index``. ``sizes.json`` is written last: a folder without it is
    incomplete. Refuses a folder that already holds shards; a missing or unreadable image raises one
    :class:`DataError` (naming the entry and path) and removes the files this call wrote. Returns
    ``out_dir``."""
    from vlp.progress import progress

    out = Path(out_dir)
    if size < 1 or max_per_shard < 1 or not 1 <= quality <= 100:
        raise DataError(
            f"make-shards: expected --size >= 1, --max-per-shard >= 1 and 1 <= --quality <= 100, "
            f"got {size}, {max_per_shard}, {quality}"
        )
    if out.exists() and (any(out.glob("shard-*.tar")) or (out / SIZES_FILE).exists()):
        raise DataError(
            f"{out} already holds shards (shard-*.tar or {SIZES_FILE}); choose another --out or remove them"
        )
    records = group_images(files, image_root)
    missing = [r for r in records if not Path(r.image).is_file()]
    if missing:
        listed = "; ".join(f"{r.origin}: {r.image}" for r in missing[:5])
        raise DataError(f"{len(missing)} of {len(records)} image files not found, e.g. {listed}")
    random.Random(seed).shuffle(records)
    chunks = [records[i : i + max_per_shard] for i in range(0, len(records), max_per_shard)]
    created_dir = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    sizes: dict[str, dict[str, int]] = {}
    tasks = ((r.image, r.origin, size, quality) for r in records)
    pool = Pool(workers) if workers > 0 else None
    bar = progress(len(records), "make-shards", show_progress)
    try:
        jpegs = pool.imap(_encode_task, tasks, chunksize=8) if pool else map(_encode_task, tasks)
        for n, chunk in enumerate(chunks):
            path = out / SHARD_NAME.format(n)
            stats = Path(stats_url(str(path)))
            written += [path, stats]
            _write_tar(path, chunk, jpegs, bar)
            _write_stats(stats, len(chunk))
            sizes[path.name] = {"images": len(chunk), "pairs": sum(len(r.captions) for r in chunk)}
        write_atomic(out / SIZES_FILE, lambda f: f.write(_sizes_json(sizes)))
    except BaseException:
        for p in written:
            p.unlink(missing_ok=True)
        if created_dir and not any(out.iterdir()):
            out.rmdir()
        raise
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
    return out


def stats_json(images: int) -> str:
    """img2dataset's ``{name}_stats.json`` text of a shard of ``images`` samples, all downloaded:
    ``count`` and ``successes`` (what vlp reads, :func:`vlp.data.shard_counts.stats_count`), no failures."""
    stats = {"count": images, "successes": images, "failed_to_download": 0, "failed_to_resize": 0}
    return json.dumps(stats, indent=4) + "\n"


def _write_stats(path: Path, images: int) -> None:
    write_atomic(path, lambda f: f.write(stats_json(images)))


def _sizes_json(sizes: dict[str, dict[str, int]]) -> str:
    """``sizes.json`` text: one line per shard."""
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in sizes.items()) + "\n}\n"


def _write_tar(path: Path, records: Sequence[ImageRecord], jpegs: Iterator[bytes], bar: Any) -> None:
    from webdataset import TarWriter

    with open(path, "wb") as f:
        writer = TarWriter(f, encoder=False, mtime=0)  # mtime 0: byte-identical shards for the same inputs
        for r in records:
            meta = {"captions": r.captions, "image_key": r.image_key, "image_id": r.image_id, "source": r.source}
            writer.write({"__key__": f"{r.image_id:09d}", "jpg": next(jpegs), "json": json.dumps(meta).encode()})
            bar.update(1)
        writer.close()
