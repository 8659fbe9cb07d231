"""ALBEF pretraining task: ITC (queue + momentum distillation) + ITM (hard negatives) + MLM."""

from __future__ import annotations

from typing import Optional

import torch

from vlp.config import LossConfig
from vlp.models.albef import ALBEF
from vlp.tasks.base import Task
from vlp.tasks.reconstruction import Reconstruction
from vlp.tasks.regulation import SRCLRegulator
from vlp.tasks.objectives import TokenInfo, enqueue, itc_step, itm_step, mlm_step


class PretrainTask(Task):
    """Model + losses in one module: ``forward(batch, step)`` returns a dict with ``loss``.

    ``batch``: ``images`` [B, 3, H, W], ``input_ids``/``attention_mask`` [B, T], ``image_ids`` [B].
    """

    def __init__(self, model: ALBEF, loss: LossConfig, tokens: TokenInfo, seed: int = 0,
                 regulator: Optional[SRCLRegulator] = None, reconstruction: Optional[Reconstruction] = None) -> None:
        super().__init__(model, reconstruction, alpha=loss.alpha, alpha_ramp_steps=loss.alpha_ramp_steps,
                         distill=loss.distill, seed=seed)
        if (loss.regulation != "none") != (regulator is not None):
            raise ValueError(f"loss.regulation={loss.regulation!r} needs exactly one SRCLRegulator")
        self.regulator = regulator
        self.loss_cfg = loss
        self.tokens = tokens

    def forward(self, batch: dict[str, torch.Tensor], step: int = 0) -> dict[str, torch.Tensor]:
        m, c = self.model, self.loss_cfg
        images, ids, mask, image_ids = batch["images"], batch["input_ids"], batch["attention_mask"], batch["image_ids"]
        gen = self.generator(images.device)
        alpha = self.alpha(step)
        m.clamp_temp()

        img = m.encode_image(images)
        txt = m.encode_text(ids, mask)
        with torch.no_grad():
            img_m = m.encode_image(images, momentum=True)
            txt_m = m.encode_text(ids, mask, momentum=True)

        out: dict[str, torch.Tensor] = {}
        reg, helper, regulate = self.regulator, None, None
        if reg is not None:
            helper = reg.helper_features(batch, step)

            def regulate(cos_i2t, cos_t2i, pos, same):
                return reg.regulate(cos_i2t, cos_t2i, pos, same, helper, step)

        itc = itc_step(m, img, txt, img_m.feat, txt_m.feat, image_ids, alpha, c.itc_positives, regulate, c.contrastive,
                       global_bank=c.itc_bank == "global")
        kv = m.image_kv(img.tokens) if c.itm or c.mlm else None  # cross-attention K/V once, for ITM and MLM
        out["itc"] = itc.loss
        cols = itc.batch_cols
        out["itm"] = (
            itm_step(m, kv, txt, itc.sim_i2t[:, cols].detach(), itc.sim_t2i[:, cols].detach(), image_ids, gen)
            if c.itm else None
        )
        out["mlm"] = (
            mlm_step(m, ids, mask, kv, img_m.tokens, self.tokens, c.mlm_probability, alpha, gen) if c.mlm else None
        )
        out = {k: v for k, v in out.items() if v is not None}
        weights = dict(itc=c.itc, itm=c.itm, mlm=c.mlm)
        out["loss"] = sum(weights[k] * v for k, v in out.items())
        if self.reconstruction is not None:
            out["loss"], stats = self.reconstruction(out["loss"], txt.feat, batch)
            out.update(stats)
        enqueue(m, image_ids, img_m.feat, txt_m.feat)
        if reg is not None:
            reg.enqueue(image_ids, helper)  # same step, same slots as the momentum queue
        out.update(itc.stats)
        out["temp"] = m.temp.detach()
        out["alpha"] = torch.tensor(alpha)
        return out
