"""SRCL as a stateful ITC regulator: helper features, the helper queue and the alpha_h schedule.

The pure weight functions live in :mod:`vlp.losses.srcl`; this module holds what changes over
training: the frozen helper (or its cached features), a queue of helper features kept in the same
slots as the model's momentum queue, and ``alpha_h`` (1 -> 0 over the helper span; always 0 in
fine-tuning, where the live model alone regulates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from vlp.config import SRCLConfig
from vlp.dist import all_gather_nograd
from vlp.errors import ConfigError
from vlp.losses.contrastive import cosines
from vlp.losses.srcl import (
    alpha_h_at,
    mixed_similarity,
    removal_log_weights,
    srcl_weights,
    to_log_weights,
    weight_stats,
)
from vlp.models.momentum import FeatureQueue


def helper_span(cfg: SRCLConfig, total_steps: int, finetune: bool = False) -> int:
    """Optimizer steps over which alpha_h falls from 1 to 0 (0: the helper is never used)."""
    if finetune:
        return 0
    return total_steps if cfg.helper_span is None else cfg.helper_span


@dataclass
class HelperFeatures:
    """L2-normalised helper features of one batch, [B, E_h] each (fp32)."""

    image: torch.Tensor
    text: torch.Tensor


@dataclass
class Regulation:
    log_w_i2t: torch.Tensor  # [B, B + Q], 0 for positives, -inf for removed negatives
    log_w_t2i: torch.Tensor
    stats: dict[str, torch.Tensor]  # 0-d tensors for metrics.jsonl
    w_i2t: torch.Tensor  # the SRCL weights themselves (plots, tests)
    w_t2i: torch.Tensor
    removal: bool = False  # log-weights may hold -inf (removed negatives)


class SRCLRegulator(nn.Module):
    """Per-negative ITC weights for ``mode`` ``srcl`` (weights) or ``removal`` (ALBEF++).

    ``queue_size`` must equal the model's momentum-queue size: column ``B + k`` of the ITC bank
    and of the helper bank are then the same sample. ``helper_dim`` is the helper's embedding
    width. ``helper``: a frozen helper model for live mode (batches without cached features).
    """

    def __init__(
        self,
        cfg: SRCLConfig,
        mode: str,
        total_steps: int,
        queue_size: int,
        helper_dim: int,
        finetune: bool = False,
        helper: Optional[nn.Module] = None,
    ) -> None:
        super().__init__()
        if mode not in ("srcl", "removal"):
            raise ConfigError(f"config key 'loss.regulation': got {mode!r}, expected 'srcl' or 'removal'")
        self.cfg, self.mode = cfg, mode
        self.span = helper_span(cfg, total_steps, finetune)
        self.queue = FeatureQueue(queue_size if self.uses_helper else 0, dict(image=helper_dim, text=helper_dim))
        self.helper = helper
        if helper is not None:
            helper.eval()
            for p in helper.parameters():
                p.requires_grad_(False)

    @property
    def uses_helper(self) -> bool:
        return self.span > 0

    def train(self, mode: bool = True) -> SRCLRegulator:
        super().train(mode)
        if self.helper is not None:
            self.helper.eval()  # frozen: no dropout, whatever the task's mode
        return self

    def alpha_h(self, step: int) -> float:
        """Helper share of the mixed similarity at optimizer step ``step``."""
        return alpha_h_at(step, self.span)

    @torch.no_grad()
    def helper_features(self, batch: dict[str, torch.Tensor], step: int) -> Optional[HelperFeatures]:
        """The batch's helper features: cached (``helper_image``/``helper_text`` in the batch) or
        computed live by the frozen helper. None once the helper is no longer used."""
        if step >= self.span:  # alpha_h is 0 from here on (always, in fine-tuning)
            return None
        if "helper_image" in batch:
            return HelperFeatures(batch["helper_image"].float(), batch["helper_text"].float())
        if self.helper is None:
            raise ConfigError(
                "SRCL needs helper features: set 'loss.srcl.helper_features' (a cache from "
                "`vlp cache-helper-features`) or 'loss.srcl.helper' (a helper checkpoint)"
            )
        img = self.helper.encode_image(batch["images"]).feat
        txt = self.helper.encode_text(batch["input_ids"], batch["attention_mask"]).feat
        return HelperFeatures(img.float(), txt.float())

    @torch.no_grad()
    def regulate(
        self,
        cos_i2t: torch.Tensor,
        cos_t2i: torch.Tensor,
        positives: torch.Tensor,
        same_image: torch.Tensor,
        helper: Optional[HelperFeatures],
        step: int,
        alpha_h: Optional[float] = None,
    ) -> Regulation:
        """Log-weights for the ITC logits from the live cosines ``cos_*`` [B, B + Q] (online
        anchors vs momentum/queue columns), the helper features and ``alpha_h(step)``.

        ``same_image`` [B, B + Q] marks negatives that share the anchor's image id: known false
        negatives, whose mean weight is logged as a diagnostic (NaN when there are none).
        ``alpha_h`` overrides the schedule (plots, analysis)."""
        with torch.autocast(cos_i2t.device.type, enabled=False):
            a = self.alpha_h(step) if alpha_h is None else alpha_h
            h_i2t = h_t2i = None
            if a > 0:
                if helper is None:
                    raise ConfigError("SRCL: alpha_h > 0 but no helper features for this batch")
                h_i2t = cosines(helper.image, torch.cat([helper.text, self.queue.get("text")], 0))
                h_t2i = cosines(helper.text, torch.cat([helper.image, self.queue.get("image")], 0))
            c = self.cfg
            w_i2t = srcl_weights(mixed_similarity(cos_i2t, h_i2t, a, c.tau_w), positives, c.norm, c.delta)
            w_t2i = srcl_weights(mixed_similarity(cos_t2i, h_t2i, a, c.tau_w), positives, c.norm, c.delta)
            if self.mode == "removal":
                lw_i2t = removal_log_weights(w_i2t, positives, c.threshold, c.removal_reweight)
                lw_t2i = removal_log_weights(w_t2i, positives, c.threshold, c.removal_reweight)
            else:
                lw_i2t, lw_t2i = to_log_weights(w_i2t, positives), to_log_weights(w_t2i, positives)
            stats = weight_stats([w_i2t, w_t2i], positives)
            stats["srcl_alpha_h"] = torch.tensor(a)
            same = same_image & ~positives
            same_w = torch.where(same, w_i2t, 0.0).sum() + torch.where(same, w_t2i, 0.0).sum()
            stats["srcl_w_same_image"] = same_w / (2 * torch.count_nonzero(same))  # NaN without such negatives
            if self.mode == "removal":
                removed = torch.count_nonzero(torch.isneginf(lw_i2t)) + torch.count_nonzero(torch.isneginf(lw_t2i))
                n_neg = 2 * (positives.numel() - torch.count_nonzero(positives))
                stats["srcl_removed"] = removed / n_neg.clamp_min(1)
        return Regulation(lw_i2t, lw_t2i, stats, w_i2t, w_t2i, self.mode == "removal")

    @torch.no_grad()
    def enqueue(self, image_ids: torch.Tensor, helper: Optional[HelperFeatures]) -> None:
        """Write the global batch's helper features into the helper queue, in the same step (and
        hence the same slots) as the momentum features go into the model's queue."""
        if self.queue.size == 0 or helper is None:
            return
        self.queue.enqueue(
            all_gather_nograd(image_ids), image=all_gather_nograd(helper.image), text=all_gather_nograd(helper.text)
        )
