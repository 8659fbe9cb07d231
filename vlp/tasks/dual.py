"""Dual-encoder contrastive task: a registered contrastive loss on in-batch similarities (+ LTD / ITD).

The resource-constrained setting of the LTD and ECIR papers: no fusion, ITM, MLM, momentum or
queue. Each rank scores its own queries against the whole global batch (gathered with gradient).
"""

from __future__ import annotations

from typing import Optional

import torch

from vlp.config import LossConfig
from vlp.dist import all_gather_nograd, all_gather_with_grad
from vlp.losses.contrastive import cosines
from vlp.losses.protocol import ContrastiveInputs
from vlp.losses.registry import build_loss
from vlp.models.dual import DualEncoder
from vlp.tasks.base import Task
from vlp.tasks.reconstruction import Reconstruction


class DualTask(Task):
    """``forward(batch, step)``: ``images`` [B, 3, H, W], ``input_ids``/``attention_mask`` [M, T],
    ``image_ids`` [B], optional ``text_image_ids`` [M] (image-level batches, M = B x k; default:
    the caption of item b belongs to image b). Positives are all pairs with the same image id."""

    def __init__(self, model: DualEncoder, loss: LossConfig, reconstruction: Optional[Reconstruction] = None) -> None:
        super().__init__(model, reconstruction)
        self.contrastive = build_loss(loss.contrastive)
        if self.contrastive.uses_tau and loss.contrastive.tau is None:
            raise ValueError("the dual encoder needs a fixed loss.contrastive.tau")
        self.loss_cfg = loss

    def forward(self, batch: dict[str, torch.Tensor], step: int = 0) -> dict[str, torch.Tensor]:
        batch = self.on_device(batch)
        img = self.model.encode_image(batch["images"]).feat
        txt = self.model.encode_text(batch["input_ids"], batch["attention_mask"]).feat
        img_ids = batch["image_ids"]
        txt_ids = batch.get("text_image_ids", img_ids)
        all_img, all_txt = all_gather_with_grad(img), all_gather_with_grad(txt)
        all_img_ids, all_txt_ids = all_gather_nograd(img_ids), all_gather_nograd(txt_ids)
        l_con = self.contrastive(
            ContrastiveInputs(
                cosines(img, all_txt),
                img_ids[:, None] == all_txt_ids[None, :],
                cosines(txt, all_img),
                txt_ids[:, None] == all_img_ids[None, :],
                tau=self.loss_cfg.contrastive.tau,
            )
        )
        out = {"contrastive": l_con.detach()}
        loss = l_con
        if self.reconstruction is not None:
            loss, stats = self.reconstruction(l_con, txt, batch)
            out.update(stats)
        out["loss"] = loss
        return out
