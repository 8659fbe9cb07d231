"""NLVR2 statements of the shapes world: sentences about image pairs with exact labels.

A statement about an ordered image pair (left = image 0, right = image 1), from one of
:data:`NLVR_TEMPLATES`; "left" / "right" only ever name an image, so swapping the images
together with the words keeps the label. Every statement is a function of the counts
``(c_left, c_right)`` of one description in the two images; the labels are balanced per
template, and a statement's wording is drawn independently of its label
(``docs/shapes_world.md``).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from vlp.kinds import NLVR
from vlp.world.phrases import NUMBER_WORDS, noun_phrase, parse_article_phrase, parse_noun_phrase, with_article
from vlp.world.scene import COLORS, MAX_OBJECTS, SHAPES, Desc, Obj, Scene, count_matching, world_rng

__all__ = [
    "NLVR_TEMPLATES",
    "check_templates",
    "Statement",
    "statement_text",
    "parse_statement",
    "statement_label",
    "make_nlvr_records",
    "nlvr_task_files",
]

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
    one, many = with_article(noun_phrase(st.desc)), noun_phrase(st.desc, plural=True)
    t, side = st.template, st.side
    if t == "more":
        return f"the {side} image has more {many} than the {_OTHER[side]} image"
    if t == "contains":
        return f"the {side} image contains {one}"
    if t == "exactly":
        noun = noun_phrase(st.desc, plural=st.n != 1)
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


def parse_statement(text: str) -> Statement:
    """Inverse of :func:`statement_text` (``ValueError`` outside the grammar)."""
    w = text.split()
    if len(w) > 4 and w[0] == "the" and w[1] in SIDES and w[2] == "image":
        side = w[1]
        if w[3:5] == ["has", "more"] and w[-4:] == ["than", "the", _OTHER[side], "image"]:
            return Statement("more", parse_noun_phrase(w[5:-4], plural=True), side)
        if w[3] == "contains":
            return Statement("contains", parse_article_phrase(w[4:]), side)
        if w[3:5] == ["has", "exactly"] and len(w) > 6 and w[5] in NUMBER_WORDS:
            n = NUMBER_WORDS.index(w[5])
            return Statement("exactly", parse_noun_phrase(w[6:], plural=n != 1), side, n)
    if w[:3] == ["both", "images", "contain"]:
        return Statement("both", parse_article_phrase(w[3:]))
    if w[:4] == ["exactly", "one", "image", "contains"]:
        return Statement("one_image", parse_article_phrase(w[4:]))
    if w[:3] == ["neither", "image", "contains"]:
        return Statement("neither", parse_article_phrase(w[3:]))
    if w[:2] == ["there", "are"] and w[-2:] == ["in", "total"] and len(w) > 4 and w[2] in NUMBER_WORDS:
        return Statement("total", parse_noun_phrase(w[3:-2], plural=True), None, NUMBER_WORDS.index(w[2]))
    if w[:7] == ["both", "images", "have", "the", "same", "number", "of"]:
        return Statement("same", parse_noun_phrase(w[7:], plural=True))
    raise ValueError(f"not a shapes-world NLVR statement: {text!r}")


def _label_from_counts(st: Statement, cl: int, cr: int) -> bool:
    return _TEMPLATES[st.template][0](cl, cr, st.side, st.n)


def statement_label(st: Statement | str, left: Scene, right: Scene) -> bool:
    """Truth of a statement (or its sentence) for the ordered pair (left, right)."""
    if isinstance(st, str):
        st = parse_statement(st)
    return _label_from_counts(st, count_matching(left, st.desc), count_matching(right, st.desc))


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
        raise ValueError(
            f"NLVR templates {list(unknown) or '(none)'}: expected a non-empty subset of {', '.join(NLVR_TEMPLATES)}"
        )
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


def make_nlvr_records(
    scenes: Sequence[Scene],
    images: Sequence[str],
    split: str,
    seed: int,
    per_image: int = 2,
    templates: Sequence[str] = NLVR_TEMPLATES,
) -> list[dict[str, Any]]:
    """``per_image * len(scenes)`` NLVR2 records ``{"images", "sentence", "label"}`` for one split,
    the ``templates`` in equal shares, each half True, half False."""
    if per_image < 0:
        raise ValueError(f"nlvr_per_image must be >= 0, got {per_image}")
    templates = check_templates(templates)
    if not scenes:
        return []
    index = _CountIndex(scenes)
    records = []
    plan = _nlvr_plan(per_image * len(scenes), world_rng(seed, split, 0, "nlvr-plan"), templates)
    for s, (template, label) in enumerate(plan):
        st, i, j, label = _draw(index, template, label, world_rng(seed, split, s, NLVR))
        text = statement_text(st)
        if parse_statement(text) != st or statement_label(text, scenes[i], scenes[j]) != label:
            raise AssertionError(f"{split} statement {s}: {text!r} does not round-trip")
        records.append({"images": [images[i], images[j]], "sentence": text, "label": str(label)})
    return records


def nlvr_task_files(
    scenes: dict[str, list[Scene]],
    images: dict[str, list[str]],
    seed: int,
    per_image: int = 2,
    templates: Sequence[str] = NLVR_TEMPLATES,
) -> dict[str, tuple[str, Any]]:
    """The NLVR2 files of a world: ``{key: (file name, JSON content)}`` (the val images make the dev split)."""
    nlvr = {s: make_nlvr_records(scenes[s], images[s], s, seed, per_image, templates) for s in ("train", "val", "test")}
    return {
        "nlvr_train": ("nlvr_train.json", nlvr["train"]),
        "nlvr_dev": ("nlvr_dev.json", nlvr["val"]),
        "nlvr_test": ("nlvr_test.json", nlvr["test"]),
    }
