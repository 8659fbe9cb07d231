"""VQA data: question dataset, ALBEF question cleaning, and the collator producing the VQA task's batch."""

from __future__ import annotations

from functools import partial
from typing import Callable, Optional, Sequence

import torch
from PIL import Image

from vlp.data.datasets import EntryDataset, count_bad
from vlp.data.downstream_formats import VQAQuestion
from vlp.errors import DataError
from vlp.preprocess.images import MAX_PIXELS, MIN_SIDE
from vlp.preprocess.transforms import DELETE_CHARS, is_albef_compat, tokenize

TRAIN_MAX_WORDS, TEST_MAX_WORDS = 30, 50  # ALBEF pre_question word limits


def pre_question(question: str, max_words: int = TRAIN_MAX_WORDS, albef_compat: bool = False) -> str:
    """ALBEF ``pre_question``: lower-case, delete ``, . ' ! ? " ( ) * # : ; ~``, strip, keep the
    first ``max_words`` space-separated words (whitespace is not collapsed). Idempotent.

    ``albef_compat`` (``model.text.albef_compat``, converted ALBEF checkpoints): exactly ALBEF's
    string, :func:`albef_pre_question` (``-``/``/`` -> space, leading spaces kept)."""
    if albef_compat:
        return albef_pre_question(question, max_words)
    q = DELETE_CHARS.sub("", question.lower()).strip()
    return " ".join(q.split(" ")[:max_words])


def albef_pre_question(question: str, max_words: int = TRAIN_MAX_WORDS) -> str:
    """ALBEF's ``pre_question`` to the character (albef.md §9): lower-case; delete
    ``, . ' ! ? " ( ) * # : ; ~``; ``-`` and ``/`` -> space; strip trailing spaces only (leading
    ones stay, and each is an empty word); whitespace is not collapsed (each extra space is an empty
    word); keep the first ``max_words`` ``' '``-separated words. No ``<person>`` rule."""
    q = DELETE_CHARS.sub("", question.lower()).replace("-", " ").replace("/", " ").rstrip(" ")
    words = q.split(" ")
    return " ".join(words[:max_words]) if len(words) > max_words else q


class VQADataset(EntryDataset):
    """Items ``{"image" [3, H, W], "question" (cleaned), "question_albef" (cleaned as ALBEF does), "train",
    "answers", "weights", "question_id", "index"}``.

    ``train=True`` needs every question to have answers (one weight each) and keeps 30 question
    words; evaluation (``train=False``) keeps 50 and accepts test questions without answers.
    ``question_albef`` and ``train`` are what :class:`VQACollator` uses with an ``albef_compat`` tokenizer.
    Bad samples (``on_bad``, training only) and per-item seeds: :class:`ItemDataset`.
    """

    def __init__(
        self,
        questions: Sequence[VQAQuestion],
        transform: Callable[[Image.Image], torch.Tensor],
        train: bool,
        on_bad: Optional[str] = None,
        max_pixels: int = MAX_PIXELS,
        min_side: int = MIN_SIDE,
    ) -> None:
        super().__init__(questions, transform, on_bad, max_pixels, min_side)
        self.train = train
        for q in self.items:
            if len(q.answers) != len(q.weights):
                raise DataError(f"{q.origin}: {len(q.answers)} answers but {len(q.weights)} weights")
            if train and not q.answers:
                raise DataError(f"{q.origin}: a training question needs at least one answer")
        self.max_words = TRAIN_MAX_WORDS if train else TEST_MAX_WORDS

    def load(self, i: int) -> dict:
        """Question ``i`` as an item (class doc): ``image`` [3, H, W], the question cleaned both ways
        (``max_words`` words), its answers and weights, ``question_id`` and ``index`` = ``i``; a bad image
        raises :class:`~vlp.errors.BadImage`."""
        q = self.items[i]
        return {
            "image": self.transform(self.image(q.image, q.origin)),
            "question": pre_question(q.question, self.max_words),
            "question_albef": albef_pre_question(q.question, self.max_words),
            "train": self.train,
            "answers": list(q.answers),
            "weights": [float(w) for w in q.weights],
            "question_id": q.question_id,
            "index": i,
        }


def _as_is(text: str) -> str:
    return text


def tokenize_answers(tokenizer, answers: Sequence[str], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[CLS] answer [SEP]`` token ids and mask [C, L], padded to the longest, truncated at
    ``max_len`` tokens (the tokenizer keeps [SEP] when truncating). [SEP] is ALBEF's answer eos."""
    if not answers:
        return torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, 0, dtype=torch.long)
    enc = tokenizer(list(answers), padding="longest", truncation=True, max_length=max_len, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


class VQACollator:
    """Items of :class:`VQADataset` -> the :class:`vlp.tasks.vqa.VQATask` batch.

    Keys: ``images`` [B, 3, H, W]; ``input_ids``/``attention_mask`` [B, T] (questions cleaned by
    :func:`pre_question`, truncated at ``question_max_len`` tokens, None = untruncated; with an
    ``albef_compat`` tokenizer as ALBEF: the items' ``question_albef``, or a raw ``question`` cleaned
    as a test question (50 words), truncated at ``question_max_len`` tokens only for training items
    (``"train": True``): ALBEF's test questions are never truncated);
    ``answer_ids``/``answer_mask`` [A, L] the answers of all questions in item order;
    ``answer_weights`` [A] float; ``answer_question`` [A] long (batch row of each answer's
    question); ``question_index`` [B] long (dataset index, for evaluation); ``bad_samples`` (0-d
    long): the bad loads the items replaced.
    """

    def __init__(self, tokenizer, question_max_len: Optional[int] = 25, answer_max_len: int = 10) -> None:
        self.tokenizer, self.question_max_len, self.answer_max_len = tokenizer, question_max_len, answer_max_len

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        if is_albef_compat(self.tokenizer):  # [CLS] q
            questions = [
                it["question_albef"] if "question_albef" in it else albef_pre_question(it["question"], TEST_MAX_WORDS)
                for it in items
            ]
            train = any(it.get("train", False) for it in items)
            enc = tokenize(self.tokenizer, questions, self.question_max_len if train else None, clean=_as_is)
        else:  # [CLS] q [SEP]
            enc = tokenize(
                self.tokenizer,
                [it["question"] for it in items],
                self.question_max_len,
                clean=partial(pre_question, max_words=TEST_MAX_WORDS),
            )
        answers = [a for it in items for a in it["answers"]]
        ids, mask = tokenize_answers(self.tokenizer, answers, self.answer_max_len)
        counts = torch.tensor([len(it["answers"]) for it in items], dtype=torch.long)
        return {
            "images": torch.stack([it["image"] for it in items]),
            "input_ids": enc["input_ids"],
            "attention_mask": enc["attention_mask"],
            "answer_ids": ids,
            "answer_mask": mask,
            "answer_weights": torch.tensor([w for it in items for w in it["weights"]], dtype=torch.float32),
            "answer_question": torch.arange(len(items)).repeat_interleave(counts),
            "question_index": torch.tensor([it["index"] for it in items], dtype=torch.long),
            "bad_samples": count_bad(items),
        }
