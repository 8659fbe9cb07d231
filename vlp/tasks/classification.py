"""Any image-text classifier's fine-tuning loss: :class:`ClassificationTask`."""

from __future__ import annotations

from typing import Callable, Sequence, cast

import torch
from torch import nn

from vlp.tasks.base import Task


class ClassificationTask(Task):
    """``(1 - alpha) CE + alpha * soft CE`` against the momentum model (``alpha`` ramps linearly from
    0 over ``alpha_ramp_steps``; ``distill=False``: plain CE) of ``model.classify(*batch[inputs])``
    -> logits [B, C] (with ``momentum=True`` the twin's, when distilling).

    ``batch``: the ``inputs`` keys (e.g. ``images`` [B, 3, H, W], ``input_ids``/``attention_mask``
    [B, T]) and ``labels`` [B] long. The loss is logged under ``name``."""

    def __init__(
        self,
        model: nn.Module,
        inputs: Sequence[str],
        name: str,
        alpha: float = 0.4,
        alpha_ramp_steps: int = 0,
        distill: bool = True,
    ) -> None:
        super().__init__(model, alpha=alpha, alpha_ramp_steps=alpha_ramp_steps, distill=distill)
        if not callable(getattr(model, "classify", None)):
            raise ValueError(f"ClassificationTask needs a model with classify(), got {type(model).__name__}")
        self.inputs, self.name = tuple(inputs), name

    def forward(self, batch: dict[str, torch.Tensor], step: int = 0) -> dict[str, torch.Tensor]:
        args = tuple(batch[k] for k in self.inputs)
        classify = cast(Callable[..., torch.Tensor], self.model.classify)
        return self.distilled_classification(classify, args, batch["labels"], step, self.name)
