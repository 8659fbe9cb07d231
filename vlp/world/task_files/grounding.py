"""Referring expressions and exact object boxes of the shapes world: its visual grounding files.

:func:`write_grounding_splits` reads a world's ``scenes.json`` and writes, in the grounding format
of :mod:`vlp.data.grounding`, ``grounding_train.json`` and ``grounding_{val,test}.json``: for
every image with at least two objects and each of its objects, one referring expression that
picks that object out among the image's objects, with the exact pixel box of every object.

Expressions (:func:`referring_expression`), shortest first:

1. ``the [size] [colour] noun`` from the fewest intrinsic attributes (size, colour, shape; "shape"
   when no shape is named) that match this object alone: "the circle", "the large red shape";
2. when no attribute set separates it (an identical twin in the image), a relation (left of,
   right of, above, below, as in the captions) to a landmark that its own attributes pick out:
   "the red circle above the square"; the fewest attributes over both phrases first;
3. otherwise the object gets no expression (two identical objects in the same relation to every
   landmark).

Cell phrases ("at the top left") are not used: every object has its own cell, so they would name
any object in one phrase and reduce grounding to reading a position word. Among the equally short
expressions one is drawn from the image's own RNG (:func:`~vlp.world.scene.world_rng`,
purpose ``"grounding"``), so the files are a deterministic function of the world.

Boxes (:func:`object_boxes`) replay the renderer's geometry (the centre jitter drawn from the
image's ``"render"`` RNG, :func:`object_geometry`) and rasterise each object alone with the
renderer's drawing code: the box is the tightest pixel box of exactly the pixels the object
covers in the world's image.
"""

from __future__ import annotations

import random
from itertools import combinations
from pathlib import Path
from typing import Any, Optional

from PIL import Image, ImageDraw

from vlp.data.json_entries import read_json, write_json_atomic
from vlp.errors import DataError
from vlp.kinds import GROUNDING
from vlp.world.phrases import noun_phrase
from vlp.world.predicates import RELATIONS, relation_holds
from vlp.world.scene import (
    Obj,
    Scene,
    count_matching,
    describe,
    draw_shape,
    object_geometry,
    scene_from_dict,
    world_rng,
)

__all__ = [
    "GROUNDING_FILES",
    "object_boxes",
    "referring_expression",
    "scenes_json_key",
    "write_grounding_splits",
]

#: split of ``scenes.json`` -> the grounding file written for it
GROUNDING_FILES: dict[str, str] = {
    "train": "grounding_train.json",
    "val": "grounding_val.json",
    "test": "grounding_test.json",
}
#: the intrinsic attributes an expression may name, in phrase order
_ATTRIBUTES: tuple[str, ...] = ("size", "color", "shape")
#: attribute sets by number of attributes: ``_SUBSETS[k]`` holds the sets of k attributes
_SUBSETS: tuple[tuple[frozenset[str], ...], ...] = tuple(
    tuple(frozenset(c) for c in combinations(_ATTRIBUTES, k)) for k in range(len(_ATTRIBUTES) + 1)
)
#: pixel box (x, y, w, h): columns x .. x + w - 1, rows y .. y + h - 1
PixelBox = tuple[int, int, int, int]


# --------------------------------------------------------------------------
# Boxes
# --------------------------------------------------------------------------


def object_boxes(scene: Scene, image_size: int, rng: Optional[random.Random]) -> list[PixelBox]:
    """The pixel box ``(x, y, w, h)`` of each object of ``scene`` rendered at ``image_size`` with
    ``rng`` (the image's ``"render"`` RNG): each object drawn alone on a mask with the renderer's
    drawing code, then the tightest box around its pixels."""
    boxes = []
    for obj, (cx, cy, half) in zip(scene.objects, object_geometry(scene, image_size, rng)):
        mask = Image.new("RGB", (image_size, image_size), (0, 0, 0))
        draw_shape(ImageDraw.Draw(mask), obj.shape, cx, cy, half, (255, 255, 255))
        bbox = mask.getbbox()
        if bbox is None:
            raise AssertionError(f"object {obj} covers no pixel at image size {image_size}")
        x0, y0, x1, y1 = bbox
        boxes.append((x0, y0, x1 - x0, y1 - y0))
    return boxes


# --------------------------------------------------------------------------
# Referring expressions
# --------------------------------------------------------------------------


def _unique(scene: Scene, k: int, attrs: frozenset[str]) -> bool:
    """Do ``attrs`` of object ``k`` match object ``k`` alone?"""
    return count_matching(scene, describe(scene.objects[k], attrs)) == 1


def _attribute_expressions(scene: Scene, k: int) -> list[str]:
    """The expressions ``the <noun phrase>`` that pick object ``k`` out with the fewest attributes."""
    for subsets in _SUBSETS[1:]:
        found = [f"the {noun_phrase(describe(scene.objects[k], a))}" for a in subsets if _unique(scene, k, a)]
        if found:
            return found
    return []


def _relation_targets(scene: Scene, attrs: frozenset[str], target: Obj, rel: str, landmark: int) -> list[int]:
    """The objects that ``the <attrs of target> <rel> <landmark>`` describes."""
    d = describe(target, attrs)
    lm = scene.objects[landmark]
    return [j for j, o in enumerate(scene.objects) if j != landmark and d.matches(o) and relation_holds(rel, o, lm)]


def _relation_expressions(scene: Scene, k: int) -> list[str]:
    """The expressions ``the <A> <relation> the <B>`` that pick object ``k`` out, B naming a landmark
    that its own attributes pick out, with the fewest attributes in A and B together."""
    target = scene.objects[k]
    options: list[tuple[int, str]] = []
    for m, landmark in enumerate(scene.objects):
        if m == k:
            continue
        names = [b for subsets in _SUBSETS[1:] for b in subsets if _unique(scene, m, b)]
        for rel in RELATIONS:
            if not relation_holds(rel, target, landmark):
                continue
            for a in (a for subsets in _SUBSETS for a in subsets):
                if _relation_targets(scene, a, target, rel, m) != [k]:
                    continue
                for b in names:
                    text = f"the {noun_phrase(describe(target, a))} {RELATIONS[rel]} the {noun_phrase(describe(landmark, b))}"
                    options.append((len(a) + len(b), text))
    if not options:
        return []
    fewest = min(cost for cost, _ in options)
    return [text for cost, text in options if cost == fewest]


def referring_expression(scene: Scene, k: int, rng: random.Random) -> Optional[str]:
    """A referring expression for object ``k`` of ``scene`` (module docstring): the fewest attributes,
    else a relation to a landmark; one of the equally short ones drawn with ``rng``; None when
    none separates it. Draws from ``rng`` only when there is a choice."""
    options = _attribute_expressions(scene, k) or _relation_expressions(scene, k)
    if not options:
        return None
    return options[0] if len(options) == 1 else rng.choice(options)


# --------------------------------------------------------------------------
# The grounding files of a world
# --------------------------------------------------------------------------


def scenes_json_key(path: Path, data: Any, key: str, what: str) -> Any:
    """``data[key]``, a part of the shapes world's ``scenes.json`` read from ``path``; raise
    :class:`DataError` naming the file and key (``what`` names the expectation) when ``data`` is not
    an object or has no ``key``."""
    if not isinstance(data, dict) or key not in data:
        raise DataError(f"{path}: missing key '{key}' (expected {what}); is this a shapes world's scenes.json?")
    return data[key]


def _image_entries(record: dict[str, Any], split: str, index: int, seed: int, image_size: int) -> list[dict[str, Any]]:
    """The grounding entries of image ``index`` of ``split`` (none for fewer than two objects)."""
    scene = scene_from_dict(record)
    if len(scene.objects) < 2:
        return []
    boxes = [list(b) for b in object_boxes(scene, image_size, world_rng(seed, split, index, "render"))]
    rng = world_rng(seed, split, index, GROUNDING)
    entries = []
    for k in range(len(scene.objects)):
        text = referring_expression(scene, k, rng)
        if text is None:
            continue
        entries.append(
            {
                "image": record["image"],
                "text": text,
                "ref_id": f"{split}_{index:06d}_{k}",
                "bbox": boxes[k],
                "candidates": boxes,
                "image_size": [image_size, image_size],
            }
        )
    return entries


def write_grounding_splits(root: str | Path) -> dict[str, Path]:
    """Write ``grounding_{train,val,test}.json`` of the shapes world under ``root`` (from its
    ``scenes.json``); returns ``{"grounding_train": path, "grounding_val": ..., "grounding_test": ...}``.

    Every entry has the eval keys (``ref_id`` ``"<split>_<image index>_<object index>"``, ``bbox``,
    every object of the image as ``candidates``) and ``image_size``; the train file is read as
    train entries (image and text), its boxes serve the fixed-position baseline.
    """
    root = Path(root)
    path = root / "scenes.json"
    data = read_json(path)
    seed = scenes_json_key(path, data, "seed", "the world seed")
    image_size = scenes_json_key(path, data, "image_size", "the image side in pixels")
    splits = scenes_json_key(path, data, "splits", "the scene records of each split")
    paths = {}
    for split, name in GROUNDING_FILES.items():
        records = scenes_json_key(path, splits, split, f"the scene records of split {split!r}")
        entries = [e for i, r in enumerate(records) for e in _image_entries(r, split, i, seed, image_size)]
        paths[f"grounding_{split}"] = root / name
        write_json_atomic(paths[f"grounding_{split}"], entries, separators=(",", ":"), ensure_ascii=True)
    return paths
