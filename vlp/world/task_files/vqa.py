"""VQA questions of the shapes world, generated from the exact scenes so every answer is known.

Per image up to ``vqa_per_image`` questions of distinct types, each unambiguous for its scene:

``color``     "what color is the large square" (the description picks exactly one object)
``shape``     "what shape is the red object"
``count``     "how many blue shapes are there" -> "0".."4"
``position``  "where is the green diamond" -> "top left", "top", ..., "bottom right"
``yes/no``    "is there a purple square" -> "yes" / "no" (balanced per split)

Each question gets :data:`N_ANNOTATORS` simulated annotator answers: the true answer with
probability :data:`ANNOTATOR_ACCURACY`, otherwise another answer of the same type
(``docs/shapes_world.md``).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any, Sequence

from vlp.data.downstream_formats import VQA_V2
from vlp.kinds import VQA
from vlp.world.phrases import (
    CELL_PHRASES,
    attribute_sets,
    noun_phrase,
    parse_article_phrase,
    parse_noun_phrase,
    with_article,
)
from vlp.world.scene import (
    COLORS,
    MAX_OBJECTS,
    SHAPES,
    SIZES,
    Desc,
    Obj,
    Scene,
    count_matching,
    describe,
    world_rng,
)

__all__ = [
    "QUESTION_TYPES",
    "TYPE_ANSWERS",
    "POSITION_WORDS",
    "N_ANNOTATORS",
    "ANNOTATOR_ACCURACY",
    "question_text",
    "parse_question",
    "answer_question",
    "question_id",
    "make_vqa_records",
    "vqa_test_record",
    "make_answer_list",
    "vqa_task_files",
]

QUESTION_TYPES: tuple[str, ...] = ("color", "shape", "count", "position", "yes/no")
#: answers to a cell question: the cell phrase without its preposition
POSITION_WORDS: dict[tuple[int, int], str] = {
    c: p.split(" ", 1)[1].removeprefix("the ") for c, p in CELL_PHRASES.items()
}
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
_REFER_FROM: dict[str, tuple[str, ...]] = {
    "color": ("size", "shape", "pos"),
    "shape": ("size", "color", "pos"),
    "position": ("size", "color", "shape"),
}
_YESNO_SUBSETS: tuple[frozenset[str], ...] = attribute_sets(
    "color", "shape", "size color", "size shape", "color shape", "size color shape", "color pos", "shape pos"
)
_COUNT_SUBSETS: tuple[frozenset[str], ...] = attribute_sets(
    "", "size", "color", "shape", "size color", "size shape", "color shape", "size color shape"
)
#: share of count questions about a random description (often answered "0")
RANDOM_COUNT_SHARE = 0.25
_SPLIT_CODES = {"train": 0, "val": 1, "test": 2}
_MAX_IMAGES = 10**7


def _subsets(attrs: Sequence[str]) -> list[frozenset[str]]:
    """All non-empty subsets of ``attrs``."""
    return [frozenset(a for j, a in enumerate(attrs) if m >> j & 1) for m in range(1, 2 ** len(attrs))]


_REFER_SUBSETS: dict[str, list[frozenset[str]]] = {t: _subsets(a) for t, a in _REFER_FROM.items()}


# --------------------------------------------------------------------------
# Questions and answers
# --------------------------------------------------------------------------


def question_text(qtype: str, d: Desc) -> str:
    """The question of type ``qtype`` about description ``d`` (lowercase ``[a-z ]``)."""
    if qtype in _REFER_FROM:
        return _PREFIXES[qtype] + noun_phrase(d, "object")
    if qtype == "count":
        return f"how many {noun_phrase(d, 'shape', plural=True)} are there"
    if qtype == "yes/no":
        return "is there " + with_article(noun_phrase(d, "shape"))
    raise ValueError(f"unknown question type {qtype!r}")


def parse_question(text: str) -> tuple[str, Desc]:
    """Inverse of :func:`question_text`: ``(question type, description)``."""
    for qtype, prefix in _PREFIXES.items():
        if not text.startswith(prefix):
            continue
        tokens = text[len(prefix) :].split()
        if qtype == "count":
            if tokens[-2:] != ["are", "there"]:
                raise ValueError(f"not a count question: {text!r}")
            return qtype, parse_noun_phrase(tokens[:-2], plural=True)
        if qtype == "yes/no":
            return qtype, parse_article_phrase(tokens)
        return qtype, parse_noun_phrase(tokens, nouns=("object",))
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
        return str(count_matching(scene, d))
    if qtype == "yes/no":
        return "yes" if count_matching(scene, d) else "no"
    raise ValueError(f"unknown question type {qtype!r}")


def answer_question(text: str, scene: Scene) -> str:
    """The true answer of a shapes-world question on ``scene`` (``ValueError`` if ambiguous)."""
    return _answer(*parse_question(text), scene)


# --------------------------------------------------------------------------
# Drawing questions
# --------------------------------------------------------------------------


def _unique_referents(scene: Scene, o: Obj, qtype: str) -> list[Desc]:
    """Descriptions of ``o`` without the asked attribute that match no other object."""
    descs = [describe(o, s) for s in _REFER_SUBSETS[qtype]]
    return [d for d in descs if count_matching(scene, d) == 1]


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
    return describe(rng.choice(scene.objects), attrs)


def _sample_yesno(scene: Scene, yes: bool, rng: random.Random) -> Desc:
    """A description of an object that is (``yes``) or is not in the scene; the attribute
    subset is drawn independently of ``yes`` (redrawn only in the rare scenes that hold
    every value of a subset)."""
    while True:
        attrs = rng.choice(_YESNO_SUBSETS)
        if yes:
            return describe(rng.choice(scene.objects), attrs)
        for _ in range(64):
            d = _random_desc(attrs, rng)
            if not count_matching(scene, d):
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


# --------------------------------------------------------------------------
# Records and files
# --------------------------------------------------------------------------


def make_vqa_records(
    scenes: Sequence[Scene], images: Sequence[str], split: str, seed: int, per_image: int = 3
) -> list[dict[str, Any]]:
    """VQA records (with answers and ``question_type``) for one split of the world.

    Per image ``min(per_image, feasible types)`` questions of distinct types (drawn from
    ``world_rng(seed, split, i, "vqa-types")``, the question from ``"vqa"``); the yes/no answers
    of the split are balanced by a shuffled plan (``"vqa-yesno"``).
    """
    if not 0 <= per_image <= len(QUESTION_TYPES):
        raise ValueError(f"vqa_per_image must be in 0..{len(QUESTION_TYPES)}, got {per_image}")
    types = [_question_types(s, per_image, world_rng(seed, split, i, "vqa-types")) for i, s in enumerate(scenes)]
    yes = iter(_yes_plan(sum(t.count("yes/no") for t in types), world_rng(seed, split, 0, "vqa-yesno")))
    records = []
    for i, (scene, image, qtypes) in enumerate(zip(scenes, images, types)):
        rng = world_rng(seed, split, i, VQA)
        for k, qtype in enumerate(qtypes):
            d = _make_question(scene, qtype, rng, next(yes) if qtype == "yes/no" else False)
            text, truth = question_text(qtype, d), _answer(qtype, d, scene)
            if parse_question(text) != (qtype, d) or answer_question(text, scene) != truth:
                raise AssertionError(f"{split} image {i}: question {text!r} does not round-trip")
            records.append(
                {
                    "question_id": question_id(split, i, k),
                    "question": text,
                    "answer": _annotators(qtype, truth, rng),
                    "image": image,
                    "dataset": VQA_V2,
                    "question_type": qtype,
                }
            )
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


def vqa_task_files(
    scenes: dict[str, list[Scene]], images: dict[str, list[str]], seed: int, per_image: int = 3
) -> dict[str, tuple[str, Any]]:
    """The VQA files of a world: ``{key: (file name, JSON content)}``."""
    vqa = {s: make_vqa_records(scenes[s], images[s], s, seed, per_image) for s in ("train", "val", "test")}
    return {
        "vqa_train": ("vqa_train.json", vqa["train"]),
        "vqa_val": ("vqa_val.json", vqa["val"]),
        "vqa_test": ("vqa_test.json", [vqa_test_record(r) for r in vqa["test"]]),
        "vqa_test_annotations": ("vqa_test_annotations.json", vqa["test"]),
        "answer_list": ("answer_list.json", make_answer_list(vqa["train"], vqa["val"])),
    }
