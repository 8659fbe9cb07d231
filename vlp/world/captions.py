"""Caption text of the shapes world: predicate <-> text, and the five captions of an image.

:func:`caption_text` writes the caption of a predicate (:mod:`vlp.world.predicates`)
and :func:`parse_caption` reads it back, so the text determines the predicate.
:func:`make_captions` draws an image's five distinct captions, all true of its scene: the fully
specified ``scene`` caption first, then ``object``, ``relation`` and ``count`` captions.
"""

from __future__ import annotations

import random
from dataclasses import asdict
from typing import Any, Collection, Optional, Sequence

from vlp.world.phrases import (
    NUMBER_WORDS,
    attribute_sets,
    noun_phrase,
    parse_article_phrase,
    parse_noun_phrase,
    with_article,
)
from vlp.world.predicates import (
    RELATIONS,
    CountPred,
    ObjectPred,
    Predicate,
    RelationPred,
    ScenePred,
    predicate_from_dict,
    relation_holds,
)
from vlp.world.scene import DESC_FIELDS, MAX_OBJECTS, Desc, Obj, Scene, count_matching, describe

__all__ = [
    "CAPTION_KINDS",
    "KIND_WEIGHTS",
    "caption_text",
    "parse_caption",
    "make_captions",
    "draw_caption",
]

CAPTION_KINDS: tuple[str, ...] = ("scene", "object", "relation", "count")
#: weights of the non-scene kinds for the free caption slots
KIND_WEIGHTS: dict[str, float] = {"object": 0.35, "relation": 0.35, "count": 0.30}
#: a count caption counts the objects of one image
_COUNT_WORDS: tuple[str, ...] = NUMBER_WORDS[: MAX_OBJECTS + 1]


# --------------------------------------------------------------------------
# Caption text <-> predicate
# --------------------------------------------------------------------------


def _with_article(d: Desc) -> str:
    return with_article(noun_phrase(d))


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
        if p.n >= len(_COUNT_WORDS):
            raise ValueError(f"no number word for {p.n}")
        return f"{_COUNT_WORDS[p.n]} {noun_phrase(p.object, plural=p.n != 1)}"
    raise TypeError(f"not a predicate: {pred!r}")


def parse_caption(text: str) -> dict[str, Any]:
    """Parse a shapes-world caption back into its predicate dict.

    Inverse of :func:`caption_text`; raises ``ValueError`` for text outside
    the grammar.  Shows that caption text determines the predicate uniquely.
    """
    tokens = text.split()
    if not tokens:
        raise ValueError("empty caption")
    if tokens[0] in _COUNT_WORDS:
        n = _COUNT_WORDS.index(tokens[0])
        d = parse_noun_phrase(tokens[1:], plural=n != 1)
        if d.row is not None:
            raise ValueError("count captions carry no position")
        return CountPred(n, d).to_dict()
    for rel, words in RELATIONS.items():
        w = words.split()
        for k in range(1, len(tokens) - len(w) + 1):
            if tokens[k : k + len(w)] == w:
                a = parse_article_phrase(tokens[:k])
                b = parse_article_phrase(tokens[k + len(w) :])
                return RelationPred(a, rel, b).to_dict()
    parts: list[list[str]] = [[]]
    for t in tokens:
        if t == "and":
            parts.append([])
        else:
            parts[-1].append(t)
    descs = [parse_article_phrase(p) for p in parts]
    full = [all(getattr(d, f) is not None for f in DESC_FIELDS) for d in descs]
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
_OBJECT_SUBSETS: tuple[frozenset[str], ...] = attribute_sets(
    "color",
    "shape",
    "size color",
    "size shape",
    "color shape",
    "color pos",
    "shape pos",
    "size color shape",
    "size color pos",
    "size shape pos",
    "color shape pos",
)
# relation descriptions: non-empty subsets of {size, colour, shape} with shape or colour
_RELATION_SUBSETS: tuple[frozenset[str], ...] = attribute_sets(
    "color", "shape", "size color", "size shape", "color shape", "size color shape"
)
# count descriptions: any subset of {size, colour, shape} (empty = "shapes")
_COUNT_SUBSETS: tuple[frozenset[str], ...] = (frozenset(),) + _RELATION_SUBSETS + (frozenset({"size"}),)


def _sample_object(scene: Scene, rng: random.Random) -> Predicate:
    return ObjectPred(describe(rng.choice(scene.objects), rng.choice(_OBJECT_SUBSETS)))


def _sample_relation(scene: Scene, rng: random.Random) -> Predicate:
    a, b = rng.sample(scene.objects, 2)
    rels = [r for r in RELATIONS if relation_holds(r, a, b)]
    rel = rng.choice(rels)
    return RelationPred(describe(a, rng.choice(_RELATION_SUBSETS)), rel, describe(b, rng.choice(_RELATION_SUBSETS)))


def _sample_count(scene: Scene, rng: random.Random) -> Predicate:
    d = describe(rng.choice(scene.objects), rng.choice(_COUNT_SUBSETS))
    return CountPred(count_matching(scene, d), d)


_SAMPLERS = {"object": _sample_object, "relation": _sample_relation, "count": _sample_count}


def _enumerate(scene: Scene, kind: str) -> list[Predicate]:
    """All captions of ``kind`` true of ``scene`` that the grammar can produce."""
    objs = scene.objects
    if kind == "object":
        return [ObjectPred(describe(o, s)) for o in objs for s in _OBJECT_SUBSETS]
    if kind == "count":
        descs = [describe(o, s) for o in objs for s in _COUNT_SUBSETS]
        return [CountPred(count_matching(scene, d), d) for d in descs]
    if kind == "relation":
        return [
            RelationPred(describe(a, sa), r, describe(b, sb))
            for a in objs
            for b in objs
            if a != b
            for r in RELATIONS
            if relation_holds(r, a, b)
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
        drawn = draw_caption(scene, kind, rng, seen, fallback=kinds)
        if drawn is None:
            raise ValueError(f"cannot write {n} distinct captions for {scene}")
        t, p = drawn
        seen.add(t)
        out.append((t, p.to_dict()))
    return out


def draw_caption(
    scene: Scene, kind: str, rng: random.Random, seen: Collection[str], fallback: Sequence[str] = ()
) -> Optional[tuple[str, Predicate]]:
    """A caption ``(text, predicate)`` of ``kind`` (``object``, ``relation`` or ``count``) true of
    ``scene`` whose text is not in ``seen``, or None if the grammar has none left.

    Up to 64 draws of the kind's sampler; if all are in ``seen`` (rare), a uniform choice among the
    unused captions of the exhaustive lists of ``kind`` and the ``fallback`` kinds (sorted by text),
    so the caption may then be of a fallback kind. A ``relation`` needs two objects.
    """
    if kind == "relation" and len(scene.objects) < 2:
        return None
    for _ in range(64):
        p = _SAMPLERS[kind](scene, rng)
        t = caption_text(p)
        if t not in seen:
            return t, p
    pool = {caption_text(q): q for k in [kind, *fallback] for q in _enumerate(scene, k)}
    unused = sorted(t for t in pool if t not in seen)
    if not unused:
        return None
    t = rng.choice(unused)
    return t, pool[t]
