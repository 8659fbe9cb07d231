"""SRCL as a stateful ITC regulator: helper features, the helper queue and the alpha_h schedule.

The pure weight functions live in :mod:`vlp.losses.srcl`; this module holds what changes over
training: the frozen helper (or its cached features), a queue of helper features kept in the same
slots as the model's momentum queue, and ``alpha_h`` (1 -> ``alpha_h_end`` over the helper span;
always 0 in fine-tuning, where the live model alone regulates).

An oracle helper (a cache of the world's ground truth, :mod:`vlp.features.helper_cache`) travels the
same path: its "features" are row indices into a relevance table the regulator holds, and its
"cosine" of an (image, caption) is their relevance (:func:`helper_similarities`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from vlp.config import SRCLConfig
from vlp.dist import all_gather_nograd
from vlp.errors import ConfigError
from vlp.losses.contrastive import cosines
from vlp.losses.srcl import (
    alpha_h_at,
    effective_negatives,
    mixed_similarity,
    relevance_lookup,
    removal_log_weights,
    srcl_weights,
    to_log_weights,
    weight_stats,
)
from vlp.models.momentum import FeatureQueue
from vlp.tasks.regulation_watch import RegulationWatch


def helper_span(cfg: SRCLConfig, total_steps: int, finetune: bool = False) -> int:
    """Optimizer steps over which alpha_h falls from 1 to ``alpha_h_end`` (0: the helper is never used)."""
    if finetune:
        return 0
    return total_steps if cfg.helper_span is None else cfg.helper_span


@torch.no_grad()
def helper_similarities(
    image: torch.Tensor,
    text: torch.Tensor,
    queue_image: torch.Tensor,
    queue_text: torch.Tensor,
    relevance: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The helper's cross-modal similarities ``(i2t, t2i)``, [B, B + Q] each (fp32): the batch's
    helper features ``image``/``text`` [B, E] against [batch | queue] (``queue_*`` [Q, E]).

    Learned helper: cosines of L2-normalised features. Oracle (``relevance`` [n_texts, n_images],
    features = row indices [., 1]): ``relevance[text, image]`` of each pair; queue slots never
    written (index -1) count as irrelevant."""
    bank_t, bank_i = torch.cat([text, queue_text], 0), torch.cat([image, queue_image], 0)
    if relevance is None:
        return cosines(image, bank_t), cosines(text, bank_i)
    return relevance_lookup(relevance, bank_t, image).T, relevance_lookup(relevance, text, bank_i)


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
    # the momentum-distillation targets are also computed from the weighted momentum logits
    # (loss.srcl.weight_targets; see vlp.tasks.objectives.itc_step)
    weight_targets: bool = False


class SRCLRegulator(nn.Module):
    """Per-negative ITC weights for ``mode`` ``srcl`` (weights) or ``removal`` (ALBEF++).

    ``queue_size`` must equal the model's momentum-queue size: column ``B + k`` of the ITC bank
    and of the helper bank are then the same sample. ``helper_dim`` is the helper's embedding
    width. ``helper``: a frozen helper model for live mode (batches without cached features).
    ``relevance`` [n_texts, n_images]: the table of an oracle helper cache (``helper_dim`` 1, the
    batch's helper features are row indices into it); a non-persistent buffer (not checkpointed).
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
        relevance: Optional[torch.Tensor] = None,
    ) -> None:
        super().__init__()
        if mode not in ("srcl", "removal"):
            raise ConfigError(f"config key 'loss.regulation': got {mode!r}, expected 'srcl' or 'removal'")
        cfg.require_delta(mode)
        self.cfg, self.mode = cfg, mode
        self.delta = 1.0 if cfg.delta is None else cfg.delta  # mean norm: delta cancels
        knob = f"loss.srcl.delta={self.delta:g}" if cfg.norm == "softmax" else "loss.srcl.norm=mean (its floor is ~0.4)"
        self.watch = RegulationWatch(knob)  # the band of the first log windows, checked at every log step
        self.span = helper_span(cfg, total_steps, finetune)
        self.queue = FeatureQueue(queue_size if self.uses_helper else 0, dict(image=helper_dim, text=helper_dim))
        self.helper = helper
        self.relevance: Optional[torch.Tensor]
        if relevance is not None:
            if helper_dim != 1 or relevance.dim() != 2:
                raise ValueError("an oracle relevance table [n_texts, n_images] needs helper_dim 1 (index features)")
            self.register_buffer("relevance", relevance.float(), persistent=False)
            for name in self.queue.names:
                self.queue.get(name).fill_(-1.0)  # empty slots: no sample, no relevance
        else:
            self.relevance = None
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
        return alpha_h_at(step, self.span, self.cfg.alpha_h_end)

    @torch.no_grad()
    def helper_features(self, batch: dict[str, torch.Tensor], step: int) -> Optional[HelperFeatures]:
        """The batch's helper features: cached (``helper_image``/``helper_text`` in the batch) or
        computed live by the frozen helper. None once the helper is no longer used."""
        if self.alpha_h(step) == 0.0:  # past the span with alpha_h_end = 0 (always, in fine-tuning)
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
                q = self.queue
                h_i2t, h_t2i = helper_similarities(
                    helper.image, helper.text, q.get("image"), q.get("text"), self.relevance
                )
            c = self.cfg
            w_i2t = srcl_weights(mixed_similarity(cos_i2t, h_i2t, a, c.tau_w), positives, c.norm, self.delta)
            w_t2i = srcl_weights(mixed_similarity(cos_t2i, h_t2i, a, c.tau_w), positives, c.norm, self.delta)
            if self.mode == "removal":
                lw_i2t = removal_log_weights(w_i2t, positives, c.threshold, c.removal_reweight)
                lw_t2i = removal_log_weights(w_t2i, positives, c.threshold, c.removal_reweight)
            else:
                lw_i2t, lw_t2i = to_log_weights(w_i2t, positives), to_log_weights(w_t2i, positives)
            stats = weight_stats([w_i2t, w_t2i], positives)
            stats.update(effective_negatives([w_i2t, w_t2i], positives))
            stats["srcl_alpha_h"] = torch.full((), a, device=w_i2t.device)  # a fill, not a copy from host memory
            same = same_image & ~positives
            stats["srcl_w_same_image"] = _mean_where([w_i2t, w_t2i], [same, same])  # NaN without such negatives
            if self.mode == "removal":
                removed = torch.count_nonzero(torch.isneginf(lw_i2t)) + torch.count_nonzero(torch.isneginf(lw_t2i))
                n_neg = 2 * (positives.numel() - torch.count_nonzero(positives))
                stats["srcl_removed"] = removed / n_neg.clamp_min(1)
            if self.relevance is not None:  # oracle: the weight of the true false negatives (NaN: none, or no helper)
                fn = [(h == 1.0) & ~positives for h in (h_i2t, h_t2i) if h is not None]
                none = torch.full((), float("nan"), device=w_i2t.device)
                stats["srcl_w_true_false_negatives"] = _mean_where([w_i2t, w_t2i], fn) if fn else none
        return Regulation(lw_i2t, lw_t2i, stats, w_i2t, w_t2i, self.mode == "removal", c.weight_targets)

    def check_log(self, record: dict[str, Any]) -> Optional[str]:
        """A warning about a log record (:class:`vlp.tasks.regulation_watch.RegulationWatch`): the
        run hardly regulates in its first log windows, or a later window's SRCL statistics left the
        band of the first ones (once per excursion)."""
        return self.watch.check(record)

    @torch.no_grad()
    def enqueue(self, image_ids: torch.Tensor, helper: Optional[HelperFeatures]) -> None:
        """Write the global batch's helper features into the helper queue, in the same step (and
        hence the same slots) as the momentum features go into the model's queue."""
        if self.queue.size == 0 or helper is None:
            return
        self.queue.enqueue(
            all_gather_nograd(image_ids), image=all_gather_nograd(helper.image), text=all_gather_nograd(helper.text)
        )


def _mean_where(values: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """Mean of ``values`` over the entries ``masks`` select, pooled (0-d; NaN when none)."""
    total = torch.zeros((), device=values[0].device)
    count = torch.zeros((), device=values[0].device)
    for v, m in zip(values, masks):
        total, count = total + torch.where(m, v, 0.0).sum(), count + torch.count_nonzero(m)
    return total / count
