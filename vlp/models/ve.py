"""SNLI-VE model: ALBEF's encoders and fusion block, a 3-way classifier on the fused [CLS] state.

As ALBEF's ``model_ve.py``: the image premise goes through the ViT, the hypothesis through the
text layers, the fusion layers cross-attend to the image tokens, and ``cls_head`` =
``Linear(H, H), ReLU, Linear(H, 3)`` (so ALBEF's ``cls_head.{0,2}.*`` load onto it) classifies the
[CLS] fused state into :data:`VE_CLASSES` (0 contradiction, 1 neutral, 2 entailment). The momentum
twins (vision, text, fusion, cls_head) give the distillation targets.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from vlp.config import ModelConfig
from vlp.models.albef import ALBEF
from vlp.models.transfer import restore_ties

#: class index -> SNLI-VE label (ALBEF's order)
VE_CLASSES: tuple[str, ...] = ("contradiction", "neutral", "entailment")
TWIN = "momentum.twin."
#: pretraining-only parts a VE model never has
_PRETRAIN_ONLY = ("vision_proj.", "text_proj.", "itm_head.", "mlm_head.", "queue.")
_HEAD = "cls_head"


class VEModel(ALBEF):
    """ALBEF encoders + fusion block + ``cls_head`` on the [CLS] fused state (no ITC/ITM/MLM heads,
    no queue)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, itc=False, itm=False, mlm=False)
        self.queue = None  # type: ignore[assignment]  # never used by VE: no (empty) queue buffers in the state

    def build_heads(self) -> None:
        """The 3-way classifier (before the momentum twin is made)."""
        hidden = self.text.config.hidden_size
        self.cls_head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, len(VE_CLASSES)))

    def momentum_modules(self) -> dict[str, nn.Module]:
        """Twins of vision, text, fusion and cls_head (ALBEF's ``*_m``)."""
        return {n: getattr(self, n) for n in ("vision", "text", "fusion", _HEAD)}

    def classify(
        self,
        images: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        momentum: bool = False,
    ) -> torch.Tensor:
        """Premise images [B, 3, H, W] + hypothesis ids/mask [B, T] -> logits [B, 3]."""
        tokens = self.encode_image(images, momentum).tokens  # no vision_proj: the ViT tokens only
        hidden = self.text_states(input_ids, attention_mask, momentum)
        fused = self.fuse(hidden, attention_mask, tokens, momentum)
        return self._m(_HEAD, momentum)(fused[:, 0])

    @staticmethod
    def adapt_pretrained(
        state: Mapping[str, torch.Tensor], model: VEModel
    ) -> tuple[dict[str, torch.Tensor], list[str]]:
        """Map a checkpoint state to ``model``'s names -> (state, allow_missing patterns).

        Pretraining / retrieval state: the word embeddings saved only under their tied MLM-decoder
        name are restored (:func:`~vlp.models.transfer.restore_ties`); the heads, projections, temperature and queue a VE model
        lacks are dropped (online and twin), ``cls_head`` (and its twin, when the state has twins)
        is new. A VE state is kept whole. Momentum twins absent from the state are the caller's
        (:func:`vlp.models.transfer.load_pretrained` copies them from the online weights)."""
        out = {
            k: v
            for k, v in restore_ties(dict(state)).items()
            if k != "temp" and not any(k.removeprefix(TWIN).startswith(p) for p in _PRETRAIN_ONLY)
        }
        allow: list[str] = []
        if not any(k.startswith(_HEAD + ".") for k in out):
            allow.append(_HEAD + ".*")
            if any(k.startswith(TWIN) for k in out):
                allow.append(f"{TWIN}{_HEAD}.*")  # the twin was made from the same initial head
        return out, allow
