"""Zero-shot classification splits of a shapes world (``vlp evaluate classification``).

From a world's ``scenes.json``, one labelled split per attribute (:data:`CLASSIFICATION_ATTRIBUTES`):

- ``shape`` / ``colour``: the images whose objects all share one value of the attribute, labelled
  with it (``circle``, ``red``); images mixing values are left out;
- ``count``: every image, labelled with its number of objects as the count captions word it
  (``one shape``, ``two shapes``: the count caption of the empty description, true of exactly the
  images with that many objects).

Templates are phrasings the world's captions use, written by the caption grammar itself
(:func:`~vlp.world.captions.caption_text` with ``{}`` for the class name): shape ``a {}``
and ``one {}`` .. ``four {}s`` (the object caption and the count captions of the shape alone, one per
possible number of objects); colour ``one {} shape`` .. ``four {} shapes`` (the object caption ``a {}
shape`` is left out: the grammar writes ``an orange shape``, which no template can); count ``{}`` (the
class name is the caption).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from vlp.data.json_entries import read_json, write_atomic, write_json_atomic
from vlp.errors import DataError
from vlp.world.captions import caption_text
from vlp.world.phrases import with_article
from vlp.world.predicates import CountPred
from vlp.world.scene import COLORS, MAX_OBJECTS, MIN_OBJECTS, SHAPES, Desc

__all__ = ["CLASSIFICATION_ATTRIBUTES", "class_names", "templates", "image_label", "write_classification_splits"]

#: split name -> the object field it classifies (None: the number of objects)
CLASSIFICATION_ATTRIBUTES: dict[str, Optional[str]] = {"shape": "shape", "colour": "color", "count": None}
_SLOT = "{}"
_COUNTS = range(MIN_OBJECTS, MAX_OBJECTS + 1)


def class_names(attr: str, world: Optional[dict[str, Any]] = None) -> list[str]:
    """The classes of split ``attr``: the world's shapes or colours (``scenes.json`` ``attributes``,
    default the module's), or the count captions ``one shape`` .. ``four shapes``."""
    listed = (world or {}).get("attributes", {})
    if attr == "shape":
        return list(listed.get("shapes", SHAPES))
    if attr == "colour":
        return list(listed.get("colors", COLORS))
    if attr == "count":
        return [caption_text(CountPred(n, Desc())) for n in _COUNTS]
    raise ValueError(f"unknown classification attribute {attr!r}; expected one of {list(CLASSIFICATION_ATTRIBUTES)}")


def templates(attr: str) -> list[str]:
    """The prompt templates of split ``attr`` (each holds ``{}`` once), as the captions phrase them."""
    if attr == "shape":
        return [with_article(_SLOT)] + [caption_text(CountPred(n, Desc(shape=_SLOT))) for n in _COUNTS]
    if attr == "colour":
        return [caption_text(CountPred(n, Desc(color=_SLOT))) for n in _COUNTS]
    if attr == "count":
        return [_SLOT]
    raise ValueError(f"unknown classification attribute {attr!r}; expected one of {list(CLASSIFICATION_ATTRIBUTES)}")


def image_label(attr: str, objects: list[dict[str, Any]]) -> Optional[str]:
    """The class of an image (its ``scenes.json`` objects) in split ``attr``, or None when the image
    is not in the split (objects of several shapes / colours)."""
    key = CLASSIFICATION_ATTRIBUTES[attr]
    if key is None:
        return caption_text(CountPred(len(objects), Desc()))
    values = {o[key] for o in objects}
    return values.pop() if len(values) == 1 else None


def _write_lines(path: Path, lines: list[str]) -> None:
    """Write ``lines`` one per line, atomically."""
    text = "".join(f"{x}\n" for x in lines)
    write_atomic(path, lambda f: f.write(text))


def write_classification_splits(root: str | Path, split: str = "test") -> dict[str, Path]:
    """Write, for each attribute of :data:`CLASSIFICATION_ATTRIBUTES`, the JSON list
    ``classification_<attr>_<split>.json`` (``[{"image": path as in scenes.json, "label": class}]``,
    in the split's image order), ``classification_<attr>_classes.txt`` and
    ``classification_<attr>_templates.txt`` under the world ``root`` (from its ``scenes.json``).
    Returns the paths keyed by file stem (``classification_shape_test``, ``classification_shape_classes``,
    ``classification_shape_templates``, ...)."""
    root = Path(root)
    world = read_json(root / "scenes.json")
    if not isinstance(world, dict) or split not in world.get("splits", {}):
        raise DataError(f"{root / 'scenes.json'}: no split {split!r} (a shapes world's scenes.json has splits.{split})")
    records = world["splits"][split]
    paths: dict[str, Path] = {}
    for attr in CLASSIFICATION_ATTRIBUTES:
        entries = [
            {"image": r["image"], "label": label}
            for r in records
            if (label := image_label(attr, r["objects"])) is not None
        ]
        stem = f"classification_{attr}"
        paths[f"{stem}_{split}"] = root / f"{stem}_{split}.json"
        write_json_atomic(paths[f"{stem}_{split}"], entries, separators=(",", ":"), ensure_ascii=True)
        for kind, lines in (("classes", class_names(attr, world)), ("templates", templates(attr))):
            paths[f"{stem}_{kind}"] = root / f"{stem}_{kind}.txt"
            _write_lines(paths[f"{stem}_{kind}"], lines)
    return paths
