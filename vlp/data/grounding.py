"""The weakly supervised visual grounding format (ALBEF's RefCOCO+ files), shared by
``vlp prepare refcoco+`` (:mod:`vlp.prepare.refcoco`) and the shapes world
(:mod:`vlp.world.task_files.grounding`).

A grounding file is a JSON list with one entry per referring expression:

- train (``split_kind="train"``, ALBEF's ``refcoco+_train.json``): ``{"image": path, "text": str}``;
- eval (``split_kind="eval"``, ``refcoco+_{val,testA,testB}.json``): ``{"image": path, "text": str,
  "ref_id": int | str, "bbox": [x, y, w, h], "candidates": [[x, y, w, h], ...]}``: the target box
  and the boxes the model chooses among. With gold candidates (every annotated object of the
  image) the target is one of them; with detections (ALBEF used MAttNet's) it need not be, and
  a choice is right when its IoU with the target is >= 0.5.

Boxes are in pixels of the original image: ``x, y`` the top-left corner, ``w, h`` > 0 the width
and height (COCO's convention; pixel column ``j`` spans ``[j, j + 1)``). Train entries may carry the
eval keys too (vlp's files do: the fixed-position baseline is fitted on the training split);
when present they are validated like eval keys. Every entry may give ``"image_size": [W, H]`` (the
original image's width and height in pixels; vlp's files do), which saves opening the image to map
a patch heat map onto it. Relative image paths resolve against ``image_root`` (default: the
file's folder). Several sentences of one referred object share its ``ref_id``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from vlp.data.json_entries import Issues, entry_field, entry_image, entry_text, read_entries, resolve_image
from vlp.errors import DataError, EntryError

__all__ = ["SPLIT_KINDS", "Box", "GroundingEntry", "read_grounding_file", "check_box"]

SPLIT_KINDS: tuple[str, ...] = ("train", "eval")
#: ``(x, y, w, h)`` in pixels
Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class GroundingEntry:
    """One referring expression: its image, text and (eval entries; optional in train) the
    referred object's id, its box, the candidate boxes and the index of the target among them."""

    image: str  # resolved path
    text: str
    ref_id: Optional[int | str]
    bbox: Optional[Box]  # the target box
    candidates: tuple[Box, ...]  # () when the entry gives none
    target_index: Optional[int]  # the candidate equal to ``bbox``; None when none is (detections)
    image_size: Optional[tuple[int, int]]  # (W, H) when given
    origin: str  # "file.json entry 12"


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def check_box(v: Any) -> Optional[str]:
    """None when ``v`` is a box ``[x, y, w, h]`` (4 finite numbers, ``w, h > 0``), else what is wrong."""
    if not isinstance(v, (list, tuple)) or len(v) != 4:
        n = f" of {len(v)} items" if isinstance(v, (list, tuple)) else ""
        return f"{type(v).__name__}{n}"
    if not all(_is_number(x) for x in v):
        return f"{list(v)!r} (not 4 finite numbers)"
    if v[2] <= 0 or v[3] <= 0:
        return f"{list(v)!r} (width and height must be > 0)"
    return None


def _box(path: Path, i: int, key: str, v: Any) -> Box:
    problem = check_box(v)
    if problem is not None:
        raise EntryError(path, i, key, f"key '{key}' is {problem}, expected a box [x, y, w, h] in pixels, w and h > 0")
    return (float(v[0]), float(v[1]), float(v[2]), float(v[3]))


def _bbox(path: Path, i: int, e: dict) -> Box:
    if "bbox" not in e:
        raise EntryError(path, i, "bbox", "missing key 'bbox' (expected the target box [x, y, w, h])")
    return _box(path, i, "bbox", e["bbox"])


def _candidates(path: Path, i: int, e: dict) -> tuple[Box, ...]:
    v = entry_field(path, i, e, "candidates", (list,), "a non-empty list of boxes [x, y, w, h]")
    if not v:
        raise EntryError(path, i, "candidates", "key 'candidates' is an empty list, expected at least one box")
    return tuple(_box(path, i, f"candidates[{k}]", b) for k, b in enumerate(v))


def _ref_id(path: Path, i: int, e: dict) -> int | str:
    return entry_field(path, i, e, "ref_id", (int, str), "an int or string ref id")


def _image_size(path: Path, i: int, e: dict) -> Optional[tuple[int, int]]:
    if "image_size" not in e:
        return None
    v = e["image_size"]
    ok = isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    if not ok or min(v) <= 0:
        raise EntryError(
            path, i, "image_size", f"key 'image_size' is {v!r}, expected [width, height] in pixels (ints > 0)"
        )
    return (v[0], v[1])


def _grounding_entry(
    path: Path, i: int, e: Any, root: Path, split_kind: str, issues: Issues
) -> Optional[GroundingEntry]:
    """Entry ``i`` of a grounding file, or None when it has a problem (they go to ``issues``).
    Eval entries need ``ref_id``, ``bbox`` and ``candidates``; train entries may have them."""
    if (entry := issues.entry(path, i, e)) is None:
        return None
    image = entry.get(entry_image)
    text = entry.get(entry_text, "text", "a non-empty referring expression string")
    need = split_kind == "eval"
    ref_id = entry.get(_ref_id) if need or "ref_id" in entry else None
    bbox = entry.get(_bbox) if need or "bbox" in entry else None
    candidates = entry.get(_candidates) if need or "candidates" in entry else ()
    size = entry.get(_image_size)
    if not entry.ok or image is None or text is None:
        return None
    candidates = candidates or ()
    target = candidates.index(bbox) if bbox is not None and bbox in candidates else None
    return GroundingEntry(resolve_image(image, root), text, ref_id, bbox, candidates, target, size, entry.origin)


def read_grounding_file(
    path: str | Path, image_root: Optional[str | Path] = None, split_kind: str = "train"
) -> list[GroundingEntry]:
    """Load a grounding file (module docstring) of ``split_kind`` "train" or "eval"; the first
    problem raises an :class:`EntryError` naming the file, entry and key."""
    if split_kind not in SPLIT_KINDS:
        raise DataError(f"unknown grounding split kind {split_kind!r}, expected one of {list(SPLIT_KINDS)}")
    path = Path(path)
    root = Path(image_root) if image_root is not None else path.parent
    entries = [_grounding_entry(path, i, e, root, split_kind, Issues()) for i, e in enumerate(read_entries(path))]
    if not entries:
        raise DataError(f"{path}: no entries")
    return [e for e in entries if e is not None]
