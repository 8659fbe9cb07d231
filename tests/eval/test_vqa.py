import pytest

from vlp.data.downstream_formats import VQAQuestion
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


def test_official_vqa_accuracy_leave_one_out_and_processing():
    from vlp.eval.vqa import mean_vqa_accuracy, official_process, official_vqa_accuracy

    # leave-one-out over the 10 annotators: 3 matches -> (3 x 2/3 + 7 x 1) / 10 = 0.9 (plain formula: 1.0)
    assert official_vqa_accuracy("2", ["2"] * 3 + ["3"] * 7) == pytest.approx(0.9)
    assert official_vqa_accuracy("2", ["2"] * 1 + ["3"] * 9) == pytest.approx(0.3)
    assert official_vqa_accuracy("2", ["2"] * 4 + ["3"] * 6) == pytest.approx(1.0)
    assert official_vqa_accuracy("net", ["net"] * 10) == 1.0
    # processing (only when the annotators disagree): number words, articles, punctuation, periods
    assert (
        official_process("Two dogs.") == "2 dogs" and official_process("the red-and-white bus") == "red and white bus"
    )
    assert (
        official_process("1,000") == "1000"
        and official_process("3.5") == "3.5"
        and official_process("a cat , or two") == "cat or 2"
    )
    assert official_vqa_accuracy("two", ["2"] * 9 + ["3"]) == pytest.approx(1.0)
    assert (
        official_vqa_accuracy("two", ["2"] * 10) == 0.0
    )  # unanimous annotators: compared as written, as the official code
    preds, answers = ["2", "yes"], [["2"] * 3 + ["3"] * 7, ["yes"] * 10]
    assert mean_vqa_accuracy(preds, answers, official=True) == pytest.approx(95.0)
    assert mean_vqa_accuracy(preds, answers) == pytest.approx(100.0)
