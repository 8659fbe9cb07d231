"""Downstream tasks of the shapes world: VQA questions and NLVR2 statements.

Both are generated from the exact scenes of :mod:`vlp.data.synthetic`, so every answer and
every label is known exactly (``docs/shapes_world.md``).

VQA
---
Per image up to ``vqa_per_image`` questions of distinct types, each unambiguous for its scene:

``color``     "what color is the large square" (the description picks exactly one object)
``shape``     "what shape is the red object"
``count``     "how many blue shapes are there" -> "0".."4"
``position``  "where is the green diamond" -> "top left", "top", ..., "bottom right"
``yes/no``    "is there a purple square" -> "yes" / "no" (balanced per split)

Each question gets :data:`N_ANNOTATORS` simulated annotator answers: the true answer with
probability :data:`ANNOTATOR_ACCURACY`, otherwise another answer of the same type.

NLVR2
-----
A statement about an ordered image pair (left = image 0, right = image 1), from one of
:data:`NLVR_TEMPLATES`; "left" / "right" only ever name an image, so swapping the images
together with the words keeps the label. Every statement is a function of the counts
``(c_left, c_right)`` of one description in the two images; the labels are balanced per
template, and a statement's wording is drawn independently of its label.

Public API: :func:`question_text`, :func:`parse_question`, :func:`answer_question`,
:func:`make_vqa_records`, :func:`vqa_test_record`, :func:`make_answer_list`,
:class:`Statement`, :func:`statement_text`, :func:`parse_statement`, :func:`statement_label`,
:func:`make_nlvr_records`, :func:`write_task_files`.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from vlp.data.synthetic import (
    CELL_PHRASES,
    COLORS,
    MAX_OBJECTS,
    SHAPES,
    SIZES,
    Desc,
    Obj,
    Scene,
    _describe,
    _rng,
    _write_json,
)

__all__ = [
    "QUESTION_TYPES",
    "TYPE_ANSWERS",
    "POSITION_WORDS",
    "N_ANNOTATORS",
    "ANNOTATOR_ACCURACY",
    "NLVR_TEMPLATES",
    "check_templates",
    "question_text",
    "parse_question",
    "answer_question",
    "question_id",
    "make_vqa_records",
    "vqa_test_record",
    "make_answer_list",
    "Statement",
    "statement_text",
    "parse_statement",
    "statement_label",
    "make_nlvr_records",
    "write_task_files",
]

QUESTION_TYPES: tuple[str, ...] = ("color", "shape", "count", "position", "yes/no")
#: answers to a cell question: the cell phrase without its preposition
POSITION_WORDS: dict[tuple[int, int], str] = {c: p.split(" ", 1)[1].removeprefix("the ") for c, p in CELL_PHRASES.items()}
_PHRASE_CELLS: dict[str, tuple[int, int]] = {v: k for k, v in CELL_PHRASES.items()}
#: every possible answer of each question type (annotator noise stays within the type)
TYPE_ANSWERS: dict[str, tuple[str, ...]] = {
    "color": COLORS,
    "shape": SHAPES,
    "count": tuple(str(n) for n in range(MAX_OBJECTS + 1)),
    "position": tuple(POSITION_WORDS.values()),
    "yes/no": ("yes", "no"),
}
N_ANNOTATORS = 10
ANNOTATOR_ACCURACY = 0.9

_PREFIXES: dict[str, str] = {
    "color": "what color is the ",
    "shape": "what shape is the ",
    "position": "where is the ",
    "count": "how many ",
    "yes/no": "is there ",
}
# referring descriptions: every non-empty subset of the attributes the question does not ask for
_REFER_FROM: dict[str, tuple[str, ...]] = {"color": ("size", "shape", "pos"), "shape": ("size", "color", "pos"),
                                           "position": ("size", "color", "shape")}
_YESNO_SUBSETS: tuple[frozenset[str], ...] = tuple(frozenset(s) for s in (
    {"color"}, {"shape"}, {"size", "color"}, {"size", "shape"}, {"color", "shape"},
    {"size", "color", "shape"}, {"color", "pos"}, {"shape", "pos"},
))
_COUNT_SUBSETS: tuple[frozenset[str], ...] = tuple(frozenset(s) for s in (
    set(), {"size"}, {"color"}, {"shape"}, {"size", "color"}, {"size", "shape"}, {"color", "shape"},
    {"size", "color", "shape"},
))
#: share of count questions about a random description (often answered "0")
RANDOM_COUNT_SHARE = 0.25
_SPLIT_CODES = {"train": 0, "val": 1, "test": 2}
_MAX_IMAGES = 10**7


def _subsets(attrs: Sequence[str]) -> list[frozenset[str]]:
    """All non-empty subsets of ``attrs``."""
    return [frozenset(a for j, a in enumerate(attrs) if m >> j & 1) for m in range(1, 2 ** len(attrs))]


_REFER_SUBSETS: dict[str, list[frozenset[str]]] = {t: _subsets(a) for t, a in _REFER_FROM.items()}


# --------------------------------------------------------------------------
# Noun phrases
# --------------------------------------------------------------------------


def _phrase(d: Desc, noun: str, plural: bool = False) -> str:
    """``[size] [colour] noun [cell phrase]``; ``noun`` is used when ``d`` gives no shape."""
    base = d.shape if d.shape is not None else noun
    words = [w for w in (d.size, d.color) if w is not None] + [base + "s" if plural else base]
    if d.row is not None:
        words.append(CELL_PHRASES[(d.row, d.col)])
    return " ".join(words)


def _article(phrase: str) -> str:
    return f"{'an' if phrase[0] in 'aeiou' else 'a'} {phrase}"


def _parse_phrase(tokens: list[str], nouns: tuple[str, ...], plural: bool) -> Desc:
    """Inverse of :func:`_phrase`; raises ``ValueError`` outside the grammar."""
    size = tokens.pop(0) if tokens and tokens[0] in SIZES else None
    color = tokens.pop(0) if tokens and tokens[0] in COLORS else None
    if not tokens:
        raise ValueError("missing noun")
    noun = tokens.pop(0)
    if plural:
        if not noun.endswith("s"):
            raise ValueError(f"expected a plural noun, got {noun!r}")
        noun = noun[:-1]
    if noun not in SHAPES and noun not in nouns:
        raise ValueError(f"unknown noun {noun!r}")
    cell = _PHRASE_CELLS.get(" ".join(tokens)) if tokens else None
    if tokens and cell is None:
        raise ValueError(f"unknown position phrase {' '.join(tokens)!r}")
    row, col = cell if cell else (None, None)
    return Desc(noun if noun in SHAPES else None, color, size, row, col)


def _count(scene: Scene, d: Desc) -> int:
    return sum(d.matches(o) for o in scene.objects)


# --------------------------------------------------------------------------
# VQA: questions and answers
# --------------------------------------------------------------------------


def question_text(qtype: str, d: Desc) -> str:
    """The question of type ``qtype`` about description ``d`` (lowercase ``[a-z ]``)."""
    if qtype in _REFER_FROM:
        return _PREFIXES[qtype] + _phrase(d, "object")
    if qtype == "count":
        return f"how many {_phrase(d, 'shape', plural=True)} are there"
    if qtype == "yes/no":
        return "is there " + _article(_phrase(d, "shape"))
    raise ValueError(f"unknown question type {qtype!r}")


def parse_question(text: str) -> tuple[str, Desc]:
    """Inverse of :func:`question_text`: ``(question type, description)``."""
    for qtype, prefix in _PREFIXES.items():
        if not text.startswith(prefix):
            continue
        tokens = text[len(prefix):].split()
        if qtype == "count":
            if tokens[-2:] != ["are", "there"]:
                raise ValueError(f"not a count question: {text!r}")
            return qtype, _parse_phrase(tokens[:-2], ("shape",), plural=True)
        if qtype == "yes/no":
            if not tokens or tokens[0] not in ("a", "an"):
                raise ValueError(f"missing article: {text!r}")
            return qtype, _parse_phrase(tokens[1:], ("shape",), plural=False)
        return qtype, _parse_phrase(tokens, ("object",), plural=False)
    raise ValueError(f"not a shapes-world question: {text!r}")


def _referent(scene: Scene, d: Desc) -> Obj:
    found = [o for o in scene.objects if d.matches(o)]
    if len(found) != 1:
        raise ValueError(f"description {d} matches {len(found)} objects, expected exactly one")
    return found[0]


def _answer(qtype: str, d: Desc, scene: Scene) -> str:
    if qtype == "color":
        return _referent(scene, d).color
    if qtype == "shape":
        return _referent(scene, d).shape
    if qtype == "position":
        o = _referent(scene, d)
        return POSITION_WORDS[(o.row, o.col)]
    if qtype == "count":
        return str(_count(scene, d))
    if qtype == "yes/no":
        return "yes" if _count(scene, d) else "no"
    raise ValueError(f"unknown question type {qtype!r}")


def answer_question(text: str, scene: Scene) -> str:
    """The true answer of a shapes-world question on ``scene`` (``ValueError`` if ambiguous)."""
    return _answer(*parse_question(text), scene)


def _unique_referents(scene: Scene, o: Obj, qtype: str) -> list[Desc]:
    """Descriptions of ``o`` without the asked attribute that match no other object."""
    descs = [_describe(o, s) for s in _REFER_SUBSETS[qtype]]
    return [d for d in descs if _count(scene, d) == 1]


def _referable(scene: Scene, qtype: str) -> list[Obj]:
    """Objects that some description without the asked attribute singles out: any object for
    colour and shape (its cell does), for position one whose size, colour and shape are unique."""
    if qtype != "position":
        return list(scene.objects)
    triples = Counter((o.size, o.color, o.shape) for o in scene.objects)
    return [o for o in scene.objects if triples[(o.size, o.color, o.shape)] == 1]


def _feasible_types(scene: Scene) -> list[str]:
    """Question types with a well-defined answer for ``scene``."""
    return [t for t in QUESTION_TYPES if t != "position" or _referable(scene, t)]


def _question_types(scene: Scene, k: int, rng: random.Random) -> list[str]:
    """``k`` distinct feasible question types in random order (fewer if fewer are feasible)."""
    feasible = _feasible_types(scene)
    return rng.sample(feasible, min(k, len(feasible)))


def _random_desc(attrs: frozenset[str], rng: random.Random) -> Desc:
    cell = rng.randrange(9)
    return Desc(
        shape=rng.choice(SHAPES) if "shape" in attrs else None,
        color=rng.choice(COLORS) if "color" in attrs else None,
        size=rng.choice(SIZES) if "size" in attrs else None,
        row=cell // 3 if "pos" in attrs else None,
        col=cell % 3 if "pos" in attrs else None,
    )


def _sample_referring(scene: Scene, qtype: str, rng: random.Random) -> Desc:
    return rng.choice(_unique_referents(scene, rng.choice(_referable(scene, qtype)), qtype))


def _sample_count(scene: Scene, rng: random.Random) -> Desc:
    attrs = rng.choice(_COUNT_SUBSETS)
    if rng.random() < RANDOM_COUNT_SHARE:
        return _random_desc(attrs, rng)
    return _describe(rng.choice(scene.objects), attrs)


def _sample_yesno(scene: Scene, yes: bool, rng: random.Random) -> Desc:
    """A description of an object that is (``yes``) or is not in the scene; the attribute
    subset is drawn independently of ``yes`` (redrawn only in the rare scenes that hold
    every value of a subset)."""
    while True:
        attrs = rng.choice(_YESNO_SUBSETS)
        if yes:
            return _describe(rng.choice(scene.objects), attrs)
        for _ in range(64):
            d = _random_desc(attrs, rng)
            if not _count(scene, d):
                return d


def _make_question(scene: Scene, qtype: str, rng: random.Random, yes: bool) -> Desc:
    if qtype in _REFER_FROM:
        return _sample_referring(scene, qtype, rng)
    if qtype == "count":
        return _sample_count(scene, rng)
    return _sample_yesno(scene, yes, rng)


def _annotators(qtype: str, truth: str, rng: random.Random) -> list[str]:
    """:data:`N_ANNOTATORS` answers: the truth w.p. :data:`ANNOTATOR_ACCURACY`, else another of the type."""
    others = [a for a in TYPE_ANSWERS[qtype] if a != truth]
    return [truth if rng.random() < ANNOTATOR_ACCURACY else rng.choice(others) for _ in range(N_ANNOTATORS)]


def question_id(split: str, image_index: int, k: int) -> int:
    """World-unique id of question ``k`` of image ``image_index``: ``(split code * 10^7 + index) * 10 + k``."""
    if not 0 <= image_index < _MAX_IMAGES or not 0 <= k < 10:
        raise ValueError(f"question ids need image index < {_MAX_IMAGES} and k < 10, got {image_index}, {k}")
    return (_SPLIT_CODES[split] * _MAX_IMAGES + image_index) * 10 + k


def _yes_plan(n: int, rng: random.Random) -> list[bool]:
    """``n`` yes/no targets, half yes (the odd one drawn at random), shuffled."""
    plan = [k % 2 == 0 for k in range(n)]
    if n % 2 and rng.random() < 0.5:
        plan[-1] = False
    rng.shuffle(plan)
    return plan


def make_vqa_records(scenes: Sequence[Scene], images: Sequence[str], split: str, seed: int,
                     per_image: int = 3) -> list[dict[str, Any]]:
    """VQA records (with answers and ``question_type``) for one split of the world.

    Per image ``min(per_image, feasible types)`` questions of distinct types (drawn from
    ``_rng(seed, split, i, "vqa-types")``, the question from ``"vqa"``); the yes/no answers
    of the split are balanced by a shuffled plan (``"vqa-yesno"``).
    """
    if not 0 <= per_image <= len(QUESTION_TYPES):
        raise ValueError(f"vqa_per_image must be in 0..{len(QUESTION_TYPES)}, got {per_image}")
    types = [_question_types(s, per_image, _rng(seed, split, i, "vqa-types")) for i, s in enumerate(scenes)]
    yes = iter(_yes_plan(sum(t.count("yes/no") for t in types), _rng(seed, split, 0, "vqa-yesno")))
    records = []
    for i, (scene, image, qtypes) in enumerate(zip(scenes, images, types)):
        rng = _rng(seed, split, i, "vqa")
        for k, qtype in enumerate(qtypes):
            d = _make_question(scene, qtype, rng, next(yes) if qtype == "yes/no" else False)
            text, truth = question_text(qtype, d), _answer(qtype, d, scene)
            if parse_question(text) != (qtype, d) or answer_question(text, scene) != truth:
                raise AssertionError(f"{split} image {i}: question {text!r} does not round-trip")
            records.append({"question_id": question_id(split, i, k), "question": text,
                            "answer": _annotators(qtype, truth, rng), "image": image,
                            "dataset": "vqa", "question_type": qtype})
    return records


def vqa_test_record(record: dict[str, Any]) -> dict[str, Any]:
    """The VQA test form of a record: without ``answer`` and ``question_type``."""
    return {k: v for k, v in record.items() if k not in ("answer", "question_type")}


def make_answer_list(train: Sequence[dict[str, Any]], val: Sequence[dict[str, Any]] = ()) -> list[str]:
    """Every distinct annotator answer of ``train`` + ``val``, by descending count of annotator
    answers in ``train``, ties alphabetically."""
    freq = Counter(a for r in train for a in r["answer"])
    every = {a for r in (*train, *val) for a in r["answer"]}
    return sorted(every, key=lambda a: (-freq[a], a))


# --------------------------------------------------------------------------
# NLVR2: statements about image pairs
# --------------------------------------------------------------------------

NUMBER_WORDS: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight")
SIDES: tuple[str, ...] = ("left", "right")
_OTHER = {"left": "right", "right": "left"}

#: a template's label as a function of (c_left, c_right, side, n)
_LabelFn = Callable[[int, int, Optional[str], Optional[int]], bool]


def _side(cl: int, cr: int, side: Optional[str]) -> tuple[int, int]:
    """(count of the named image, count of the other one)."""
    return (cl, cr) if side == "left" else (cr, cl)


#: template -> (label function, description families: "any" = shapes, "shape", "color", "color_shape")
_TEMPLATES: dict[str, tuple[_LabelFn, tuple[str, ...]]] = {
    "more": (lambda cl, cr, s, n: _side(cl, cr, s)[0] > _side(cl, cr, s)[1], ("any", "shape", "color")),
    "contains": (lambda cl, cr, s, n: _side(cl, cr, s)[0] > 0, ("shape", "color", "color_shape")),
    "exactly": (lambda cl, cr, s, n: _side(cl, cr, s)[0] == n, ("any", "shape", "color")),
    "both": (lambda cl, cr, s, n: cl > 0 and cr > 0, ("shape", "color", "color_shape")),
    "one_image": (lambda cl, cr, s, n: (cl > 0) != (cr > 0), ("shape", "color", "color_shape")),
    "neither": (lambda cl, cr, s, n: cl == 0 and cr == 0, ("shape", "color", "color_shape")),
    "total": (lambda cl, cr, s, n: cl + cr == n, ("any", "shape", "color")),
    "same": (lambda cl, cr, s, n: cl == cr, ("any", "shape", "color")),
}
NLVR_TEMPLATES: tuple[str, ...] = tuple(_TEMPLATES)
_SIDED = ("more", "contains", "exactly")
_N_RANGE: dict[str, tuple[int, int]] = {"exactly": (1, 4), "total": (2, 6)}


@dataclass(frozen=True)
class Statement:
    """An NLVR statement: a template about the counts of ``desc`` in the two images."""

    template: str
    desc: Desc
    side: Optional[str] = None  # "left" | "right" for the sided templates
    n: Optional[int] = None  # for "exactly" and "total"


def statement_text(st: Statement) -> str:
    """The sentence of a statement; "left"/"right" only in "the left/right image"."""
    one, many = _article(_phrase(st.desc, "shape")), _phrase(st.desc, "shape", plural=True)
    t, side = st.template, st.side
    if t == "more":
        return f"the {side} image has more {many} than the {_OTHER[side]} image"
    if t == "contains":
        return f"the {side} image contains {one}"
    if t == "exactly":
        noun = _phrase(st.desc, "shape", plural=st.n != 1)
        return f"the {side} image has exactly {NUMBER_WORDS[st.n]} {noun}"
    if t == "both":
        return f"both images contain {one}"
    if t == "one_image":
        return f"exactly one image contains {one}"
    if t == "neither":
        return f"neither image contains {one}"
    if t == "total":
        return f"there are {NUMBER_WORDS[st.n]} {many} in total"
    if t == "same":
        return f"both images have the same number of {many}"
    raise ValueError(f"unknown NLVR template {t!r}")


def _one(tokens: list[str]) -> Desc:
    if not tokens or tokens[0] not in ("a", "an"):
        raise ValueError("missing article")
    return _parse_phrase(tokens[1:], ("shape",), plural=False)


def _many(tokens: list[str]) -> Desc:
    return _parse_phrase(tokens, ("shape",), plural=True)


def parse_statement(text: str) -> Statement:
    """Inverse of :func:`statement_text` (``ValueError`` outside the grammar)."""
    w = text.split()
    if len(w) > 4 and w[0] == "the" and w[1] in SIDES and w[2] == "image":
        side = w[1]
        if w[3:5] == ["has", "more"] and w[-4:] == ["than", "the", _OTHER[side], "image"]:
            return Statement("more", _many(w[5:-4]), side)
        if w[3] == "contains":
            return Statement("contains", _one(w[4:]), side)
        if w[3:5] == ["has", "exactly"] and len(w) > 6 and w[5] in NUMBER_WORDS:
            n = NUMBER_WORDS.index(w[5])
            return Statement("exactly", _parse_phrase(w[6:], ("shape",), plural=n != 1), side, n)
    if w[:3] == ["both", "images", "contain"]:
        return Statement("both", _one(w[3:]))
    if w[:4] == ["exactly", "one", "image", "contains"]:
        return Statement("one_image", _one(w[4:]))
    if w[:3] == ["neither", "image", "contains"]:
        return Statement("neither", _one(w[3:]))
    if w[:2] == ["there", "are"] and w[-2:] == ["in", "total"] and len(w) > 4 and w[2] in NUMBER_WORDS:
        return Statement("total", _many(w[3:-2]), None, NUMBER_WORDS.index(w[2]))
    if w[:7] == ["both", "images", "have", "the", "same", "number", "of"]:
        return Statement("same", _many(w[7:]))
    raise ValueError(f"not a shapes-world NLVR statement: {text!r}")


def _label_from_counts(st: Statement, cl: int, cr: int) -> bool:
    return _TEMPLATES[st.template][0](cl, cr, st.side, st.n)


def statement_label(st: Statement | str, left: Scene, right: Scene) -> bool:
    """Truth of a statement (or its sentence) for the ordered pair (left, right)."""
    if isinstance(st, str):
        st = parse_statement(st)
    return _label_from_counts(st, _count(left, st.desc), _count(right, st.desc))


def _sample_statement(template: str, rng: random.Random) -> Statement:
    """Wording drawn independently of the label: description family, values, side, number."""
    family = rng.choice(_TEMPLATES[template][1])
    desc = Desc(
        shape=rng.choice(SHAPES) if family in ("shape", "color_shape") else None,
        color=rng.choice(COLORS) if family in ("color", "color_shape") else None,
    )
    side = rng.choice(SIDES) if template in _SIDED else None
    n = rng.randint(*_N_RANGE[template]) if template in _N_RANGE else None
    return Statement(template, desc, side, n)


class _CountIndex:
    """Per description (shape and/or colour): the images of a split grouped by how many objects match it."""

    def __init__(self, scenes: Sequence[Scene]) -> None:
        self.n_images = len(scenes)
        self._counts = [Counter(k for o in s.objects for k in self._keys(o)) for s in scenes]
        self._buckets: dict[Desc, list[list[int]]] = {}
        self._weights: dict[Statement, dict[bool, list[tuple[int, int, int]]]] = {}

    @staticmethod
    def _keys(o: Obj) -> tuple[tuple[Optional[str], Optional[str]], ...]:
        return (None, None), (o.shape, None), (None, o.color), (o.shape, o.color)

    def buckets(self, d: Desc) -> list[list[int]]:
        """``buckets(d)[c]``: the images in which exactly ``c`` objects match ``d``."""
        if d.size is not None or d.row is not None or d.col is not None:
            raise ValueError(f"NLVR descriptions give only shape and colour, got {d}")
        if d not in self._buckets:
            b: list[list[int]] = [[] for _ in range(MAX_OBJECTS + 1)]
            for i, c in enumerate(self._counts):
                b[c[(d.shape, d.color)]].append(i)
            self._buckets[d] = b
        return self._buckets[d]

    def pair_weights(self, st: Statement, label: bool) -> list[tuple[int, int, int]]:
        """(c_left, c_right, number of ordered image pairs) for each count combination giving ``label``
        (distinct images unless the split has a single image)."""
        if st not in self._weights:
            b = self.buckets(st.desc)
            same = 0 if self.n_images == 1 else 1
            out: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
            for cl, left in enumerate(b):
                for cr, right in enumerate(b):
                    w = len(left) * len(right) - (same * len(left) if cl == cr else 0)
                    if w > 0:
                        out[_label_from_counts(st, cl, cr)].append((cl, cr, w))
            self._weights[st] = out
        return self._weights[st][label]

    def sample_pair(self, st: Statement, label: bool, rng: random.Random) -> tuple[int, int]:
        """A uniformly random ordered pair of images for which ``st`` has ``label``."""
        combos = self.pair_weights(st, label)
        cl, cr, _ = rng.choices(combos, weights=[w for _, _, w in combos])[0]
        b = self.buckets(st.desc)
        i = j = rng.choice(b[cl])
        while j == i and self.n_images > 1:  # combos with cl == cr hold >= 2 images
            j = rng.choice(b[cr])
        return i, j


_MAX_DRAWS = 200


def check_templates(templates: Sequence[str]) -> tuple[str, ...]:
    """``templates`` as a tuple, or ``ValueError`` naming the unknown ones and the known set."""
    unknown = [t for t in templates if t not in _TEMPLATES]
    if unknown or not templates:
        raise ValueError(f"NLVR templates {list(unknown) or '(none)'}: expected a non-empty subset of "
                         f"{', '.join(NLVR_TEMPLATES)}")
    return tuple(dict.fromkeys(templates))


def _nlvr_plan(n: int, rng: random.Random, templates: Sequence[str] = NLVR_TEMPLATES) -> list[tuple[str, bool]]:
    """``n`` (template, label) slots: templates in turn, each alternating True/False, shuffled."""
    k = len(templates)
    plan = [(templates[s % k], (s // k) % 2 == 0) for s in range(n)]
    rng.shuffle(plan)
    return plan


def _draw(index: _CountIndex, template: str, label: bool, rng: random.Random) -> tuple[Statement, int, int, bool]:
    """A statement whose both labels occur in the split (so the wording carries no label
    information), and a random pair with the planned ``label``; degenerate splits fall back
    to any label."""
    st = _sample_statement(template, rng)
    for _ in range(_MAX_DRAWS):
        if index.pair_weights(st, True) and index.pair_weights(st, False):
            break
        st = _sample_statement(template, rng)
    else:
        label = bool(index.pair_weights(st, True))
    i, j = index.sample_pair(st, label, rng)
    return st, i, j, label


def make_nlvr_records(scenes: Sequence[Scene], images: Sequence[str], split: str, seed: int,
                      per_image: int = 2, templates: Sequence[str] = NLVR_TEMPLATES) -> list[dict[str, Any]]:
    """``per_image * len(scenes)`` NLVR2 records ``{"images", "sentence", "label"}`` for one split,
    the ``templates`` in equal shares, each half True, half False."""
    if per_image < 0:
        raise ValueError(f"nlvr_per_image must be >= 0, got {per_image}")
    templates = check_templates(templates)
    if not scenes:
        return []
    index = _CountIndex(scenes)
    records = []
    plan = _nlvr_plan(per_image * len(scenes), _rng(seed, split, 0, "nlvr-plan"), templates)
    for s, (template, label) in enumerate(plan):
        st, i, j, label = _draw(index, template, label, _rng(seed, split, s, "nlvr"))
        text = statement_text(st)
        if parse_statement(text) != st or statement_label(text, scenes[i], scenes[j]) != label:
            raise AssertionError(f"{split} statement {s}: {text!r} does not round-trip")
        records.append({"images": [images[i], images[j]], "sentence": text, "label": str(label)})
    return records


# --------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------


def write_task_files(root: Path, seed: int, scenes: dict[str, list[Scene]], images: dict[str, list[str]],
                     vqa_per_image: int = 3, nlvr_per_image: int = 2,
                     nlvr_templates: Sequence[str] = NLVR_TEMPLATES) -> dict[str, Path]:
    """Write the VQA and NLVR2 files of a world under ``root``; returns their paths by key."""
    vqa = {s: make_vqa_records(scenes[s], images[s], s, seed, vqa_per_image) for s in ("train", "val", "test")}
    nlvr = {s: make_nlvr_records(scenes[s], images[s], s, seed, nlvr_per_image, nlvr_templates)
            for s in ("train", "val", "test")}
    files: dict[str, tuple[str, Any]] = {
        "vqa_train": ("vqa_train.json", vqa["train"]),
        "vqa_val": ("vqa_val.json", vqa["val"]),
        "vqa_test": ("vqa_test.json", [vqa_test_record(r) for r in vqa["test"]]),
        "vqa_test_annotations": ("vqa_test_annotations.json", vqa["test"]),
        "answer_list": ("answer_list.json", make_answer_list(vqa["train"], vqa["val"])),
        "nlvr_train": ("nlvr_train.json", nlvr["train"]),
        "nlvr_dev": ("nlvr_dev.json", nlvr["val"]),
        "nlvr_test": ("nlvr_test.json", nlvr["test"]),
    }
    paths = {}
    for key, (name, obj) in files.items():
        paths[key] = root / name
        _write_json(paths[key], obj)
    return paths
