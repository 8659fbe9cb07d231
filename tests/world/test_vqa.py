"""Tests for the shapes world's VQA data (vlp.world.task_files.vqa).

Answers are re-derived here from the scenes with an independent regex reading of the question
text, not with the generator's own parser.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.world.conftest import CELLS, _load, _matching
from vlp.world.scene import Obj, Scene
from vlp.world.task_files.vqa import QUESTION_TYPES, TYPE_ANSWERS, answer_question, make_answer_list, make_vqa_records


@pytest.fixture(scope="module")
def world(task_world: dict[str, Path]) -> dict[str, Path]:
    return task_world


def _the(phrase: str, scene: Scene) -> Obj:
    found = _matching(phrase, scene)
    assert len(found) == 1, f"'{phrase}' is ambiguous: {found}"
    return found[0]


def _truth(question: str, scene: Scene) -> tuple[str, str]:
    """(question type, true answer) of a question, derived from the scene."""
    if m := re.fullmatch(r"what (color|shape) is the ([a-z ]+)", question):
        return m[1], getattr(_the(m[2], scene), m[1])
    if m := re.fullmatch(r"where is the ([a-z ]+)", question):
        o = _the(m[1], scene)
        return "position", next(w for w, c in CELLS.items() if c == (o.row, o.col))
    if m := re.fullmatch(r"how many ([a-z ]+) are there", question):
        return "count", str(len(_matching(m[1], scene)))
    if m := re.fullmatch(r"is there an? ([a-z ]+)", question):
        return "yes/no", "yes" if _matching(m[1], scene) else "no"
    raise AssertionError(f"unknown question form: {question!r}")


def test_hand_worked_questions() -> None:
    scene = Scene(
        (
            Obj("circle", "red", "large", 1, 0),
            Obj("square", "blue", "small", 1, 2),
            Obj("square", "green", "large", 2, 2),
        )
    )
    assert answer_question("what color is the circle", scene) == "red"
    assert answer_question("what color is the large square", scene) == "green"
    assert answer_question("what shape is the object on the right", scene) == "square"
    assert answer_question("where is the blue square", scene) == "right"
    assert answer_question("where is the large green object", scene) == "bottom right"
    assert answer_question("how many squares are there", scene) == "2"
    assert answer_question("how many triangles are there", scene) == "0"
    assert answer_question("is there a purple square", scene) == "no"
    assert answer_question("is there a large shape at the bottom right", scene) == "yes"
    with pytest.raises(ValueError, match="matches 2 objects"):
        answer_question("what color is the square", scene)
    with pytest.raises(ValueError, match="unknown noun 'object'"):
        answer_question("is there an object", scene)


def _all_vqa(world: dict[str, Path]) -> list[dict]:
    return [r for k in ("vqa_train", "vqa_val", "vqa_test_annotations") for r in _load(world[k])]


def test_vqa_answers_are_true_for_their_scene(world: dict[str, Path], scenes: dict[str, Scene]) -> None:
    records = _all_vqa(world)
    assert len(records) == 3 * (300 + 30 + 60)  # every scene here has >= 3 feasible types
    majority_right = 0
    for r in records:
        qtype, truth = _truth(r["question"], scenes[r["image"]])
        assert qtype == r["question_type"], r
        assert answer_question(r["question"], scenes[r["image"]]) == truth
        assert re.fullmatch(r"[a-z]+( [a-z]+)*", r["question"])
        assert len(r["answer"]) == 10 and set(r["answer"]) <= set(TYPE_ANSWERS[qtype])
        majority_right += Counter(r["answer"]).most_common(1)[0][0] == truth
        assert r["dataset"] == "vqa" and r["image"].startswith("images/")
    assert majority_right / len(records) >= 0.95
    # ~90 % of all annotator answers are right, as simulated
    right = sum(a == _truth(r["question"], scenes[r["image"]])[1] for r in records for a in r["answer"])
    assert 0.87 <= right / (10 * len(records)) <= 0.93


def test_vqa_types_balance_and_ids(world: dict[str, Path], scenes: dict[str, Scene]) -> None:
    records = _all_vqa(world)
    types = Counter(r["question_type"] for r in records)
    assert set(types) == set(QUESTION_TYPES)
    assert min(types.values()) >= 0.15 * len(records)  # 1/5 each in expectation
    per_image = defaultdict(list)
    for r in records:
        per_image[r["image"]].append(r["question_type"])
    assert all(len(t) == len(set(t)) == 3 for t in per_image.values())  # distinct types per image
    ids = [r["question_id"] for r in records]
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == len(ids)
    yesno = [_truth(r["question"], scenes[r["image"]])[1] for r in records if r["question_type"] == "yes/no"]
    assert 0.45 <= yesno.count("yes") / len(yesno) <= 0.55
    train_yes = [r for r in _load(world["vqa_train"]) if r["question_type"] == "yes/no"]
    assert abs(2 * sum(_truth(r["question"], scenes[r["image"]])[1] == "yes" for r in train_yes) - len(train_yes)) <= 1
    counts = Counter(_truth(r["question"], scenes[r["image"]])[1] for r in records if r["question_type"] == "count")
    assert counts["0"] >= 0.05 * sum(counts.values())  # zero answers occur


def test_vqa_test_file_and_answer_list(world: dict[str, Path]) -> None:
    test, annotations = _load(world["vqa_test"]), _load(world["vqa_test_annotations"])
    assert len(test) == len(annotations) == 3 * 60
    assert test == [{k: v for k, v in r.items() if k not in ("answer", "question_type")} for r in annotations]
    assert set(test[0]) == {"question_id", "question", "image", "dataset"}
    assert all(r["image"].startswith("images/test/") for r in test)
    assert all(r["image"].startswith("images/val/") for r in _load(world["vqa_val"]))
    answers = _load(world["answer_list"])
    train = Counter(a for r in _load(world["vqa_train"]) for a in r["answer"])
    seen = set(train) | {a for r in _load(world["vqa_val"]) for a in r["answer"]}
    assert len(answers) == len(set(answers)) and set(answers) == seen
    assert len(answers) == 26  # 6 colours + 4 shapes + 5 counts + 9 positions + yes/no
    assert answers == sorted(answers, key=lambda a: (-train[a], a))
    assert make_answer_list([{"answer": ["b", "a", "a"]}, {"answer": ["c", "b"]}], [{"answer": ["z"]}]) == [
        "a",
        "b",
        "c",
        "z",
    ]


def test_vqa_per_image_bounds(world: dict[str, Path], scenes: dict[str, Scene]) -> None:
    imgs = [r["image"] for r in _load(world["scenes"])["splits"]["val"]]
    five = make_vqa_records([scenes[i] for i in imgs], imgs, "val", seed=2, per_image=5)
    by_image = Counter(r["image"] for r in five)
    assert all(4 <= n <= 5 for n in by_image.values())  # position is infeasible only for twin objects
    assert make_vqa_records([scenes[i] for i in imgs], imgs, "val", seed=2, per_image=0) == []
    with pytest.raises(ValueError, match="vqa_per_image must be in 0..5"):
        make_vqa_records([], [], "val", seed=2, per_image=6)
