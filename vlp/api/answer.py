"""The VQA action (:attr:`vlp.kinds.Kind.actions` of a kind with candidate answers):
:meth:`VLPModel.answer <vlp.api.VLPModel.answer>`, ALBEF's two-step answer ranking. It takes the
:class:`~vlp.api.VLPModel` first; the VLPModel method checks the kind and turns gradients off."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from vlp.api.inputs import Images, Texts, as_list


def answer(
    vm: Any,
    images: Images,
    questions: Texts,
    candidates: Optional[Sequence[str]] = None,
    k: Optional[int] = None,
    batch_size: Optional[int] = None,
) -> list[str]:
    """:meth:`vlp.api.VLPModel.answer`: the ranked answer (a string of ``candidates``, default the
    checkpoint's answer list) to each (image, question) pair."""
    from vlp.data.vqa import VQACollator, tokenize_answers

    answers = list(candidates) if candidates is not None else vm.answers
    if not answers:
        raise ValueError(
            "VLPModel.answer: this checkpoint stores no answer list (its data.answer_list file was "
            "not found when it was loaded); pass candidates=[...]"
        )
    questions = as_list(questions, (str,))
    if len(vm.image_list(images)) != len(questions):
        raise ValueError(
            f"answer takes one image per question: got {len(vm.image_list(images))} images "
            f"and {len(questions)} questions"
        )
    pre, bs = vm.preprocessor, batch_size or vm.batch_size
    cand_ids, cand_mask = tokenize_answers(vm.tokenizer, answers, pre.answer_max_len or 10)
    cand_ids, cand_mask = cand_ids.to(vm.device), cand_mask.to(vm.device)
    collate = VQACollator(vm.tokenizer, pre.max_len, pre.answer_max_len or 10)  # pre_question, as evaluation
    out: list[str] = []
    for b, pixels in enumerate(vm.image_batches(images, bs)):
        qs = questions[b * bs : b * bs + len(pixels)]
        batch = collate(
            [{"image": p, "question": q, "answers": [], "weights": [], "index": 0} for p, q in zip(pixels, qs)]
        )
        ids, mask = batch["input_ids"].to(vm.device), batch["attention_mask"].to(vm.device)
        states = vm.model.encode_question(pixels, ids, mask)
        pred, _ = vm.model.rank_answers(states, mask, cand_ids, cand_mask, k or vm.vqa_k_test)
        out += [answers[i] for i in pred.tolist()]
    return out
