"""VQA accuracy (min(#annotators who gave the answer / 3, 1)), per-question-type breakdown and the
most-frequent-answer baseline."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Mapping, Sequence

from vlp.data.answers import normalize_answer
from vlp.data.downstream_formats import VQAQuestion

ALL = "all"  # key of the overall entry in the per-type dictionaries


def vqa_accuracy(pred: str, raw_answers: Sequence[str]) -> float:
    """``min(#annotators whose answer equals pred / 3, 1)`` after :func:`normalize_answer`."""
    p = normalize_answer(pred)
    return min(sum(normalize_answer(a) == p for a in raw_answers) / 3.0, 1.0)


# The official VQA evaluation's answer processing (VQA API ``vqaEval.py``, as documented there):
# punctuation removed, or replaced by a space when it is glued to words; periods not part of a
# number dropped; number words 0-10 to digits; articles dropped. Its contraction table (e.g.
# "dont" -> "don't") is not applied here.
_PUNCT = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")
_COMMA_IN_NUMBER = re.compile(r"(\d)(,)(\d)")
_NUMBERS = {
    "none": "0",
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
_ARTICLES = frozenset({"a", "an", "the"})


def official_process(answer: str) -> str:
    """An answer as the official VQA evaluation compares it (punctuation, numbers, articles)."""
    text = answer.replace("\n", " ").replace("\t", " ").strip()
    out = text
    for p in _PUNCT:
        glued = (p + " " in text or " " + p in text) or _COMMA_IN_NUMBER.search(text) is not None
        out = out.replace(p, "" if glued else " ")
    out = _PERIOD.sub("", out)
    words = [_NUMBERS.get(w, w) for w in out.lower().split()]
    return " ".join(w for w in words if w not in _ARTICLES)


def official_vqa_accuracy(pred: str, raw_answers: Sequence[str]) -> float:
    """The official VQA v2 accuracy of one question: for each of the (10) annotators, min(#other
    annotators who gave the predicted answer / 3, 1), averaged. Answers are processed with
    :func:`official_process` only when the annotators disagree, as the official code does."""
    gts = [a.replace("\n", " ").replace("\t", " ").strip() for a in raw_answers]
    res = pred.replace("\n", " ").replace("\t", " ").strip()
    if len(set(gts)) > 1:
        gts, res = [official_process(a) for a in gts], official_process(res)
    return sum(min(1.0, sum(g == res for k, g in enumerate(gts) if k != i) / 3.0) for i in range(len(gts))) / len(gts)


def mean_vqa_accuracy(preds: Sequence[str], raw_answers_list: Sequence[Sequence[str]], official: bool = False) -> float:
    """Mean :func:`vqa_accuracy` (``official``: :func:`official_vqa_accuracy`) in percent. Every
    question needs annotator answers."""
    if len(preds) != len(raw_answers_list):
        raise ValueError(f"{len(preds)} predictions for {len(raw_answers_list)} questions")
    if not preds:
        raise ValueError("no questions to score")
    for i, raw in enumerate(raw_answers_list):
        if not raw:
            raise ValueError(f"question {i} has no annotator answers (a test question?) and cannot be scored")
    score = official_vqa_accuracy if official else vqa_accuracy
    return 100.0 * sum(score(p, r) for p, r in zip(preds, raw_answers_list)) / len(preds)


def per_type_accuracy(preds: Sequence[str], questions: Sequence[VQAQuestion]) -> dict[str, float]:
    """Mean accuracy (percent) per ``question_type``, plus ``"all"`` over every question.

    Questions without a type count in ``"all"`` only.
    """
    if len(preds) != len(questions):
        raise ValueError(f"{len(preds)} predictions for {len(questions)} questions")
    groups: dict[str, list[int]] = defaultdict(list)
    for i, q in enumerate(questions):
        if q.question_type is not None:
            groups[q.question_type].append(i)
    out = {
        t: mean_vqa_accuracy([preds[i] for i in idx], [questions[i].raw_answers for i in idx])
        for t, idx in sorted(groups.items())
    }
    out[ALL] = mean_vqa_accuracy(preds, [q.raw_answers for q in questions])
    return out


def _argmax_answer(totals: Mapping[str, float]) -> str:
    # largest summed weight; ties -> the answer seen first (dicts keep insertion order)
    return max(totals.items(), key=lambda kv: kv[1])[0]


def most_frequent_answers(train: Sequence[VQAQuestion]) -> dict[str, str]:
    """Per ``question_type``: the (normalised) answer with the largest summed weight over the
    training questions; ``"all"``: the same over every question. Ties go to the answer seen first."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for q in train:
        for a, w in zip(q.answers, q.weights):
            a = normalize_answer(a)
            totals[ALL][a] += w
            if q.question_type is not None:
                totals[q.question_type][a] += w
    if not totals[ALL]:
        raise ValueError("no training answers")
    return {t: _argmax_answer(tot) for t, tot in totals.items()}


def baseline_predictions(answers_by_type: Mapping[str, str], questions: Sequence[VQAQuestion]) -> list[str]:
    """The baseline answer of each question: its type's most frequent answer, else ``"all"``'s."""
    return [answers_by_type.get(q.question_type or ALL, answers_by_type[ALL]) for q in questions]
