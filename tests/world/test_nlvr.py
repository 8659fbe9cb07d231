"""Tests for the shapes world's NLVR2 data (vlp.world.task_files.nlvr).

Labels are re-derived here from the scenes with an independent regex reading of the statement
text, not with the generator's own parser.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable

import pytest

from tests.world.conftest import _load, _matching
from vlp.world.scene import Obj, Scene
from vlp.world.task_files.nlvr import NLVR_TEMPLATES, make_nlvr_records, statement_label

NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight"]


@pytest.fixture(scope="module")
def world(task_world: dict[str, Path]) -> dict[str, Path]:
    return task_world


def _count(phrase: str, scene: Scene) -> int:
    return len(_matching(phrase, scene))


def _side(side: str, left: Scene, right: Scene) -> tuple[Scene, Scene]:
    return (left, right) if side == "left" else (right, left)


NLVR_RULES: list[tuple[str, str, Callable[..., bool]]] = [
    (
        "more",
        r"the (left|right) image has more ([a-z ]+) than the (?:left|right) image",
        lambda s, p, L, R: _count(p, _side(s, L, R)[0]) > _count(p, _side(s, L, R)[1]),
    ),
    ("contains", r"the (left|right) image contains an? ([a-z ]+)", lambda s, p, L, R: _count(p, _side(s, L, R)[0]) > 0),
    (
        "exactly",
        r"the (left|right) image has exactly ([a-z]+) ([a-z ]+)",
        lambda s, n, p, L, R: _count(p, _side(s, L, R)[0]) == NUMBERS.index(n),
    ),
    ("both", r"both images contain an? ([a-z ]+)", lambda p, L, R: _count(p, L) > 0 and _count(p, R) > 0),
    (
        "one_image",
        r"exactly one image contains an? ([a-z ]+)",
        lambda p, L, R: (_count(p, L) > 0) != (_count(p, R) > 0),
    ),
    ("neither", r"neither image contains an? ([a-z ]+)", lambda p, L, R: _count(p, L) == 0 and _count(p, R) == 0),
    (
        "total",
        r"there are ([a-z]+) ([a-z ]+) in total",
        lambda n, p, L, R: _count(p, L) + _count(p, R) == NUMBERS.index(n),
    ),
    ("same", r"both images have the same number of ([a-z ]+)", lambda p, L, R: _count(p, L) == _count(p, R)),
]


def _nlvr_truth(sentence: str, left: Scene, right: Scene) -> tuple[str, bool]:
    for name, pattern, rule in NLVR_RULES:
        if m := re.fullmatch(pattern, sentence):
            return name, rule(*m.groups(), left, right)
    raise AssertionError(f"unknown statement form: {sentence!r}")


def _flip(sentence: str) -> str:
    return re.sub(r"\b(left|right)\b", lambda m: {"left": "right", "right": "left"}[m[1]], sentence)


def test_hand_worked_statements() -> None:
    a = Scene((Obj("circle", "red", "large", 0, 0), Obj("circle", "blue", "small", 1, 1)))
    b = Scene((Obj("square", "red", "small", 2, 2),))
    assert statement_label("the left image has more circles than the right image", a, b)
    assert not statement_label("the right image has more circles than the left image", a, b)
    assert statement_label("both images contain a red shape", a, b)
    assert statement_label("exactly one image contains a blue shape", a, b)
    assert statement_label("there are three shapes in total", a, b)
    assert statement_label("the right image has exactly one square", a, b)
    assert statement_label("both images have the same number of red shapes", a, b)
    assert statement_label("neither image contains a triangle", a, b)


def test_nlvr_counts_and_labels(world: dict[str, Path], scenes: dict[str, Scene]) -> None:
    per_template: dict[str, list[bool]] = defaultdict(list)
    for key, n_images, split in (("nlvr_train", 300, "train"), ("nlvr_dev", 30, "val"), ("nlvr_test", 60, "test")):
        records = _load(world[key])
        assert len(records) == 2 * n_images
        for r in records:
            left, right = (scenes[p] for p in r["images"])
            assert all(p.startswith(f"images/{split}/") for p in r["images"]) and r["images"][0] != r["images"][1]
            assert r["label"] in ("True", "False")
            name, truth = _nlvr_truth(r["sentence"], left, right)
            assert truth == (r["label"] == "True"), r
            assert statement_label(r["sentence"], left, right) == truth
            per_template[name].append(truth)
    assert set(per_template) == set(NLVR_TEMPLATES) and 5 <= len(NLVR_TEMPLATES) <= 8
    for name, labels in per_template.items():
        assert 0.4 <= sum(labels) / len(labels) <= 0.6, name


def test_nlvr_left_right_only_name_images(world: dict[str, Path], scenes: dict[str, Scene]) -> None:
    records = [r for k in ("nlvr_train", "nlvr_dev", "nlvr_test") for r in _load(world[k])]
    sided = set()
    for r in records:
        s = r["sentence"]
        assert re.fullmatch(r"[a-z]+( [a-z]+)*", s)
        assert len(re.findall(r"\b(?:left|right)\b", s)) == len(re.findall(r"\bthe (?:left|right) image\b", s)), s
        if re.search(r"\b(left|right)\b", s):
            sided.add(_nlvr_truth(s, *(scenes[p] for p in r["images"]))[0])
        # flip augmentation: swap the images and the words left <-> right; the label holds
        left, right = (scenes[p] for p in r["images"])
        assert _nlvr_truth(_flip(s), right, left)[1] == (r["label"] == "True")
    assert len(sided) >= 2


def test_nlvr_text_only_majority_is_near_chance(world: dict[str, Path]) -> None:
    """Predicting a sentence's label from the other statements with the same sentence."""
    records = _load(world["nlvr_train"])
    by_sentence: dict[str, list[str]] = defaultdict(list)
    for r in records:
        by_sentence[r["sentence"]].append(r["label"])
    right = 0
    for r in records:
        others = Counter(by_sentence[r["sentence"]])
        others[r["label"]] -= 1
        right += ("True" if others["True"] >= others["False"] else "False") == r["label"]
    assert right / len(records) <= 0.6


def test_nlvr_template_subset(scenes: dict[str, Scene]) -> None:
    train = list(scenes.values())[:300]
    images = [f"i{k}.png" for k in range(len(train))]
    recs = make_nlvr_records(train, images, "train", seed=0, per_image=2, templates=("both", "contains"))
    cells: Counter = Counter()
    for r in recs:
        name, truth = _nlvr_truth(r["sentence"], *(train[images.index(p)] for p in r["images"]))
        assert truth == (r["label"] == "True"), r
        cells[name, r["label"]] += 1
    assert cells == {
        ("both", "True"): 150,
        ("both", "False"): 150,
        ("contains", "True"): 150,
        ("contains", "False"): 150,
    }
    for bad in ((), ("both", "fewer")):
        with pytest.raises(ValueError, match="expected a non-empty subset of more, contains"):
            make_nlvr_records(train, images, "train", seed=0, templates=bad)


def test_nlvr_degenerate_splits(scenes: dict[str, Scene]) -> None:
    one = [next(iter(scenes.values()))]
    recs = make_nlvr_records(one, ["a.png"], "val", seed=0, per_image=3)
    assert len(recs) == 3 and all(r["images"] == ["a.png", "a.png"] for r in recs)
    assert all(_nlvr_truth(r["sentence"], one[0], one[0])[1] == (r["label"] == "True") for r in recs)
    assert make_nlvr_records([], [], "val", seed=0) == []
