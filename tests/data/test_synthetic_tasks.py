"""Tests for the shapes world's VQA and NLVR2 data (vlp.data.synthetic_tasks).

Answers and labels are re-derived here from the scenes with an independent regex reading of
the question / statement text, not with the generator's own parser.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

import pytest

from vlp.data.synthetic import Obj, Scene, generate_world, scene_from_dict
from vlp.data.synthetic_tasks import (
    NLVR_TEMPLATES,
    QUESTION_TYPES,
    TYPE_ANSWERS,
    answer_question,
    make_answer_list,
    make_nlvr_records,
    make_vqa_records,
    statement_label,
)

WORLD = dict(n_train=300, n_val=30, n_test=60, image_size=32, progress=False)
TASK_KEYS = ("vqa_train", "vqa_val", "vqa_test", "vqa_test_annotations", "answer_list",
             "nlvr_train", "nlvr_dev", "nlvr_test")
OTHER_KEYS = ("pretrain", "helper", "retrieval_train", "retrieval_val", "retrieval_test", "relevance_val",
              "relevance_test", "relevance_graded_val", "relevance_graded_test", "scenes")
CELLS = {"top left": (0, 0), "top": (0, 1), "top right": (0, 2), "left": (1, 0), "center": (1, 1),
         "right": (1, 2), "bottom left": (2, 0), "bottom": (2, 1), "bottom right": (2, 2)}
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight"]
NP = re.compile(r"(?:(?P<size>small|large) )?(?:(?P<color>red|green|blue|yellow|purple|orange) )?"
                r"(?P<noun>circle|square|triangle|diamond|shape|object)s?(?: (?:at|on|in) the (?P<cell>[a-z ]+))?")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return generate_world(tmp_path_factory.mktemp("world"), seed=2, **WORLD)


@pytest.fixture(scope="module")
def scenes(world: dict[str, Path]) -> dict[str, Scene]:
    """Scene of every image, by relative image path."""
    splits = json.loads(world["scenes"].read_text())["splits"]
    return {e["image"]: scene_from_dict(e) for entries in splits.values() for e in entries}


def _load(p: Path) -> Any:
    return json.loads(p.read_text())


def _matching(phrase: str, scene: Scene) -> list[Obj]:
    """Objects of ``scene`` that the noun phrase describes (test-side reading)."""
    m = NP.fullmatch(phrase)
    assert m, phrase
    cell = CELLS[m["cell"]] if m["cell"] else None
    shape = m["noun"] if m["noun"] not in ("shape", "object") else None
    return [o for o in scene.objects
            if (m["size"] is None or o.size == m["size"]) and (m["color"] is None or o.color == m["color"])
            and (shape is None or o.shape == shape) and (cell is None or (o.row, o.col) == cell)]


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


# ---------------------------------------------------------------- VQA


def test_hand_worked_questions() -> None:
    scene = Scene((Obj("circle", "red", "large", 1, 0), Obj("square", "blue", "small", 1, 2),
                   Obj("square", "green", "large", 2, 2)))
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
    assert make_answer_list([{"answer": ["b", "a", "a"]}, {"answer": ["c", "b"]}], [{"answer": ["z"]}]) == ["a", "b", "c", "z"]


def test_vqa_per_image_bounds(world: dict[str, Path], scenes: dict[str, Scene]) -> None:
    imgs = [r["image"] for r in _load(world["scenes"])["splits"]["val"]]
    five = make_vqa_records([scenes[i] for i in imgs], imgs, "val", seed=2, per_image=5)
    by_image = Counter(r["image"] for r in five)
    assert all(4 <= n <= 5 for n in by_image.values())  # position is infeasible only for twin objects
    assert make_vqa_records([scenes[i] for i in imgs], imgs, "val", seed=2, per_image=0) == []
    with pytest.raises(ValueError, match="vqa_per_image must be in 0..5"):
        make_vqa_records([], [], "val", seed=2, per_image=6)


# ---------------------------------------------------------------- NLVR2


def _count(phrase: str, scene: Scene) -> int:
    return len(_matching(phrase, scene))


def _side(side: str, left: Scene, right: Scene) -> tuple[Scene, Scene]:
    return (left, right) if side == "left" else (right, left)


NLVR_RULES: list[tuple[str, str, Callable[..., bool]]] = [
    ("more", r"the (left|right) image has more ([a-z ]+) than the (?:left|right) image",
     lambda s, p, L, R: _count(p, _side(s, L, R)[0]) > _count(p, _side(s, L, R)[1])),
    ("contains", r"the (left|right) image contains an? ([a-z ]+)", lambda s, p, L, R: _count(p, _side(s, L, R)[0]) > 0),
    ("exactly", r"the (left|right) image has exactly ([a-z]+) ([a-z ]+)",
     lambda s, n, p, L, R: _count(p, _side(s, L, R)[0]) == NUMBERS.index(n)),
    ("both", r"both images contain an? ([a-z ]+)", lambda p, L, R: _count(p, L) > 0 and _count(p, R) > 0),
    ("one_image", r"exactly one image contains an? ([a-z ]+)", lambda p, L, R: (_count(p, L) > 0) != (_count(p, R) > 0)),
    ("neither", r"neither image contains an? ([a-z ]+)", lambda p, L, R: _count(p, L) == 0 and _count(p, R) == 0),
    ("total", r"there are ([a-z]+) ([a-z ]+) in total", lambda n, p, L, R: _count(p, L) + _count(p, R) == NUMBERS.index(n)),
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
    assert cells == {("both", "True"): 150, ("both", "False"): 150, ("contains", "True"): 150, ("contains", "False"): 150}
    for bad in ((), ("both", "fewer")):
        with pytest.raises(ValueError, match="expected a non-empty subset of more, contains"):
            make_nlvr_records(train, images, "train", seed=0, templates=bad)


def test_nlvr_degenerate_splits(scenes: dict[str, Scene]) -> None:
    one = [next(iter(scenes.values()))]
    recs = make_nlvr_records(one, ["a.png"], "val", seed=0, per_image=3)
    assert len(recs) == 3 and all(r["images"] == ["a.png", "a.png"] for r in recs)
    assert all(_nlvr_truth(r["sentence"], one[0], one[0])[1] == (r["label"] == "True") for r in recs)
    assert make_nlvr_records([], [], "val", seed=0) == []


# ---------------------------------------------------------------- files


def test_task_files_deterministic_and_independent(world: dict[str, Path], tmp_path: Path) -> None:
    again = generate_world(tmp_path / "again", seed=2, **WORLD)
    for key in TASK_KEYS:
        assert again[key].name == world[key].name and again[key].read_bytes() == world[key].read_bytes(), key
    other = generate_world(tmp_path / "other", seed=3, **WORLD)
    assert other["vqa_train"].read_bytes() != world["vqa_train"].read_bytes()
    assert other["nlvr_train"].read_bytes() != world["nlvr_train"].read_bytes()
    # the earlier files do not depend on the task parameters (task RNGs are separate)
    none = generate_world(tmp_path / "none", seed=2, **WORLD, vqa_per_image=0, nlvr_per_image=0)
    for key in OTHER_KEYS:
        assert none[key].read_bytes() == world[key].read_bytes(), key
    assert _load(none["vqa_train"]) == [] and _load(none["nlvr_dev"]) == [] and _load(none["answer_list"]) == []
    one = generate_world(tmp_path / "one", seed=2, **WORLD, vqa_per_image=1, nlvr_per_image=1)
    assert len(_load(one["vqa_val"])) == 30 and len(_load(one["nlvr_test"])) == 60


def test_tiny_world_writes_every_task_file(tmp_path: Path) -> None:
    paths = generate_world(tmp_path, seed=0, n_train=0, n_val=1, n_test=2, image_size=16, progress=False)
    assert _load(paths["vqa_train"]) == [] and _load(paths["nlvr_train"]) == []
    assert len(_load(paths["vqa_val"])) == 3 and len(_load(paths["nlvr_dev"])) == 2
    assert len(_load(paths["nlvr_test"])) == 4
    assert _load(paths["answer_list"])  # the val answers
