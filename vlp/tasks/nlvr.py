"""NLVR2 fine-tuning (with momentum distillation) and text-assignment (TA) pre-training."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vlp.kinds import NLVR
from vlp.losses.contrastive import cosines
from vlp.losses.nlvr import accuracy, assign_pairs
from vlp.models.nlvr import NLVRModel
from vlp.tasks.base import Task


def _require_head(model: NLVRModel, head: str, task: str) -> None:
    if getattr(model, "head_type", None) != head:
        raise ValueError(f"{task} needs an NLVRModel with head={head!r}, got {getattr(model, 'head_type', None)!r}")


class NLVRTask(Task):
    """NLVR2 classification: ``(1 - alpha) CE + alpha * soft CE`` against the momentum model.

    ``batch``: ``images0``/``images1`` [B, 3, H, W], ``input_ids``/``attention_mask`` [B, T],
    ``labels`` [B] long (1 = True). ``alpha`` ramps linearly from 0 over ``alpha_ramp_steps``.
    """

    def __init__(self, model: NLVRModel, alpha: float = 0.4, alpha_ramp_steps: int = 0, distill: bool = True) -> None:
        super().__init__(model, alpha=alpha, alpha_ramp_steps=alpha_ramp_steps, distill=distill)
        _require_head(model, "cls", "NLVRTask")

    def forward(self, batch: dict[str, torch.Tensor], step: int = 0) -> dict[str, torch.Tensor]:
        args = (batch["images0"], batch["images1"], batch["input_ids"], batch["attention_mask"])
        return self.distilled_classification(self.model.classify, args, batch["labels"], step, NLVR)


class TextAssignmentTask(Task):
    """TA pre-training on a pretraining batch: which of two images (or neither) a text describes.

    ``batch``: ``images`` [B, 3, H, W], ``input_ids``/``attention_mask`` [B, T], ``image_ids`` [B].
    One ViT pass; hard images from the frozen ``vision_proj`` image-image similarity / ``temp``;
    pairs and labels from :func:`vlp.losses.nlvr.assign_pairs` with the task's own generator.
    """

    def __init__(self, model: NLVRModel, seed: int = 0, temp: float = 0.07) -> None:
        super().__init__(model, seed=seed)
        _require_head(model, "ta", "TextAssignmentTask")
        if temp <= 0:
            raise ValueError(f"temp must be > 0, got {temp}")
        self.temp = temp

    @torch.no_grad()
    def image_similarity(self, cls_tokens: torch.Tensor) -> torch.Tensor:
        """ViT CLS tokens [B, W] -> normalised ``vision_proj`` cosine similarity / temp [B, B]."""
        feat = F.normalize(self.model.vision_proj(cls_tokens).float(), dim=-1)
        return cosines(feat, feat) / self.temp

    def forward(self, batch: dict[str, torch.Tensor], step: int = 0) -> dict[str, torch.Tensor]:
        m = self.model
        images, image_ids = batch["images"], batch["image_ids"]
        tokens = m.image_tokens(images)  # [B, 1 + N, W]
        sim = self.image_similarity(tokens[:, 0].detach())
        idx0, idx1, labels = assign_pairs(sim, image_ids, self.generator(images.device))
        logits = m.pair_logits(tokens[idx0], tokens[idx1], batch["input_ids"], batch["attention_mask"])
        loss = F.cross_entropy(logits.float(), labels)
        return {"loss": loss, "ta": loss.detach(), "acc": accuracy(logits, labels)}
