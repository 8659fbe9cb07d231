"""``vlp prepare nlvr2``: official NLVR2 JSON-lines files -> ``nlvr_*.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from vlp.data.json_entries import write_json_atomic
from vlp.errors import DataError
from vlp.prepare.common import check_images_exist, read_json_lines, required_key, required_text

# --------------------------------------------------------------------------
# NLVR2
# --------------------------------------------------------------------------

NLVR_SPLITS = ("train", "dev", "test1", "test2")


def nlvr_images(split: str, identifier: str, directory: Optional[int | str] = None) -> list[str]:
    """The two image paths of an NLVR2 example, relative to the NLVR2 folder: identifier
    ``train-10171-0-0`` -> ``images/train/{directory}/train-10171-0-img0.png`` (the train images
    come in 100 numbered folders), ``dev-850-0-3`` -> ``dev/dev-850-0-img0.png`` (dev, test1, test2:
    one folder, as in ALBEF's files)."""
    prefix = identifier.rsplit("-", 1)[0]
    folder = f"images/train/{directory}" if split == "train" else split
    return [f"{folder}/{prefix}-img0.png", f"{folder}/{prefix}-img1.png"]


def nlvr2(jsonl: str | Path, split: str, out: str | Path, image_root: Optional[str | Path] = None) -> dict[str, int]:
    """Official NLVR2 ``train.json`` / ``dev.json`` / ``test1.json`` (one JSON object per line:
    ``identifier``, ``sentence``, ``label`` "True"/"False", ``directory`` (train), URLs ...) ->
    ``[{"images": [img0, img1], "sentence", "label": "True"/"False", "identifier"}]``.
    With an ``image_root`` (the NLVR2 folder) every image must exist."""
    if split not in NLVR_SPLITS:
        raise DataError(f"unknown NLVR2 split {split!r}, expected one of {list(NLVR_SPLITS)}")
    path = Path(jsonl)
    entries = []
    for where, e in read_json_lines(path):
        ident = required_text(path, where, e, "identifier", "an identifier like train-10171-0-0")
        parts = ident.split("-")
        if len(parts) != 4 or parts[0] != split:
            raise DataError(f"{path}: {where}: key 'identifier' is {ident!r}, expected {split}-N-N-N (split {split!r})")
        label = required_key(path, where, e, "label", (str,), '"True" or "False"')
        if label not in ("True", "False"):
            raise DataError(f'{path}: {where}: key \'label\' is {label!r}, expected "True" or "False"')
        directory = (
            required_key(path, where, e, "directory", (int, str), "the train image folder number")
            if split == "train"
            else None
        )
        entries.append(
            {
                "images": nlvr_images(split, ident, directory),
                "sentence": required_text(path, where, e, "sentence", "a sentence string"),
                "label": label,
                "identifier": ident,
            }
        )
    if not entries:
        raise DataError(f"{path}: no examples")
    check_images_exist((p for e in entries for p in e["images"]), image_root, path)
    write_json_atomic(Path(out), entries)
    return {
        "examples": len(entries),
        "true": sum(e["label"] == "True" for e in entries),
        "false": sum(e["label"] == "False" for e in entries),
    }
