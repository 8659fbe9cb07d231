"""Caption predicates: what a shapes-world caption says, and whether it is true of a scene.

Every caption is the surface form of an explicit, serialisable predicate (its ``kind``):

``scene``     every object, fully specified; true iff the scene holds exactly
              this multiset of (shape, colour, size, row, col) objects.
``object``    one object described by 1-3 of {size, colour, shape, cell}
              (always shape or colour); true iff some object satisfies it.
``relation``  ``A <rel> B`` with rel in left of / right of / above / below;
              true iff two distinct objects a, b satisfy A, B and the relation
              (left of: col_a < col_b, above: row_a < row_b).
``count``     ``<n> <description>``; true iff exactly n objects satisfy the
              description.

:func:`caption_matches` is the exact (pure Python) semantics; the set of images a caption truly
describes -- including the "false negatives" of contrastive learning -- is therefore known.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Union

from vlp.world.scene import COLORS, DESC_FIELDS, SHAPES, SIZES, Desc, Obj, Scene

__all__ = [
    "RELATIONS",
    "ScenePred",
    "ObjectPred",
    "RelationPred",
    "CountPred",
    "Predicate",
    "predicate_from_dict",
    "relation_holds",
    "caption_matches",
]

#: relation identifiers (predicate dicts) -> caption words
RELATIONS: dict[str, str] = {
    "left_of": "left of",
    "right_of": "right of",
    "above": "above",
    "below": "below",
}


@dataclass(frozen=True)
class ScenePred:
    """Exactly this multiset of fully specified objects."""

    objects: tuple[Obj, ...]
    kind: str = field(default="scene", init=False)

    def to_dict(self) -> dict[str, Any]:
        objs = sorted(self.objects, key=lambda o: (o.row, o.col))
        return {"kind": "scene", "objects": [asdict(o) for o in objs]}


@dataclass(frozen=True)
class ObjectPred:
    """At least one object satisfies ``object``."""

    object: Desc
    kind: str = field(default="object", init=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "object", "object": self.object.to_dict()}


@dataclass(frozen=True)
class RelationPred:
    """Two distinct objects a, b with ``a`` matching A, ``b`` matching B and ``relation(a, b)``."""

    a: Desc
    relation: str
    b: Desc
    kind: str = field(default="relation", init=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "relation", "relation": self.relation, "a": self.a.to_dict(), "b": self.b.to_dict()}


@dataclass(frozen=True)
class CountPred:
    """Exactly ``n`` objects satisfy ``object``."""

    n: int
    object: Desc
    kind: str = field(default="count", init=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "count", "n": self.n, "object": self.object.to_dict()}


Predicate = Union[ScenePred, ObjectPred, RelationPred, CountPred]


def _check_desc(d: Desc) -> Desc:
    if d.shape is not None and d.shape not in SHAPES:
        raise ValueError(f"unknown shape {d.shape!r}")
    if d.color is not None and d.color not in COLORS:
        raise ValueError(f"unknown color {d.color!r}")
    if d.size is not None and d.size not in SIZES:
        raise ValueError(f"unknown size {d.size!r}")
    for f in ("row", "col"):
        v = getattr(d, f)
        if v is not None and v not in (0, 1, 2):
            raise ValueError(f"{f} must be 0..2, got {v!r}")
    return d


def predicate_from_dict(d: dict[str, Any] | Predicate) -> Predicate:
    """Build (and validate) a predicate dataclass from its dict form."""
    if isinstance(d, (ScenePred, ObjectPred, RelationPred, CountPred)):
        return d
    kind = d.get("kind")

    def desc(x: dict[str, Any]) -> Desc:
        return _check_desc(Desc(**{f: x.get(f) for f in DESC_FIELDS}))

    if kind == "scene":
        objs = []
        for o in d["objects"]:
            full = desc(o)
            if any(getattr(full, f) is None for f in DESC_FIELDS):
                raise ValueError(f"scene predicate objects must be fully specified: {o}")
            objs.append(Obj(**{f: o[f] for f in DESC_FIELDS}))
        return ScenePred(tuple(sorted(objs, key=lambda o: (o.row, o.col))))
    if kind == "object":
        return ObjectPred(desc(d["object"]))
    if kind == "relation":
        if d["relation"] not in RELATIONS:
            raise ValueError(f"unknown relation {d['relation']!r}")
        return RelationPred(desc(d["a"]), d["relation"], desc(d["b"]))
    if kind == "count":
        n = int(d["n"])
        if n < 0:
            raise ValueError(f"count must be >= 0, got {n}")
        return CountPred(n, desc(d["object"]))
    raise ValueError(f"unknown predicate kind {kind!r}")


def relation_holds(rel: str, a: Obj, b: Obj) -> bool:
    """Does ``rel`` (a key of :data:`RELATIONS`) hold between objects ``a`` and ``b``?"""
    if rel == "left_of":
        return a.col < b.col
    if rel == "right_of":
        return a.col > b.col
    if rel == "above":
        return a.row < b.row
    if rel == "below":
        return a.row > b.row
    raise ValueError(f"unknown relation {rel!r}")


def caption_matches(pred: dict[str, Any] | Predicate, scene: Scene) -> bool:
    """Evaluate a caption predicate (dict or dataclass) on a scene, exactly.

    This is the reference (pure Python) semantics; :class:`~vlp.world.relevance.SceneTable` is the
    vectorised equivalent used to build relevance files.
    """
    p = predicate_from_dict(pred)
    objs = scene.objects
    if isinstance(p, ScenePred):
        return Counter(p.objects) == Counter(objs)
    if isinstance(p, ObjectPred):
        return any(p.object.matches(o) for o in objs)
    if isinstance(p, CountPred):
        return sum(p.object.matches(o) for o in objs) == p.n
    if isinstance(p, RelationPred):
        return any(
            i != j and p.a.matches(a) and p.b.matches(b) and relation_holds(p.relation, a, b)
            for i, a in enumerate(objs)
            for j, b in enumerate(objs)
        )
    raise TypeError(f"not a predicate: {pred!r}")
