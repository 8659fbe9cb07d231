"""Minimal-pair distractors: scenes that differ from a caption's image in exactly one attribute of one object.

For a caption true of a target scene, a distractor changes one object's ``shape``, ``color`` or
``size``, moves it to an empty ``cell``, or changes the ``count`` (removes one object, or adds a
copy of one in an empty cell), such that the caption is false of the distractor
(:func:`~vlp.data.synthetic.predicates.caption_matches`). A model that scores the target image
above the distractor for the caption has kept that attribute in its caption embedding
(:func:`vlp.eval.probes.minimal_pair_accuracy`).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from vlp.data.synthetic.predicates import Predicate, caption_matches
from vlp.data.synthetic.scene import COLORS, MAX_OBJECTS, MIN_OBJECTS, SHAPES, SIZES, Obj, Scene

__all__ = ["PAIR_ATTRIBUTES", "Distractor", "distractors", "sample_distractors"]

PAIR_ATTRIBUTES: tuple[str, ...] = ("shape", "color", "size", "cell", "count")
_VALUES: dict[str, tuple[str, ...]] = {"shape": SHAPES, "color": COLORS, "size": SIZES}


@dataclass(frozen=True)
class Distractor:
    """A scene differing from the target in ``attribute`` of one object; ``change`` says how."""

    attribute: str
    scene: Scene
    change: str


def _scene(objects: Sequence[Obj]) -> Scene:
    """A scene with its objects in canonical (row-major cell) order."""
    return Scene(tuple(sorted(objects, key=lambda o: (o.row, o.col))))


def _empty_cells(scene: Scene) -> list[tuple[int, int]]:
    taken = {(o.row, o.col) for o in scene.objects}
    return [(r, c) for r in range(3) for c in range(3) if (r, c) not in taken]


def _name(o: Obj) -> str:
    return f"{o.size} {o.color} {o.shape} at ({o.row},{o.col})"


def _all_changes(scene: Scene, attribute: str) -> list[Distractor]:
    """Every single-attribute change of ``scene`` (one object, one attribute), caption not yet checked."""
    objs = list(scene.objects)
    out = []
    for i, o in enumerate(objs):
        rest = objs[:i] + objs[i + 1 :]
        if attribute in _VALUES:
            for v in _VALUES[attribute]:
                if v != getattr(o, attribute):
                    moved = Obj(**{**asdict(o), attribute: v})
                    out.append(Distractor(attribute, _scene([*rest, moved]), f"{_name(o)}: {attribute} -> {v}"))
        elif attribute == "cell":
            for r, c in _empty_cells(scene):
                out.append(Distractor(attribute, _scene([*rest, replace(o, row=r, col=c)]), f"{_name(o)} -> ({r},{c})"))
        elif attribute == "count":
            if len(objs) > MIN_OBJECTS:
                out.append(Distractor(attribute, _scene(rest), f"{_name(o)} removed"))
            if len(objs) < MAX_OBJECTS:
                for r, c in _empty_cells(scene):
                    copy = replace(o, row=r, col=c)
                    out.append(Distractor(attribute, _scene([*objs, copy]), f"{_name(o)} copied to ({r},{c})"))
        else:
            raise ValueError(f"unknown attribute {attribute!r}; expected one of {list(PAIR_ATTRIBUTES)}")
    return out


def distractors(pred: dict[str, Any] | Predicate, scene: Scene, attribute: str) -> list[Distractor]:
    """Every scene that differs from ``scene`` (of which ``pred`` is true) in ``attribute`` of exactly
    one object and of which ``pred`` is false, in a fixed order. ``count`` changes the number of
    objects by one (removing one, or copying one into an empty cell), within the world's 1-4."""
    if not caption_matches(pred, scene):
        raise ValueError("the caption is not true of the target scene")
    return [d for d in _all_changes(scene, attribute) if not caption_matches(pred, d.scene)]


def sample_distractors(
    pred: dict[str, Any] | Predicate,
    scene: Scene,
    rng: random.Random,
    per_attribute: int = 2,
    attributes: Sequence[str] = PAIR_ATTRIBUTES,
) -> dict[str, list[Distractor]]:
    """Up to ``per_attribute`` distractors of each attribute, drawn without replacement by ``rng``
    (fewer where fewer exist, e.g. no ``size`` distractor of a caption that names no size)."""
    out = {}
    for a in attributes:
        pool = distractors(pred, scene, a)
        out[a] = rng.sample(pool, min(per_attribute, len(pool)))
    return out
