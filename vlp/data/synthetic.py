"""The "shapes world": a deterministic synthetic vision-language dataset.

Each image is a light-grey canvas split into an (invisible) 3x3 grid holding
1-4 coloured shapes, at most one per cell.  Every object has a shape, a
colour, a size and a cell.  Each image gets five distinct captions written by
a small grammar; every caption is the surface form of an explicit, serialisable
*predicate* over scenes (see :func:`caption_matches`), so the set of images a
caption truly describes -- including the "false negatives" of contrastive
learning -- is known exactly.

Public API
----------
``Obj``, ``Scene``, ``sample_scene``, ``render_scene``, ``make_captions``,
``caption_matches``, ``generate_world``; plus helpers ``caption_text``,
``parse_caption``, ``predicate_from_dict``, ``SceneTable``,
``compute_relevance``, ``caption_grade`` and ``compute_graded_relevance``.

Caption kinds (predicate ``kind``)
----------------------------------
``scene``     every object, fully specified; true iff the scene holds exactly
              this multiset of (shape, colour, size, row, col) objects.
``object``    one object described by 1-3 of {size, colour, shape, cell}
              (always shape or colour); true iff some object satisfies it.
``relation``  ``A <rel> B`` with rel in left of / right of / above / below;
              true iff two distinct objects a, b satisfy A, B and the relation
              (left of: col_a < col_b, above: row_a < row_b).
``count``     ``<n> <description>``; true iff exactly n objects satisfy the
              description.

All caption text is lowercase ``[a-z ]`` so that ALBEF-style caption cleaning
leaves it unchanged.

Graded relevance (see :func:`caption_grade`) scores a caption on an image by the
fraction of the caption's atomic facts the image satisfies: 1.0 exactly when
the caption is true of the image, less otherwise.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from itertools import permutations
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence, Union

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    "SHAPES",
    "COLORS",
    "SIZES",
    "RELATIONS",
    "COLOR_RGB",
    "BACKGROUND_RGB",
    "CELL_PHRASES",
    "Obj",
    "Scene",
    "Desc",
    "ScenePred",
    "ObjectPred",
    "RelationPred",
    "CountPred",
    "Predicate",
    "sample_scene",
    "render_scene",
    "make_captions",
    "caption_text",
    "parse_caption",
    "predicate_from_dict",
    "caption_matches",
    "SceneTable",
    "compute_relevance",
    "caption_grade",
    "compute_graded_relevance",
    "scene_to_dict",
    "scene_from_dict",
    "generate_world",
    "write_generic_mix",
]

# --------------------------------------------------------------------------
# Attributes
# --------------------------------------------------------------------------

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond")
COLORS: tuple[str, ...] = ("red", "green", "blue", "yellow", "purple", "orange")
SIZES: tuple[str, ...] = ("small", "large")
#: relation identifiers (predicate dicts) -> caption words
RELATIONS: dict[str, str] = {
    "left_of": "left of",
    "right_of": "right of",
    "above": "above",
    "below": "below",
}

COLOR_RGB: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (245, 215, 0),
    "purple": (140, 40, 180),
    "orange": (255, 130, 0),
}
BACKGROUND_RGB: tuple[int, int, int] = (210, 210, 210)

#: side of the object's bounding box as a fraction of the cell side
SIZE_EXTENT: dict[str, float] = {"small": 0.40, "large": 0.85}
#: max centre jitter as a fraction of the free space left in the cell
JITTER_FRACTION = 0.5

#: one phrase per grid cell (row, col); each phrase means exactly that cell
CELL_PHRASES: dict[tuple[int, int], str] = {
    (0, 0): "at the top left",
    (0, 1): "at the top",
    (0, 2): "at the top right",
    (1, 0): "on the left",
    (1, 1): "in the center",
    (1, 2): "on the right",
    (2, 0): "at the bottom left",
    (2, 1): "at the bottom",
    (2, 2): "at the bottom right",
}
_PHRASE_CELLS: dict[str, tuple[int, int]] = {v: k for k, v in CELL_PHRASES.items()}

NUMBER_WORDS: tuple[str, ...] = ("zero", "one", "two", "three", "four")
_PLURAL: dict[str, str] = {s: s + "s" for s in (*SHAPES, "shape")}
_SINGULAR: dict[str, str] = {v: k for k, v in _PLURAL.items()}

MIN_OBJECTS, MAX_OBJECTS = 1, 4
CAPTION_KINDS: tuple[str, ...] = ("scene", "object", "relation", "count")
#: weights of the non-scene kinds for the free caption slots
KIND_WEIGHTS: dict[str, float] = {"object": 0.35, "relation": 0.35, "count": 0.30}

_DESC_FIELDS: tuple[str, ...] = ("shape", "color", "size", "row", "col")


# --------------------------------------------------------------------------
# Scenes
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Obj:
    """One object: shape, colour, size and its grid cell (row 0..2 top->bottom, col 0..2 left->right)."""

    shape: str
    color: str
    size: str
    row: int
    col: int


@dataclass(frozen=True)
class Scene:
    """A scene: objects in distinct cells, canonically ordered row-major by cell."""

    objects: tuple[Obj, ...]


def scene_to_dict(scene: Scene) -> dict[str, Any]:
    """Serialise a scene as ``{"objects": [{shape, color, size, row, col}, ...]}``."""
    return {"objects": [asdict(o) for o in scene.objects]}


def scene_from_dict(d: dict[str, Any]) -> Scene:
    """Inverse of :func:`scene_to_dict` (also accepts a ``scenes.json`` split entry)."""
    return Scene(tuple(Obj(**{k: o[k] for k in _DESC_FIELDS}) for o in d["objects"]))


def sample_scene(rng: random.Random) -> Scene:
    """Draw a scene: 1-4 objects (uniform), distinct cells, uniform attributes."""
    n = rng.randint(MIN_OBJECTS, MAX_OBJECTS)
    cells = sorted(rng.sample(range(9), n))
    objs = []
    for cell in cells:
        shape = rng.choice(SHAPES)
        color = rng.choice(COLORS)
        size = rng.choice(SIZES)
        objs.append(Obj(shape, color, size, cell // 3, cell % 3))
    return Scene(tuple(objs))


# --------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------


def render_scene(scene: Scene, image_size: int = 64, rng: random.Random | None = None) -> Image.Image:
    """Render ``scene`` as an RGB image of ``image_size`` x ``image_size`` pixels.

    Each object is drawn (no anti-aliasing) inside its own cell; a bounding box
    of ``SIZE_EXTENT[size]`` of the cell side centred on the cell centre, moved
    by a jitter drawn from ``rng`` (no jitter when ``rng`` is None).  The jitter
    never pushes an object out of its cell, so the cell centre of a large
    object always has the object's colour and empty cells are pure background.
    """
    if image_size < 9:
        raise ValueError(f"image_size must be >= 9, got {image_size}")
    img = Image.new("RGB", (image_size, image_size), BACKGROUND_RGB)
    draw = ImageDraw.Draw(img)
    cell = image_size / 3.0
    for obj in scene.objects:
        extent = SIZE_EXTENT[obj.size] * cell
        half = extent / 2.0
        slack = max(0.0, (cell - extent) / 2.0 - 1.0) * JITTER_FRACTION
        jx = rng.uniform(-slack, slack) if rng is not None else 0.0
        jy = rng.uniform(-slack, slack) if rng is not None else 0.0
        cx = (obj.col + 0.5) * cell + jx
        cy = (obj.row + 0.5) * cell + jy
        fill = COLOR_RGB[obj.color]
        if obj.shape == "circle":
            draw.ellipse([cx - half, cy - half, cx + half, cy + half], fill=fill)
        elif obj.shape == "square":
            draw.rectangle([cx - half, cy - half, cx + half, cy + half], fill=fill)
        elif obj.shape == "triangle":
            draw.polygon([(cx, cy - half), (cx + half, cy + half), (cx - half, cy + half)], fill=fill)
        elif obj.shape == "diamond":
            draw.polygon([(cx, cy - half), (cx + half, cy), (cx, cy + half), (cx - half, cy)], fill=fill)
        else:
            raise ValueError(f"unknown shape {obj.shape!r}")
    return img


# --------------------------------------------------------------------------
# Predicates
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Desc:
    """A partial object description; ``None`` fields are unconstrained."""

    shape: str | None = None
    color: str | None = None
    size: str | None = None
    row: int | None = None
    col: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def matches(self, obj: Obj) -> bool:
        """True iff every given attribute equals the object's."""
        return all(
            (v := getattr(self, f)) is None or v == getattr(obj, f) for f in _DESC_FIELDS
        )


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
        return _check_desc(Desc(**{f: x.get(f) for f in _DESC_FIELDS}))

    if kind == "scene":
        objs = []
        for o in d["objects"]:
            full = desc(o)
            if any(getattr(full, f) is None for f in _DESC_FIELDS):
                raise ValueError(f"scene predicate objects must be fully specified: {o}")
            objs.append(Obj(**{f: o[f] for f in _DESC_FIELDS}))
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


def _relation_holds(rel: str, a: Obj, b: Obj) -> bool:
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

    This is the reference (pure Python) semantics; :class:`SceneTable` is the
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
            i != j and p.a.matches(a) and p.b.matches(b) and _relation_holds(p.relation, a, b)
            for i, a in enumerate(objs)
            for j, b in enumerate(objs)
        )
    raise TypeError(f"not a predicate: {pred!r}")


# --------------------------------------------------------------------------
# Graded relevance
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
    """Graded relevance of a caption for a scene, in [0, 1]; 1.0 iff :func:`caption_matches`.

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
                _facts_held(p.a, a) + _facts_held(p.b, b) + (a is not None and b is not None and _relation_holds(p.relation, a, b))
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
        held = max(sum(_facts_held(d, slots[j]) for d, j in zip(descs, perm)) for perm in permutations(range(len(slots)), m))
        return (held + credit) / (4 * m + 1)
    raise TypeError(f"not a predicate: {pred!r}")


# --------------------------------------------------------------------------
# Caption text <-> predicate
# --------------------------------------------------------------------------


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _desc_words(d: Desc, plural: bool = False) -> str:
    noun = d.shape if d.shape is not None else "shape"
    words = [w for w in (d.size, d.color) if w is not None]
    words.append(_PLURAL[noun] if plural else noun)
    if d.row is not None or d.col is not None:
        if d.row is None or d.col is None:
            raise ValueError("caption text needs both row and col (one phrase per cell)")
        words.append(CELL_PHRASES[(d.row, d.col)])
    return " ".join(words)


def _with_article(d: Desc) -> str:
    s = _desc_words(d)
    return f"{_article(s)} {s}"


def caption_text(pred: dict[str, Any] | Predicate) -> str:
    """The caption for a predicate (a deterministic function of the predicate)."""
    p = predicate_from_dict(pred)
    if isinstance(p, ScenePred):
        parts = [_with_article(Desc(**asdict(o))) for o in sorted(p.objects, key=lambda o: (o.row, o.col))]
        return " and ".join(parts)
    if isinstance(p, ObjectPred):
        return _with_article(p.object)
    if isinstance(p, RelationPred):
        return f"{_with_article(p.a)} {RELATIONS[p.relation]} {_with_article(p.b)}"
    if isinstance(p, CountPred):
        if p.n >= len(NUMBER_WORDS):
            raise ValueError(f"no number word for {p.n}")
        return f"{NUMBER_WORDS[p.n]} {_desc_words(p.object, plural=p.n != 1)}"
    raise TypeError(f"not a predicate: {pred!r}")


def _parse_desc(tokens: list[str], plural: bool | None = None) -> Desc:
    """Parse ``[size] [colour] noun [cell phrase]`` (no article)."""
    i = 0
    size = color = None
    if i < len(tokens) and tokens[i] in SIZES:
        size, i = tokens[i], i + 1
    if i < len(tokens) and tokens[i] in COLORS:
        color, i = tokens[i], i + 1
    if i >= len(tokens):
        raise ValueError(f"missing noun in {' '.join(tokens)!r}")
    noun = tokens[i]
    i += 1
    if noun in _SINGULAR and plural is not False:
        noun = _SINGULAR[noun]
    elif noun in _PLURAL and plural is not True:
        pass
    else:
        raise ValueError(f"bad noun {noun!r}")
    shape = None if noun == "shape" else noun
    row = col = None
    if i < len(tokens):
        phrase = " ".join(tokens[i:])
        if phrase not in _PHRASE_CELLS:
            raise ValueError(f"unknown position phrase {phrase!r}")
        row, col = _PHRASE_CELLS[phrase]
    return Desc(shape, color, size, row, col)


def _strip_article(tokens: list[str]) -> list[str]:
    if not tokens or tokens[0] not in ("a", "an"):
        raise ValueError(f"expected an article in {' '.join(tokens)!r}")
    return tokens[1:]


def parse_caption(text: str) -> dict[str, Any]:
    """Parse a shapes-world caption back into its predicate dict.

    Inverse of :func:`caption_text`; raises ``ValueError`` for text outside
    the grammar.  Shows that caption text determines the predicate uniquely.
    """
    tokens = text.split()
    if not tokens:
        raise ValueError("empty caption")
    if tokens[0] in NUMBER_WORDS:
        n = NUMBER_WORDS.index(tokens[0])
        d = _parse_desc(tokens[1:], plural=n != 1)
        if d.row is not None:
            raise ValueError("count captions carry no position")
        return CountPred(n, d).to_dict()
    for rel, words in RELATIONS.items():
        w = words.split()
        for k in range(1, len(tokens) - len(w) + 1):
            if tokens[k : k + len(w)] == w:
                a = _parse_desc(_strip_article(tokens[:k]), plural=False)
                b = _parse_desc(_strip_article(tokens[k + len(w) :]), plural=False)
                return RelationPred(a, rel, b).to_dict()
    parts: list[list[str]] = [[]]
    for t in tokens:
        if t == "and":
            parts.append([])
        else:
            parts[-1].append(t)
    descs = [_parse_desc(_strip_article(p), plural=False) for p in parts]
    full = [all(getattr(d, f) is not None for f in _DESC_FIELDS) for d in descs]
    if len(descs) == 1 and not full[0]:
        return ObjectPred(descs[0]).to_dict()
    if not all(full):
        raise ValueError(f"scene captions must fully specify every object: {text!r}")
    return ScenePred(tuple(Obj(**asdict(d)) for d in descs)).to_dict()


# --------------------------------------------------------------------------
# Caption sampling
# --------------------------------------------------------------------------

# object captions: 1-3 of the 4 attributes, always shape or colour.  (All 4
# would collide with the text of a one-object scene caption.)
_OBJECT_SUBSETS: tuple[frozenset[str], ...] = tuple(
    frozenset(s)
    for s in (
        {"color"}, {"shape"},
        {"size", "color"}, {"size", "shape"}, {"color", "shape"}, {"color", "pos"}, {"shape", "pos"},
        {"size", "color", "shape"}, {"size", "color", "pos"}, {"size", "shape", "pos"}, {"color", "shape", "pos"},
    )
)
# relation descriptions: non-empty subsets of {size, colour, shape} with shape or colour
_RELATION_SUBSETS: tuple[frozenset[str], ...] = tuple(
    frozenset(s)
    for s in ({"color"}, {"shape"}, {"size", "color"}, {"size", "shape"}, {"color", "shape"}, {"size", "color", "shape"})
)
# count descriptions: any subset of {size, colour, shape} (empty = "shapes")
_COUNT_SUBSETS: tuple[frozenset[str], ...] = (frozenset(),) + _RELATION_SUBSETS + (frozenset({"size"}),)


def _describe(obj: Obj, attrs: frozenset[str]) -> Desc:
    return Desc(
        shape=obj.shape if "shape" in attrs else None,
        color=obj.color if "color" in attrs else None,
        size=obj.size if "size" in attrs else None,
        row=obj.row if "pos" in attrs else None,
        col=obj.col if "pos" in attrs else None,
    )


def _sample_object(scene: Scene, rng: random.Random) -> Predicate:
    return ObjectPred(_describe(rng.choice(scene.objects), rng.choice(_OBJECT_SUBSETS)))


def _sample_relation(scene: Scene, rng: random.Random) -> Predicate:
    a, b = rng.sample(scene.objects, 2)
    rels = [r for r in RELATIONS if _relation_holds(r, a, b)]
    rel = rng.choice(rels)
    return RelationPred(_describe(a, rng.choice(_RELATION_SUBSETS)), rel, _describe(b, rng.choice(_RELATION_SUBSETS)))


def _sample_count(scene: Scene, rng: random.Random) -> Predicate:
    d = _describe(rng.choice(scene.objects), rng.choice(_COUNT_SUBSETS))
    return CountPred(sum(d.matches(o) for o in scene.objects), d)


_SAMPLERS = {"object": _sample_object, "relation": _sample_relation, "count": _sample_count}


def _enumerate(scene: Scene, kind: str) -> list[Predicate]:
    """All captions of ``kind`` true of ``scene`` that the grammar can produce."""
    objs = scene.objects
    if kind == "object":
        return [ObjectPred(_describe(o, s)) for o in objs for s in _OBJECT_SUBSETS]
    if kind == "count":
        out = []
        for o in objs:
            for s in _COUNT_SUBSETS:
                d = _describe(o, s)
                out.append(CountPred(sum(d.matches(x) for x in objs), d))
        return out
    if kind == "relation":
        return [
            RelationPred(_describe(a, sa), r, _describe(b, sb))
            for a in objs
            for b in objs
            if a != b
            for r in RELATIONS
            if _relation_holds(r, a, b)
            for sa in _RELATION_SUBSETS
            for sb in _RELATION_SUBSETS
        ]
    raise ValueError(kind)


def make_captions(scene: Scene, rng: random.Random, n: int = 5) -> list[tuple[str, dict[str, Any]]]:
    """Return ``n`` distinct captions ``(text, predicate_dict)``, all true of ``scene``.

    The first is always the fully specified ``scene`` caption.  The others
    include at least one ``object`` and one ``count`` caption and, when the
    scene has two or more objects, one ``relation`` caption; the remaining
    slots are drawn with :data:`KIND_WEIGHTS`, and the non-scene slots are
    shuffled.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    if not scene.objects:
        raise ValueError("scene has no objects")
    first = ScenePred(scene.objects)
    out: list[tuple[str, dict[str, Any]]] = [(caption_text(first), first.to_dict())]
    seen = {out[0][0]}
    kinds = [k for k in KIND_WEIGHTS if k != "relation" or len(scene.objects) >= 2]
    plan = list(kinds)[: n - 1]
    weights = [KIND_WEIGHTS[k] for k in kinds]
    while len(plan) < n - 1:
        plan.append(rng.choices(kinds, weights=weights)[0])
    rng.shuffle(plan)
    for kind in plan:
        for _ in range(64):
            p = _SAMPLERS[kind](scene, rng)
            t = caption_text(p)
            if t not in seen:
                break
        else:  # rare: fall back to an exhaustive list of unused captions, any kind
            pool = {caption_text(q): q for k in [kind] + kinds for q in _enumerate(scene, k)}
            unused = sorted(t for t in pool if t not in seen)
            if not unused:
                raise ValueError(f"cannot write {n} distinct captions for {scene}")
            t = rng.choice(unused)
            p = pool[t]
        seen.add(t)
        out.append((t, p.to_dict()))
    return out


# --------------------------------------------------------------------------
# Vectorised relevance
# --------------------------------------------------------------------------


class SceneTable:
    """Per-scene attribute tables (numpy) for evaluating predicates on many scenes at once.

    ``matches(pred)`` returns a boolean vector over the scenes and agrees
    exactly with :func:`caption_matches`.
    """

    def __init__(self, scenes: Sequence[Scene]) -> None:
        self.scenes = list(scenes)
        n = len(self.scenes)
        width = max([MAX_OBJECTS] + [len(s.objects) for s in self.scenes])
        self.valid = np.zeros((n, width), dtype=bool)
        self.attrs = {f: np.full((n, width), -1, dtype=np.int8) for f in _DESC_FIELDS}
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
        for f in _DESC_FIELDS:
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


# --------------------------------------------------------------------------
# World generation
# --------------------------------------------------------------------------

SPLITS: tuple[str, ...] = ("train", "val", "test")
RELEVANCE_FORMAT = "vlp-relevance-v1"


def _rng(seed: int, split: str, index: int, purpose: str) -> random.Random:
    """An independent RNG per (seed, split, image, purpose); stable across Python runs."""
    digest = hashlib.sha256(f"vlp-shapes-world/{seed}/{split}/{index}/{purpose}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _write_json(path: Path, obj: Any) -> None:
    """Write compact ASCII JSON atomically (temp file in the same directory, then ``os.replace``)."""
    from vlp.data.formats import write_json_atomic

    write_json_atomic(path, obj, separators=(",", ":"), ensure_ascii=True)


def _write_npy(path: Path, arr: np.ndarray) -> None:
    """Write a ``.npy`` array atomically (like :func:`_write_json`)."""
    from vlp.data.formats import write_atomic

    write_atomic(path, lambda f: np.save(f, arr, allow_pickle=False), binary=True)


_IMAGE_NAME = re.compile(r"^(train|val|test)_\d{6}\.png$")


def generate_world(
    out: str | Path,
    seed: int = 0,
    n_train: int = 4000,
    n_val: int = 200,
    n_test: int = 1000,
    image_size: int = 64,
    progress: bool = True,
    vqa_per_image: int = 3,
    nlvr_per_image: int = 2,
    nlvr_templates: Sequence[str] | None = None,
) -> dict[str, Path]:
    """Generate a shapes world under ``out`` and return the written paths.

    Writes ``images/{split}/{split}_{i:06d}.png``, ``pretrain.json``, ``helper.json`` (the scene
    captions only: the clean caption set of the SRCL helper),
    ``retrieval_{train,val,test}.json``, ``relevance_{val,test}.json``,
    ``relevance_graded_{val,test}.npy`` (float32 [texts, images], :func:`caption_grade`),
    ``scenes.json``, and the downstream tasks of :mod:`vlp.data.synthetic_tasks`:
    ``vqa_{train,val,test}.json`` (up to ``vqa_per_image`` questions per image; test without
    answers), ``vqa_test_annotations.json``, ``answer_list.json`` and
    ``nlvr_{train,dev,test}.json`` (``nlvr_per_image`` statements per image of the split, the
    ``nlvr_templates`` (default: all of ``NLVR_TEMPLATES``) in equal shares) (see
    ``docs/shapes_world.md``).  Deterministic: the same arguments give byte-identical files and
    images; the task files draw from their own RNGs, so the other files do not depend on
    ``vqa_per_image`` / ``nlvr_per_image``.  Returns a dict with keys ``pretrain, helper,
    retrieval_train, retrieval_val, retrieval_test, relevance_val, relevance_test,
    relevance_graded_val, relevance_graded_test, scenes, vqa_train, vqa_val, vqa_test,
    vqa_test_annotations, answer_list, nlvr_train, nlvr_dev, nlvr_test, root``.
    """
    from tqdm.auto import tqdm

    from vlp.data.synthetic_tasks import NLVR_TEMPLATES, check_templates, write_task_files

    templates = check_templates(nlvr_templates if nlvr_templates is not None else NLVR_TEMPLATES)
    root = Path(out)
    counts = {"train": n_train, "val": n_val, "test": n_test}
    for split, n in counts.items():
        if n < 0:
            raise ValueError(f"n_{split} must be >= 0")
    records: dict[str, list[dict[str, Any]]] = {}
    scenes: dict[str, list[Scene]] = {}
    for split in SPLITS:
        img_dir = root / "images" / split
        img_dir.mkdir(parents=True, exist_ok=True)
        written = set()
        records[split], scenes[split] = [], []
        for i in tqdm(range(counts[split]), desc=f"shapes world [{split}]", disable=not progress, leave=False):
            scene = sample_scene(_rng(seed, split, i, "scene"))
            caps = make_captions(scene, _rng(seed, split, i, "captions"))
            name = f"{split}_{i:06d}.png"
            render_scene(scene, image_size, _rng(seed, split, i, "render")).save(img_dir / name, format="PNG")
            written.add(name)
            scenes[split].append(scene)
            records[split].append(
                {
                    "image": f"images/{split}/{name}",
                    "objects": scene_to_dict(scene)["objects"],
                    "captions": [{"text": t, "predicate": p} for t, p in caps],
                }
            )
        for stale in img_dir.iterdir():  # leftovers of an earlier, larger world
            if _IMAGE_NAME.match(stale.name) and stale.name not in written:
                stale.unlink()

    paths = {
        "pretrain": root / "pretrain.json",
        "helper": root / "helper.json",
        "retrieval_train": root / "retrieval_train.json",
        "retrieval_val": root / "retrieval_val.json",
        "retrieval_test": root / "retrieval_test.json",
        "relevance_val": root / "relevance_val.json",
        "relevance_test": root / "relevance_test.json",
        "relevance_graded_val": root / "relevance_graded_val.npy",
        "relevance_graded_test": root / "relevance_graded_test.npy",
        "scenes": root / "scenes.json",
    }
    texts = {s: [[c["text"] for c in r["captions"]] for r in records[s]] for s in SPLITS}
    _write_json(paths["pretrain"], [{"image": r["image"], "caption": t} for r, t in zip(records["train"], texts["train"])])
    # the "human-quality" caption set of the SRCL helper: the fully specified scene captions
    _write_json(paths["helper"], [{"image": r["image"], "caption": t[0]} for r, t in zip(records["train"], texts["train"])])
    _write_json(
        paths["retrieval_train"],
        [
            {"image": r["image"], "caption": c, "image_id": Path(r["image"]).stem}
            for r, t in zip(records["train"], texts["train"])
            for c in t
        ],
    )
    for split in ("val", "test"):
        _write_json(
            paths[f"retrieval_{split}"],
            [{"image": r["image"], "caption": t} for r, t in zip(records[split], texts[split])],
        )
        preds = [c["predicate"] for r in records[split] for c in r["captions"]]
        owners = [i for i, r in enumerate(records[split]) for _ in r["captions"]]
        relevant = compute_relevance(preds, scenes[split])
        for k, (own, rel) in enumerate(zip(owners, relevant)):
            if own not in rel:  # a caption must be true of its own image
                raise AssertionError(f"{split} text {k} does not match its own image {own}")
        _write_json(
            paths[f"relevance_{split}"],
            {
                "format": RELEVANCE_FORMAT,
                "annotation": paths[f"retrieval_{split}"].name,
                "num_images": len(records[split]),
                "texts": [c for t in texts[split] for c in t],
                "relevant_images": relevant,
            },
        )
        graded = compute_graded_relevance(preds, scenes[split])
        exact = np.zeros(graded.shape, dtype=bool)
        for k, rel in enumerate(relevant):
            exact[k, rel] = True
        if not np.array_equal(graded == 1.0, exact):  # graded 1.0 exactly where the caption is true
            raise AssertionError(f"{split}: graded relevance disagrees with the relevance lists")
        _write_npy(paths[f"relevance_graded_{split}"], graded)
    _write_json(
        paths["scenes"],
        {
            "seed": seed,
            "image_size": image_size,
            "attributes": {"shapes": list(SHAPES), "colors": list(COLORS), "sizes": list(SIZES)},
            "splits": records,
        },
    )
    images = {s: [r["image"] for r in records[s]] for s in SPLITS}
    paths.update(write_task_files(root, seed, scenes, images, vqa_per_image, nlvr_per_image, templates))
    return {**paths, "root": root}


def write_generic_mix(root: str | Path, generic_share: float, seed: int = 0, out: str | Path | None = None) -> Path:
    """A pretraining file over the training images of the world at ``root`` in which a share
    ``generic_share`` of the images are described only by their generic captions (object,
    relation, count: each true of many images, hence false negatives of one another) and the
    rest only by their fully specified scene caption. Written to ``out`` (default
    ``root/pretrain_generic_<share>.json``); deterministic in ``seed``."""
    if not 0.0 <= generic_share <= 1.0:
        raise ValueError(f"generic_share must be in [0, 1], got {generic_share}")
    root = Path(root)
    records = json.loads((root / "scenes.json").read_text())["splits"]["train"]
    path = Path(out) if out is not None else root / f"pretrain_generic_{generic_share:g}.json"
    relative = path.parent.resolve() == root.resolve()  # image paths resolve against the file's folder
    items = []
    for i, r in enumerate(records):
        texts = [c["text"] for c in r["captions"]]
        generic = _rng(seed, "train", i, "generic-mix").random() < generic_share
        image = r["image"] if relative else str((root / r["image"]).resolve())
        items.append({"image": image, "caption": texts[1:] if generic and len(texts) > 1 else texts[0]})
    _write_json(path, items)
    return path
