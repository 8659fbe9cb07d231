"""``vlp prepare snli-ve``: official SNLI-VE JSON-lines files -> ALBEF's ``ve_*.json``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from vlp.data.downstream_formats import VE_IMAGE_SUFFIX, VE_LABELS
from vlp.data.json_entries import write_json_atomic
from vlp.errors import DataError
from vlp.prepare.common import check_images_exist, read_json_lines, required_key, required_text

VE_SPLITS = ("train", "dev", "test")
_RELEASE_NAME = re.compile(r"^snli_ve_(train|dev|test)\.jsonl$")


def snli_ve_split(path: str | Path) -> str:
    """The split of an official file from its name ``snli_ve_{train,dev,test}.jsonl``."""
    m = _RELEASE_NAME.match(Path(path).name)
    if m is None:
        raise DataError(
            f"{path}: expected an official file named snli_ve_train.jsonl, snli_ve_dev.jsonl or snli_ve_test.jsonl"
        )
    return m.group(1)


def snli_ve(jsonl: str | Path, out: str | Path, image_root: Optional[str | Path] = None) -> dict[str, int]:
    """An official SNLI-VE file (one JSON object per line: ``Flickr30K_ID``, ``sentence2`` (the
    hypothesis), ``gold_label``, and keys not used) -> ALBEF's ``[{"image": Flickr30K_ID,
    "sentence": sentence2, "label": gold_label}]``. Lines whose ``gold_label`` is none of the three
    classes (SNLI's ``"-"``: no annotator majority) are skipped and counted (``skipped``); a
    malformed line raises :class:`DataError` naming file and line. With an ``image_root`` (the
    Flickr30k image folder) every ``<id>.jpg`` must exist."""
    path = Path(jsonl)
    entries = []
    skipped = 0
    for where, e in read_json_lines(path):
        image = str(required_key(path, where, e, "Flickr30K_ID", (str, int), "a Flickr30k image id")).strip()
        if not image or Path(image).suffix:
            raise DataError(f"{path}: {where}: key 'Flickr30K_ID' is {image!r}, expected a Flickr30k id without suffix")
        label = required_key(path, where, e, "gold_label", (str,), f"one of {list(VE_LABELS)} (or '-')")
        if label not in VE_LABELS:
            skipped += 1
            continue
        entries.append(
            {
                "image": image,
                "sentence": required_text(path, where, e, "sentence2", "a hypothesis string"),
                "label": label,
            }
        )
    if not entries:
        raise DataError(f"{path}: no examples with a label in {list(VE_LABELS)} ({skipped} skipped)")
    check_images_exist((e["image"] + VE_IMAGE_SUFFIX for e in entries), image_root, path)
    write_json_atomic(Path(out), entries)
    return {
        "examples": len(entries),
        **{k: sum(e["label"] == k for e in entries) for k in VE_LABELS},
        "skipped": skipped,
    }
