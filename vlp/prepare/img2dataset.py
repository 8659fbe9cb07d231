"""``vlp prepare cc3m|sbu``: caption files + images downloaded by img2dataset (``00000/000000012.jpg``
with a sidecar ``000000012.json`` holding ``url``, ``caption``, ``key``, ``status``) -> pretraining
pairs; rows whose image is missing are counted and left out. Images are matched by URL through the
sidecars, so the row order, a header line or img2dataset's shard size do not matter."""

from __future__ import annotations

import json
from pathlib import Path

from vlp.data.json_entries import write_json_atomic
from vlp.errors import DataError
from vlp.prepare.common import absolute_path, read_lines, required_key

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


def img2dataset_index(image_dir: str | Path) -> dict[str, str]:
    """URL -> image path (relative to ``image_dir``) of every successful img2dataset download:
    the sidecar ``SHARD/KEY.json`` files (``{"url", "caption", "key", "status"}``) whose status is
    ``success`` and whose image ``SHARD/KEY.jpg`` (or .jpeg/.png/.webp) exists."""
    root = Path(image_dir)
    if not root.is_dir():
        raise DataError(f"image folder not found: {root}")
    index: dict[str, str] = {}
    for side in sorted(root.glob("*/*.json")):
        try:
            meta = json.loads(side.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{side}: invalid JSON sidecar ({e})") from None
        if not isinstance(meta, dict):
            raise DataError(f"{side}: expected an img2dataset sidecar object, got {type(meta).__name__}")
        if meta.get("status", "success") != "success":
            continue
        url = required_key(side, "sidecar", meta, "url", (str,), "the image URL")
        image = next((side.with_suffix(s) for s in IMAGE_SUFFIXES if side.with_suffix(s).is_file()), None)
        if image is not None:
            index.setdefault(url, image.relative_to(root).as_posix())
    return index


def _pairs_from_urls(rows: list[tuple[str, str, str]], image_dir: str | Path, out: str | Path) -> dict[str, int]:
    """rows: (caption, url, where) -> pairs of the downloaded images; the others are counted."""
    index = img2dataset_index(image_dir)
    root = Path(image_dir)
    entries, missing = [], 0
    for caption, url, _ in rows:
        rel = index.get(url)
        if rel is None:
            missing += 1
        else:
            entries.append({"image": absolute_path(root, rel), "caption": caption})
    if not entries:
        raise DataError(
            f"none of the {len(rows)} images was found in {root} (img2dataset output with sidecar .json files)"
        )
    write_json_atomic(Path(out), entries)
    return {"rows": len(rows), "entries": len(entries), "missing_images": missing}


def cc3m(tsv: str | Path, image_dir: str | Path, out: str | Path) -> dict[str, int]:
    """CC3M ``Train_GCC-training.tsv`` (``caption<TAB>url`` per line; a ``caption<TAB>url`` header, as
    img2dataset wants, is skipped) + the img2dataset download in ``image_dir`` -> pretraining pairs
    ``[{"image": absolute path, "caption": str}]``. Returns ``rows``, ``entries``, ``missing_images``."""
    path = Path(tsv)
    rows = []
    for n, line in enumerate(read_lines(path), 1):
        if n == 1 and line.strip().lower() == "caption\turl":
            continue
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(f"{path}: line {n}: expected 2 tab-separated fields (caption, url), got {len(fields)}")
        caption, url = fields[0].strip(), fields[1].strip()
        if not caption:
            raise DataError(f"{path}: line {n}: empty caption")
        if not url:
            raise DataError(f"{path}: line {n}: empty url")
        rows.append((caption, url, f"line {n}"))
    if not rows:
        raise DataError(f"{path}: no rows")
    return _pairs_from_urls(rows, image_dir, out)


def sbu(captions_txt: str | Path, urls_txt: str | Path, image_dir: str | Path, out: str | Path) -> dict[str, int]:
    """SBU ``SBU_captioned_photo_dataset_captions.txt`` + ``SBU_captioned_photo_dataset_urls.txt``
    (line-aligned) + the img2dataset download in ``image_dir`` -> pretraining pairs."""
    cpath, upath = Path(captions_txt), Path(urls_txt)
    caps, urls = read_lines(cpath), read_lines(upath)
    # a trailing empty line at the end of either file is not a row
    while caps and not caps[-1].strip():
        caps.pop()
    while urls and not urls[-1].strip():
        urls.pop()
    if len(caps) != len(urls):
        raise DataError(f"{cpath} has {len(caps)} lines but {upath} has {len(urls)}: the files must be line-aligned")
    rows = []
    for n, (c, u) in enumerate(zip(caps, urls), 1):
        if not c.strip():
            raise DataError(f"{cpath}: line {n}: empty caption")
        if not u.strip():
            raise DataError(f"{upath}: line {n}: empty url")
        rows.append((c.strip(), u.strip(), f"line {n}"))
    if not rows:
        raise DataError(f"{cpath}: no rows")
    return _pairs_from_urls(rows, image_dir, out)
