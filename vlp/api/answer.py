"""VQA (the kinds whose capabilities list ``answer``): :meth:`VLPModel.answer
<vlp.api.VLPModel.answer>`, ALBEF's two-step answer ranking. It takes the
:class:`~vlp.api.VLPModel` first, checks its kind and runs without gradients in eval mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

from vlp.api.capability import require
from vlp.api.inputs import Images, Texts, as_list, image_batches, image_list, inference

if TYPE_CHECKING:
    from vlp.api import VLPModel


@inference
def answer(
    vm: VLPModel,
    images: Images,
    questions: Texts,
    candidates: Optional[Sequence[str]] = None,
    k: Optional[int] = None,
    batch_size: Optional[int] = None,
) -> list[str]:
    """The answer to each (image, question) pair, ranked over ``candidates`` (default: the
    checkpoint's answer list) with ALBEF's two-step ranking: the ``k`` candidates (default the
    fine-tuning run's ``vqa.k_test``) with the most probable first token, re-scored by their
    full-sequence likelihood (:meth:`vlp.models.vqa.VQAModel.rank_answers`)."""
    require(vm, "answer", "the VQA answer decoder")
    model: Any = vm.model  # the kind's model class: what it offers depends on the kind
    from vlp.data.vqa import VQACollator, tokenize_answers  # lazily: not on the path of the other kinds

    answers = list(candidates) if candidates is not None else vm.answers
    if not answers:
        raise ValueError(
            "VLPModel.answer: this checkpoint stores no answer list (its data.answer_list file was "
            "not found when it was loaded); pass candidates=[...]"
        )
    questions = as_list(questions, (str,))
    if len(image_list(images)) != len(questions):
        raise ValueError(
            f"answer takes one image per question: got {len(image_list(images))} images and {len(questions)} questions"
        )
    pre, bs = vm.preprocessor, batch_size or vm.batch_size
    cand_ids, cand_mask = tokenize_answers(vm.tokenizer, answers, pre.answer_max_len or 10)
    cand_ids, cand_mask = cand_ids.to(vm.device), cand_mask.to(vm.device)
    collate = VQACollator(vm.tokenizer, pre.max_len, pre.answer_max_len or 10)  # pre_question, as evaluation
    out: list[str] = []
    for b, pixels in enumerate(image_batches(vm, images, bs)):
        qs = questions[b * bs : b * bs + len(pixels)]
        batch = collate(
            [{"image": p, "question": q, "answers": [], "weights": [], "index": 0} for p, q in zip(pixels, qs)]
        )
        ids, mask = batch["input_ids"].to(vm.device), batch["attention_mask"].to(vm.device)
        states = model.encode_question(pixels, ids, mask)
        pred, _ = model.rank_answers(states, mask, cand_ids, cand_mask, k or vm.vqa_k_test)
        out += [answers[i] for i in pred.tolist()]
    return out
