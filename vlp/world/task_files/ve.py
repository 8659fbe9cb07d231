"""Visual entailment (SNLI-VE) triples of the shapes world: image premise, hypothesis, exact label.

A hypothesis says that the image has (``there is a ...``) or has not (``there is no ...``) an object
of a description (size, colour and/or shape, always colour or shape: "a small red circle", "a
green shape"), optionally with one :data:`UNRENDERED` word: a property the renderer never draws
(material, weight), which no picture can settle ("there is a wooden red circle").

Labels, from the scene (:func:`hypothesis_label`):

======================== ========================== ==========================
                         the description is present the description is absent
======================== ========================== ==========================
``there is a D``         entailment                 contradiction
``there is no D``        contradiction              entailment
``there is a U D``       neutral (U unknown)        contradiction
``there is no U D``      neutral (U unknown)        entailment
======================== ========================== ==========================

The files are balanced by label (in every run of three slots: one of each), and the surface
form carries no label information beyond 50 %: each of the four forms occurs equally often
with a present and an absent description (:data:`_SLOT_TYPES`), and the description is drawn
before, and independently of, the image (the image is then drawn among those where the
description is present / absent). A hypothesis-only model can thus reach 50 % at most; the
majority class is 33.3 %. :func:`write_ve_splits` reads a world's ``scenes.json`` and writes
``ve_{train,dev,test}.json`` (dev from the val images) in ALBEF's SNLI-VE format, deterministic
in the world seed (:func:`~vlp.world.scene.world_rng`, purposes ``"ve"``, ``"ve-plan"``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from vlp.data.json_entries import read_json, write_json_atomic
from vlp.kinds import VE
from vlp.world.phrases import attribute_sets, noun_phrase, parse_noun_phrase, with_article
from vlp.world.scene import (
    COLORS,
    SHAPES,
    SIZES,
    Desc,
    Scene,
    count_matching,
    describe,
    scene_from_dict,
    world_rng,
)
from vlp.world.task_files.grounding import scenes_json_key

__all__ = [
    "UNRENDERED",
    "VE_FILES",
    "Hypothesis",
    "hypothesis_text",
    "parse_hypothesis",
    "hypothesis_label",
    "make_ve_records",
    "write_ve_splits",
]

#: properties the renderer never draws (material, weight): a hypothesis naming one is neutral
#: about an object that is present
UNRENDERED: tuple[str, ...] = ("wooden", "metal", "plastic", "glass", "heavy", "hollow")
#: split of ``scenes.json`` -> the file written for it
VE_FILES: dict[str, str] = {"train": "ve_train.json", "val": "ve_dev.json", "test": "ve_test.json"}
ENTAILMENT, NEUTRAL, CONTRADICTION = "entailment", "neutral", "contradiction"
_ORDER = (ENTAILMENT, CONTRADICTION, NEUTRAL)
#: per label, 4 slot types (negated, with an unrendered word, description present) taken in turn;
#: over 12 slots each (negated, unrendered) form occurs equally often present and absent
_SLOT_TYPES: dict[str, tuple[tuple[bool, bool, bool], ...]] = {
    ENTAILMENT: ((False, False, True), (True, False, False), (True, True, False), (True, True, False)),
    CONTRADICTION: ((False, False, False), (False, True, False), (False, True, False), (True, False, True)),
    NEUTRAL: ((False, True, True), (False, True, True), (True, True, True), (True, True, True)),
}
#: descriptions: non-empty subsets of {size, colour, shape} with colour or shape
_DESC_SUBSETS = attribute_sets("color", "shape", "size color", "size shape", "color shape", "size color shape")
_VALUES = {"size": SIZES, "color": COLORS, "shape": SHAPES}
_MAX_DRAWS = 1000


@dataclass(frozen=True)
class Hypothesis:
    """``there is (a|no) [unrendered] <desc>``."""

    desc: Desc
    negated: bool = False
    unrendered: Optional[str] = None


def hypothesis_text(h: Hypothesis) -> str:
    """ "there is a small red circle", "there is no wooden green shape"."""
    *adjectives, noun = noun_phrase(h.desc).split(" ")
    phrase = " ".join([*adjectives, *([h.unrendered] if h.unrendered else []), noun])
    return f"there is {'no ' + phrase if h.negated else with_article(phrase)}"


def parse_hypothesis(text: str) -> Hypothesis:
    """Inverse of :func:`hypothesis_text`; ``ValueError`` outside the grammar."""
    tokens = text.split(" ")
    if tokens[:2] != ["there", "is"] or len(tokens) < 4 or tokens[2] not in ("a", "an", "no"):
        raise ValueError(f"not a VE hypothesis: {text!r}")
    negated, rest = tokens[2] == "no", tokens[3:]
    unrendered = rest[-2] if len(rest) >= 2 and rest[-2] in UNRENDERED else None
    words = [w for i, w in enumerate(rest) if not (unrendered and i == len(rest) - 2)]
    h = Hypothesis(parse_noun_phrase(words), negated, unrendered)
    if hypothesis_text(h) != text:  # e.g. a wrong article
        raise ValueError(f"not a VE hypothesis: {text!r}")
    return h


def hypothesis_label(h: Hypothesis, scene: Scene) -> str:
    """entailment / contradiction / neutral of ``h`` about ``scene`` (the table of the module doc)."""
    present = count_matching(scene, h.desc) > 0
    if h.unrendered and present:
        return NEUTRAL
    return ENTAILMENT if present != h.negated else CONTRADICTION


def _plan(n: int, rng: random.Random) -> list[tuple[str, tuple[bool, bool, bool]]]:
    """``n`` (label, slot type) pairs: labels in turn, each label's slot types in turn; shuffled."""
    plan = [(_ORDER[s % 3], _SLOT_TYPES[_ORDER[s % 3]][(s // 3) % 4]) for s in range(n)]
    rng.shuffle(plan)
    return plan


def _sample_desc(rng: random.Random) -> Desc:
    attrs = rng.choice(_DESC_SUBSETS)
    color, shape, size = (rng.choice(_VALUES[a]) if a in attrs else None for a in ("color", "shape", "size"))
    return Desc(shape=shape, color=color, size=size)


class _PresenceIndex:
    """Which images of a split hold an object of each description."""

    def __init__(self, scenes: Sequence[Scene]) -> None:
        self.n = len(scenes)
        self.present: dict[Desc, list[int]] = {}
        for i, scene in enumerate(scenes):
            for d in {describe(o, attrs) for o in scene.objects for attrs in _DESC_SUBSETS}:
                self.present.setdefault(d, []).append(i)

    def images(self, d: Desc, present: bool) -> list[int]:
        have = self.present.get(d, [])
        if present:
            return have
        held = set(have)
        return [i for i in range(self.n) if i not in held]


def _draw(index: _PresenceIndex, present: bool, rng: random.Random) -> tuple[Desc, int]:
    """A description that is present in some image of the split and absent in another (drawn
    without looking at ``present``), and an image where its presence is ``present``."""
    for _ in range(_MAX_DRAWS):
        d = _sample_desc(rng)
        if index.images(d, True) and index.images(d, False):
            return d, rng.choice(index.images(d, present))
    raise ValueError(f"no description is both present and absent in this split of {index.n} images")


def make_ve_records(
    scenes: Sequence[Scene], images: Sequence[str], split: str, seed: int, per_image: int = 3
) -> list[dict[str, Any]]:
    """``per_image * len(scenes)`` SNLI-VE records ``{"image", "sentence", "label"}`` of one split,
    balanced by label; every label checked against the scene (:func:`hypothesis_label`). A split
    of fewer than 2 images has none: every hypothesis needs a description present in one of its
    images and absent from another."""
    if per_image < 0:
        raise ValueError(f"ve per_image must be >= 0, got {per_image}")
    if len(scenes) < 2:
        return []
    index = _PresenceIndex(scenes)
    records = []
    for s, (label, (negated, unrendered, present)) in enumerate(
        _plan(per_image * len(scenes), world_rng(seed, split, 0, "ve-plan"))
    ):
        rng = world_rng(seed, split, s, VE)
        d, i = _draw(index, present, rng)
        h = Hypothesis(d, negated, rng.choice(UNRENDERED) if unrendered else None)
        text = hypothesis_text(h)
        if parse_hypothesis(text) != h or hypothesis_label(h, scenes[i]) != label:
            raise AssertionError(f"{split} VE hypothesis {s}: {text!r} is not {label} of image {i}")
        records.append({"image": images[i], "sentence": text, "label": label})
    return records


def write_ve_splits(root: str | Path, per_image: int = 3) -> dict[str, Path]:
    """Write ``ve_{train,dev,test}.json`` of the shapes world under ``root`` (from its
    ``scenes.json``: ``per_image`` hypotheses per image of each split); returns
    ``{"ve_train": path, "ve_dev": path, "ve_test": path}``."""
    root = Path(root)
    path = root / "scenes.json"
    data = read_json(path)
    seed = scenes_json_key(path, data, "seed", "the world seed")
    splits = scenes_json_key(path, data, "splits", "the scene records of each split")
    paths = {}
    for split, name in VE_FILES.items():
        records = scenes_json_key(path, splits, split, f"the scene records of split {split!r}")
        scenes = [scene_from_dict(r) for r in records]
        entries = make_ve_records(scenes, [r["image"] for r in records], split, seed, per_image)
        paths[Path(name).stem] = root / name
        write_json_atomic(root / name, entries, separators=(",", ":"), ensure_ascii=True)
    return paths
