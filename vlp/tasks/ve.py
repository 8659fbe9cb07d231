"""SNLI-VE fine-tuning: 3-way classification of (image premise, hypothesis) with momentum distillation."""

from __future__ import annotations

from typing import cast

import torch

from vlp.kinds import VE
from vlp.models.ve import VEModel
from vlp.tasks.base import Task


class VETask(Task):
    """ALBEF's VE loss: ``(1 - alpha) CE + alpha * soft CE`` against the momentum model's softmax.

    ``batch``: ``images`` [B, 3, H, W], ``input_ids``/``attention_mask`` [B, T], ``labels`` [B] long
    (0 contradiction, 1 neutral, 2 entailment). ``alpha`` ramps linearly from 0 over
    ``alpha_ramp_steps`` (ALBEF's VE: no ramp, ``warm_up: False``).
    """

    def __init__(self, model: VEModel, alpha: float = 0.4, alpha_ramp_steps: int = 0, distill: bool = True) -> None:
        super().__init__(model, alpha=alpha, alpha_ramp_steps=alpha_ramp_steps, distill=distill)
        if not isinstance(model, VEModel):
            raise ValueError(f"VETask needs a VEModel, got {type(model).__name__}")

    def forward(self, batch: dict[str, torch.Tensor], step: int = 0) -> dict[str, torch.Tensor]:
        m = cast(VEModel, self.model)
        args = (batch["images"], batch["input_ids"], batch["attention_mask"])
        return self.distilled_classification(m.classify, args, batch["labels"], step, VE)
