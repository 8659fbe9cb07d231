"""Relevance between shapes-world captions and images: exact and graded, for many at once.

Exact relevance is :func:`~vlp.world.predicates.caption_matches`; graded relevance
(:func:`caption_grade`) scores a caption on an image by the fraction of the caption's atomic
facts the image satisfies: 1.0 exactly when the caption is true of the image, less otherwise.
:class:`SceneTable` evaluates both on many scenes at once with numpy, and
:func:`compute_relevance` / :func:`compute_graded_relevance` build the world's relevance files.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from itertools import permutations
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from vlp.world.predicates import (
    CountPred,
    ObjectPred,
    RelationPred,
    ScenePred,
    predicate_from_dict,
    relation_holds,
)
from vlp.world.scene import COLORS, DESC_FIELDS, MAX_OBJECTS, SHAPES, SIZES, Desc, Obj, Scene

if TYPE_CHECKING:  # annotations only
    from vlp.world.predicates import Predicate

__all__ = [
    "caption_grade",
    "SceneTable",
    "compute_relevance",
    "compute_graded_relevance",
]


# --------------------------------------------------------------------------
# Graded relevance, one scene
# --------------------------------------------------------------------------


def _n_facts(d: Desc) -> int:
    """Atomic facts of a description: each of shape, colour, size given, plus the cell (one fact)."""
    return sum(getattr(d, f) is not None for f in ("shape", "color", "size")) + (d.row is not None or d.col is not None)


def _facts_held(d: Desc, obj: Obj | None) -> int:
    """How many of ``d``'s atomic facts ``obj`` satisfies (0 for no object)."""
    if obj is None:
        return 0
    held = sum((v := getattr(d, f)) is not None and v == getattr(obj, f) for f in ("shape", "color", "size"))
    if d.row is not None or d.col is not None:
        held += all((v := getattr(d, f)) is None or v == getattr(obj, f) for f in ("row", "col"))
    return held


def _count_credit(k: int | np.ndarray, n: int | np.ndarray) -> np.ndarray:
    """Credit for "exactly n" when k hold: 1 if k == n, else min(k, n) / max(k, n) (works on arrays)."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    return np.where(k == n, 1.0, np.minimum(k, n) / np.maximum(np.maximum(k, n), 1.0))


def caption_grade(pred: dict[str, Any] | Predicate, scene: Scene) -> float:
    """Graded relevance of a caption for a scene, in [0, 1]; 1.0 iff :func:`~vlp.world.predicates.caption_matches`.

    The fraction of the caption's atomic facts the scene satisfies under the best choice of
    objects. A description's facts are its given shape, colour and size words and its cell.

    - ``object``: max over objects of facts held / facts (no facts: 1 if the scene has an object).
    - ``relation``: (facts of A held by a + facts of B held by b + [relation(a, b)]) / (|A| + |B| + 1),
      max over ordered pairs of distinct objects; in a one-object scene that object plays A or B.
    - ``count`` "n D": ([best object's facts of D held] + count credit) / (|D| + 1), the count credit
      being 1 if exactly n objects satisfy D, else min(k, n) / max(k, n) for k such objects; for
      n = 0 only the count credit.
    - ``scene`` with m objects: (facts held under the best one-to-one pairing of the caption's
      objects with the scene's (4 facts each: shape, colour, size, cell) + count credit of the
      number of objects) / (4m + 1).

    This is the reference (pure Python) semantics; :meth:`SceneTable.grades` is the vectorised
    equivalent.
    """
    p = predicate_from_dict(pred)
    objs = list(scene.objects)
    if isinstance(p, ObjectPred):
        n = _n_facts(p.object)
        if n == 0:
            return float(bool(objs))
        return max((_facts_held(p.object, o) for o in objs), default=0) / n
    if isinstance(p, RelationPred):
        cands = objs + [None]  # None: no object (only matters in a one-object scene)
        best = max(
            (
                _facts_held(p.a, a)
                + _facts_held(p.b, b)
                + (a is not None and b is not None and relation_holds(p.relation, a, b))
                for i, a in enumerate(cands)
                for j, b in enumerate(cands)
                if i != j
            ),
            default=0,
        )
        return best / (_n_facts(p.a) + _n_facts(p.b) + 1)
    if isinstance(p, CountPred):
        k = sum(p.object.matches(o) for o in objs)
        credit = float(_count_credit(k, p.n))
        if p.n == 0:
            return credit
        held = max((_facts_held(p.object, o) for o in objs), default=0)
        return (held + credit) / (_n_facts(p.object) + 1)
    if isinstance(p, ScenePred):
        m = len(p.objects)
        credit = float(_count_credit(len(objs), m))
        if m == 0:
            return credit
        descs = [Desc(**asdict(o)) for o in p.objects]
        slots = objs + [None] * max(0, m - len(objs))
        held = max(
            sum(_facts_held(d, slots[j]) for d, j in zip(descs, perm)) for perm in permutations(range(len(slots)), m)
        )
        return (held + credit) / (4 * m + 1)
    raise TypeError(f"not a predicate: {pred!r}")


# --------------------------------------------------------------------------
# Vectorised relevance
# --------------------------------------------------------------------------


class SceneTable:
    """Per-scene attribute tables (numpy) for evaluating predicates on many scenes at once.

    ``matches(pred)`` returns a boolean vector over the scenes and agrees
    exactly with :func:`~vlp.world.predicates.caption_matches`.
    """

    def __init__(self, scenes: Sequence[Scene]) -> None:
        self.scenes = list(scenes)
        n = len(self.scenes)
        width = max([MAX_OBJECTS] + [len(s.objects) for s in self.scenes])
        self.valid = np.zeros((n, width), dtype=bool)
        self.attrs = {f: np.full((n, width), -1, dtype=np.int8) for f in DESC_FIELDS}
        vocab = {"shape": SHAPES, "color": COLORS, "size": SIZES}
        self._index = {f: {v: i for i, v in enumerate(vs)} for f, vs in vocab.items()}
        self._scene_keys: dict[tuple, list[int]] = {}
        for i, s in enumerate(self.scenes):
            for j, o in enumerate(s.objects):
                self.valid[i, j] = True
                for f in ("shape", "color", "size"):
                    self.attrs[f][i, j] = self._index[f][getattr(o, f)]
                self.attrs["row"][i, j] = o.row
                self.attrs["col"][i, j] = o.col
            self._scene_keys.setdefault(self._key(s.objects), []).append(i)

    @staticmethod
    def _key(objs: Iterable[Obj]) -> tuple:
        return tuple(sorted((o.shape, o.color, o.size, o.row, o.col) for o in objs))

    def _desc_mask(self, d: Desc) -> np.ndarray:
        m = self.valid.copy()
        for f in DESC_FIELDS:
            v = getattr(d, f)
            if v is None:
                continue
            code = self._index[f].get(v, -2) if f in self._index else v
            m &= self.attrs[f] == code
        return m

    def matches(self, pred: dict[str, Any] | Predicate) -> np.ndarray:
        """Boolean vector: does each scene satisfy ``pred``?"""
        p = predicate_from_dict(pred)
        n = len(self.scenes)
        if isinstance(p, ScenePred):
            out = np.zeros(n, dtype=bool)
            out[self._scene_keys.get(self._key(p.objects), [])] = True
            return out
        if isinstance(p, ObjectPred):
            return self._desc_mask(p.object).any(axis=1)
        if isinstance(p, CountPred):
            return self._desc_mask(p.object).sum(axis=1) == p.n
        if isinstance(p, RelationPred):
            ma, mb = self._desc_mask(p.a), self._desc_mask(p.b)
            axis = "col" if p.relation in ("left_of", "right_of") else "row"
            v = self.attrs[axis]
            if p.relation in ("left_of", "above"):
                rel = v[:, :, None] < v[:, None, :]
            else:
                rel = v[:, :, None] > v[:, None, :]
            # rel is irreflexive, so a and b are automatically distinct objects
            return (ma[:, :, None] & mb[:, None, :] & rel).any(axis=(1, 2))
        raise TypeError(f"not a predicate: {pred!r}")

    def _facts_held(self, d: Desc) -> np.ndarray:
        """[n, width] int: how many of ``d``'s atomic facts each object slot satisfies (0 if empty)."""
        held = np.zeros(self.valid.shape, dtype=np.int16)
        for f in ("shape", "color", "size"):
            v = getattr(d, f)
            if v is not None:
                held += self.attrs[f] == self._index[f].get(v, -2)
        if d.row is not None or d.col is not None:
            pos = np.ones(self.valid.shape, dtype=bool)
            for f in ("row", "col"):
                if (v := getattr(d, f)) is not None:
                    pos &= self.attrs[f] == v
            held += pos
        return np.where(self.valid, held, 0)

    def grades(self, pred: dict[str, Any] | Predicate) -> np.ndarray:
        """Float vector over the scenes: :func:`caption_grade` of ``pred`` on each, exactly."""
        p = predicate_from_dict(pred)
        n_obj = self.valid.sum(axis=1)
        if isinstance(p, ObjectPred):
            nf = _n_facts(p.object)
            if nf == 0:
                return (n_obj > 0).astype(np.float64)
            return self._facts_held(p.object).max(axis=1) / nf
        if isinstance(p, RelationPred):
            ha, hb = self._facts_held(p.a), self._facts_held(p.b)
            axis = "col" if p.relation in ("left_of", "right_of") else "row"
            v = self.attrs[axis]
            rel = v[:, :, None] < v[:, None, :] if p.relation in ("left_of", "above") else v[:, :, None] > v[:, None, :]
            rel &= self.valid[:, :, None] & self.valid[:, None, :]
            total = ha[:, :, None] + hb[:, None, :] + rel  # [n, a slot, b slot]; empty slots hold 0 facts
            w = total.shape[1]
            total[:, np.arange(w), np.arange(w)] = -1  # a and b must be distinct
            return total.max(axis=(1, 2)) / (_n_facts(p.a) + _n_facts(p.b) + 1)
        if isinstance(p, CountPred):
            credit = _count_credit(self._desc_mask(p.object).sum(axis=1), p.n)
            if p.n == 0:
                return credit
            return (self._facts_held(p.object).max(axis=1) + credit) / (_n_facts(p.object) + 1)
        if isinstance(p, ScenePred):
            m = len(p.objects)
            credit = _count_credit(n_obj, m)
            if m == 0:
                return credit
            held = np.stack([self._facts_held(Desc(**asdict(o))) for o in p.objects], axis=1)  # [n, m, width]
            width = max(held.shape[2], m)
            held = np.pad(held, ((0, 0), (0, 0), (0, width - held.shape[2])))
            perms = np.array(list(permutations(range(width), m)))  # [P, m] one-to-one pairings
            best = held[:, np.arange(m)[None, :], perms].sum(axis=2).max(axis=1)  # [n]
            return (best + credit) / (4 * m + 1)
        raise TypeError(f"not a predicate: {pred!r}")


def compute_relevance(preds: Sequence[dict[str, Any] | Predicate], scenes: Sequence[Scene]) -> list[list[int]]:
    """For each predicate, the sorted indices of the scenes that satisfy it.

    Identical predicates are evaluated once.
    """
    table = SceneTable(scenes)
    cache: dict[str, list[int]] = {}
    out = []
    for pred in preds:
        p = predicate_from_dict(pred)
        key = json.dumps(p.to_dict(), sort_keys=True)
        if key not in cache:
            cache[key] = np.flatnonzero(table.matches(p)).tolist()
        out.append(cache[key])
    return out


def compute_graded_relevance(preds: Sequence[dict[str, Any] | Predicate], scenes: Sequence[Scene]) -> np.ndarray:
    """[len(preds), len(scenes)] float32: :func:`caption_grade` of every predicate on every scene.

    1.0 exactly where :func:`compute_relevance` lists the scene. Identical predicates are
    evaluated once.
    """
    table = SceneTable(scenes)
    out = np.zeros((len(preds), len(scenes)), dtype=np.float32)
    cache: dict[str, np.ndarray] = {}
    for k, pred in enumerate(preds):
        p = predicate_from_dict(pred)
        key = json.dumps(p.to_dict(), sort_keys=True)
        if key not in cache:
            cache[key] = table.grades(p).astype(np.float32)
        out[k] = cache[key]
    return out
