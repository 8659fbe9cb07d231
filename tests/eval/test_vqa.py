import pytest

from vlp.data.formats import VQAQuestion
from vlp.eval.vqa import (
    baseline_predictions,
    mean_vqa_accuracy,
    most_frequent_answers,
    normalize_answer,
    per_type_accuracy,
    vqa_accuracy,
)


def q(answers=(), weights=(), raw=(), qtype=None) -> VQAQuestion:
    return VQAQuestion("what?", "img.jpg", tuple(answers), tuple(weights), tuple(raw), None, qtype, "vqa", "test")


def test_normalize_answer():
    assert normalize_answer("Red ") == "red"
    assert normalize_answer("  Two   dogs.") == "two dogs"
    assert normalize_answer("yes!?") == "yes"
    assert normalize_answer("t-shirt") == "t-shirt"  # only trailing punctuation goes


@pytest.mark.parametrize("matches, expected", [(0, 0.0), (1, 1 / 3), (2, 2 / 3), (3, 1.0), (4, 1.0), (10, 1.0)])
def test_vqa_accuracy_counts_annotators(matches, expected):
    raw = ["red"] * matches + ["blue"] * (10 - matches)
    assert vqa_accuracy("red", raw) == pytest.approx(expected)


def test_vqa_accuracy_normalises_both_sides():
    assert vqa_accuracy("Red ", ["red", "RED", "blue"]) == pytest.approx(2 / 3)
    assert vqa_accuracy("red", ["Red.", " red", "red", "blue"]) == 1.0


def test_mean_and_per_type_accuracy_in_percent():
    questions = [
        q(raw=["red"] * 3, qtype="color"),  # pred red -> 1
        q(raw=["blue", "red"], qtype="color"),  # pred red -> 1/3
        q(raw=["2", "2", "3"], qtype="count"),  # pred 3 -> 1/3
        q(raw=["yes"] * 10),  # no type, pred no -> 0
    ]
    preds = ["red", "red", "3", "no"]
    assert mean_vqa_accuracy(preds, [x.raw_answers for x in questions]) == pytest.approx(100 * (1 + 2 / 3) / 4)
    acc = per_type_accuracy(preds, questions)
    assert acc == pytest.approx({"color": 100 * (2 / 3), "count": 100 / 3, "all": 100 * (5 / 3) / 4})
    with pytest.raises(ValueError, match="no annotator answers"):
        mean_vqa_accuracy(["red"], [[]])
    with pytest.raises(ValueError):
        mean_vqa_accuracy(["red"], [["red"], ["red"]])


def test_most_frequent_answers_sums_weights_per_type():
    train = [
        q(["yes", "no"], [0.6, 0.4], qtype="yes/no"),
        q(["no"], [1.0], qtype="yes/no"),  # "no": 1.4 vs "yes": 0.6
        q(["Red", "blue"], [0.5, 0.3], qtype="color"),
        q(["blue"], [0.3], qtype="color"),  # red 0.5 vs blue 0.6
        q(["2"], [0.9], qtype="count"),
        q(["yes"], [1.0]),  # untyped: counts only for "all" -> yes 1.6, no 1.4
    ]
    best = most_frequent_answers(train)
    assert best == {"all": "yes", "yes/no": "no", "color": "blue", "count": "2"}
    test = [q(qtype="color"), q(qtype="count"), q(qtype="what is"), q()]
    assert baseline_predictions(best, test) == ["blue", "2", "yes", "yes"]
