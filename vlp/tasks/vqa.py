"""VQA fine-tuning task: answer generation with weighted, token-summed NLL and momentum distillation."""

from __future__ import annotations

import torch

from vlp.kinds import VQA
from vlp.losses.vqa import vqa_loss
from vlp.models.text import select_kv
from vlp.models.vqa import VQAModel
from vlp.tasks.base import Task


class VQATask(Task):
    """``forward(batch, step)`` -> ``{"loss", "vqa", "alpha"}`` (scalars).

    ``batch``: ``images`` [B, 3, H, W]; ``input_ids``/``attention_mask`` [B, T] the questions;
    ``answer_ids``/``answer_mask`` [A, L] ``[CLS] answer [SEP]``; ``answer_weights`` [A] float;
    ``answer_question`` [A] long, the question of each answer. Loss: :func:`vqa_loss` over the A
    answers divided by B, distilled from the momentum encoder + decoder with weight ``alpha``
    (ramped linearly from 0 over ``alpha_ramp_steps``; 0 when ``distill`` is off).
    """

    def __init__(self, model: VQAModel, alpha: float = 0.4, alpha_ramp_steps: int = 0, distill: bool = True) -> None:
        super().__init__(model, alpha=alpha, alpha_ramp_steps=alpha_ramp_steps, distill=distill)

    def _answer_logits(self, batch: dict[str, torch.Tensor], momentum: bool) -> torch.Tensor:
        """Encode the B questions, repeat their decoder K/V per answer, decode -> logits [A, L, V].

        The question states' cross-attention K/V are projected once per question and indexed per
        answer (same result as repeating the states, with one projection per question).
        """
        m, q_of = self.model, batch["answer_question"]
        states = m.encode_question(batch["images"], batch["input_ids"], batch["attention_mask"], momentum)
        kv = select_kv(m.question_kv(states, momentum), q_of)
        q_mask = batch["attention_mask"].index_select(0, q_of)
        return m.answer_logits(kv, q_mask, batch["answer_ids"], batch["answer_mask"], momentum)

    def forward(self, batch: dict[str, torch.Tensor], step: int = 0) -> dict[str, torch.Tensor]:
        alpha = self.alpha(step)
        logits = self._answer_logits(batch, momentum=False)
        logits_m = None
        if alpha > 0:
            with torch.no_grad():
                logits_m = self._answer_logits(batch, momentum=True)
        loss = vqa_loss(
            logits,
            batch["answer_ids"],
            batch["answer_mask"],
            batch["answer_weights"],
            batch["input_ids"].shape[0],
            logits_m,
            alpha,
        )
        return {"loss": loss, VQA: loss.detach(), "alpha": torch.tensor(alpha)}
