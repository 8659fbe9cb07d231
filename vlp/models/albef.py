"""The ALBEF model: image tower, text tower, fusion block, projections, heads, momentum twins, queues.

The model computes features; it never tokenizes, reads files or computes losses (see
``vlp.tasks``). Every encoder method takes ``momentum=True`` to run the frozen EMA twin instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from vlp.config import VISION_PRESETS, ModelConfig, resolved
from vlp.models.heads import MLMHead
from vlp.models.momentum import FeatureQueue, MomentumTwin
from vlp.models.text import FusionEncoder, ImageKV, build_text
from vlp.models.vision import build_vision

TEMP_MIN, TEMP_MAX = 0.001, 0.5


@dataclass
class ImageFeatures:
    tokens: torch.Tensor  # [B, 1 + N, W] all tokens after the final norm
    feat: Optional[torch.Tensor]  # [B, E] L2-normalised projection of the CLS token (None without ITC)
    proj: Optional[torch.Tensor] = None  # [B, E] that projection before the L2 norm (float; None without ITC)


@dataclass
class TextFeatures:
    hidden: torch.Tensor  # [B, T, H] last unimodal layer
    mask: torch.Tensor  # [B, T] 1 = token
    feat: torch.Tensor  # [B, E] L2-normalised projection of [CLS]
    proj: Optional[torch.Tensor] = None  # [B, E] that projection before the L2 norm (float)


class ALBEF(nn.Module):
    """ALBEF-style dual encoder + fusion encoder with momentum twins and feature queues.

    ``itc`` / ``itm`` / ``mlm`` choose the heads: projections + temperature + queues, the ITM head,
    the MLM head (retrieval fine-tuning drops the MLM head; VQA and NLVR2 keep only the encoders).
    Task models subclass it: :meth:`build_heads` adds their modules before the momentum twin is
    made from :meth:`momentum_modules`.
    """

    def __init__(self, cfg: ModelConfig, itc: bool = True, itm: bool = True, mlm: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.vision = build_vision(cfg.vision)
        vision_width = resolved(cfg.vision, VISION_PRESETS)["width"]
        self.text, self.fusion = build_text(cfg.text, vision_width)
        hidden = self.text.config.hidden_size
        self.vision_proj = nn.Linear(vision_width, cfg.embed_dim) if itc else None
        self.text_proj = nn.Linear(hidden, cfg.embed_dim) if itc else None
        self.temp = nn.Parameter(torch.tensor(float(cfg.temp))) if itc else None
        self.itm_head = nn.Linear(hidden, 2) if itm else None
        self.mlm_head = None
        if mlm:
            self.mlm_head = MLMHead(hidden, self.text.config.vocab_size, self.text.config.layer_norm_eps)
            self.mlm_head.tie(self.text.embeddings.word_embeddings)
        self.build_heads()
        # ITM head and temperature have no momentum copy (ALBEF §1.3).
        self.momentum = MomentumTwin(self.momentum_modules(), cfg.momentum)
        self.queue = FeatureQueue(cfg.queue_size if itc else 0, dict(image=cfg.embed_dim, text=cfg.embed_dim))

    def build_heads(self) -> None:
        """Task models add their own modules here (called before the momentum twin is made)."""

    def momentum_modules(self) -> dict[str, nn.Module]:
        """The online modules that get a momentum twin (ALBEF: encoders, projections, MLM head)."""
        names = ("vision", "vision_proj", "text", "fusion", "mlm_head", "text_proj")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    # -- helpers -------------------------------------------------------------------------------

    def _m(self, name: str, momentum: bool) -> nn.Module:
        return self.momentum[name] if momentum else getattr(self, name)

    @torch.no_grad()
    def clamp_temp(self) -> None:
        self.temp.clamp_(TEMP_MIN, TEMP_MAX)

    # -- encoders ------------------------------------------------------------------------------

    def encode_image(self, images: torch.Tensor, momentum: bool = False) -> ImageFeatures:
        """``images`` [B, 3, H, W] -> tokens [B, 1+N, W] and normalised features [B, E]."""
        tokens = self._m("vision", momentum).forward_features(images)
        if self.vision_proj is None:  # no ITC head (VQA, NLVR2): tokens only
            return ImageFeatures(tokens, None)
        proj = self._m("vision_proj", momentum)(tokens[:, 0]).float()
        return ImageFeatures(tokens, F.normalize(proj, dim=-1), proj)

    def text_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, momentum: bool = False
    ) -> torch.Tensor:
        """Unimodal text layers: ids [B, T] -> hidden [B, T, H]."""
        return self._m("text", momentum)(input_ids, attention_mask)

    def encode_text(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, momentum: bool = False
    ) -> TextFeatures:
        hidden = self.text_states(input_ids, attention_mask, momentum)
        proj = self._m("text_proj", momentum)(hidden[:, 0]).float()
        return TextFeatures(hidden, attention_mask, F.normalize(proj, dim=-1), proj)

    def encode_text_and_masked(
        self, input_ids: torch.Tensor, masked_ids: torch.Tensor, attention_mask: torch.Tensor, momentum: bool = False
    ) -> tuple[TextFeatures, torch.Tensor]:
        """:meth:`encode_text` of ``input_ids`` [B, T] and the text states [B, T, H] of ``masked_ids``
        (the MLM input, same mask) in one pass of the text layers over [2B, T]: half the launches
        of two passes, and each weight read once. Rows do not interact, so the results are those
        of two passes."""
        b = input_ids.shape[0]
        both = self.text_states(
            torch.cat([input_ids, masked_ids]), torch.cat([attention_mask, attention_mask]), momentum
        )
        hidden = both[:b]
        feat = F.normalize(self._m("text_proj", momentum)(hidden[:, 0]).float(), dim=-1)
        return TextFeatures(hidden, attention_mask, feat), both[b:]

    def image_kv(self, image_tokens: Union[torch.Tensor, Sequence[torch.Tensor]], momentum: bool = False) -> ImageKV:
        """Cross-attention K/V for every fusion layer, projected once (reuse across passes)."""
        return self._m("fusion", momentum).image_kv(image_tokens)

    def fuse(
        self,
        text_hidden: torch.Tensor,
        text_mask: torch.Tensor,
        image: Union[torch.Tensor, Sequence[torch.Tensor], ImageKV],
        momentum: bool = False,
        image_index: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Fusion layers: text states [B, T, H] x image tokens (or K/V) -> fused states [B, T, H].
        ``image_index`` [B]: ``image`` holds one entry per distinct image, row b's is
        ``image_index[b]``, broadcast to its rows without copies (ITM re-ranking)."""
        return self._m("fusion", momentum)(text_hidden, text_mask, image, image_index=image_index)

    def itm_logits(self, fused: torch.Tensor) -> torch.Tensor:
        """[B, T, H] fused states -> [B, 2] (class 1 = match) from the [CLS] position."""
        return self.itm_head(fused[:, 0])

    def mlm_logits(self, fused_at_masked: torch.Tensor, momentum: bool = False) -> torch.Tensor:
        """[M, H] fused states at masked positions -> [M, V] vocabulary logits."""
        return self._m("mlm_head", momentum)(fused_at_masked)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Non-reentrant activation checkpointing in the online ViT blocks, text layers and every
        fusion block (task models' too); the momentum twins run without gradient and are untouched."""
        self.vision.set_grad_checkpointing(enable)
        for name, module in self.named_modules():
            if isinstance(module, FusionEncoder) and not name.startswith("momentum."):
                module.grad_checkpointing = enable

    def compile_blocks(self, backend: str = "inductor") -> int:
        """Regional ``torch.compile``: every ViT block, text layer and fusion layer (the momentum
        twins' too) is compiled in place; identical blocks share one compiled graph, the code
        between blocks (losses, sampling, queues) stays eager. Returns the number of blocks."""
        from timm.models.vision_transformer import Block

        from vlp.models.text import FusionLayer

        blocks = [m for m in self.modules() if isinstance(m, (Block, FusionLayer))]
        for block in blocks:
            block.compile(backend=backend)
        return len(blocks)

    # -- state ---------------------------------------------------------------------------------

    def momentum_at(self, step: int | torch.Tensor) -> float | torch.Tensor:
        """EMA momentum after optimizer step ``step`` (1-based): constant, or ramped from 0. A 0-d
        tensor ``step`` (a compiled post-step graph's) gives a 0-d tensor, with no host read."""
        w = self.cfg.momentum_warmup_steps
        if w <= 0:
            return self.cfg.momentum
        if isinstance(step, torch.Tensor):
            return self.cfg.momentum * (step / w).clamp(max=1.0)
        return self.cfg.momentum * min(1.0, step / w)

    def after_optimizer_step(self, step: int | torch.Tensor, skipped: Optional[torch.Tensor] = None) -> None:
        """EMA update of the momentum twins (ALBEF's start-of-forward update, moved here); none
        when ``skipped`` (a 0-d bool device tensor) is true. ``step``: 1-based, an int or a 0-d
        tensor (see :meth:`momentum_at`)."""
        self.momentum.update(self.momentum_at(step), skipped)


def param_count(module: nn.Module, trainable_only: bool = True) -> int:
    seen, n = set(), 0
    for p in module.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        n += p.numel()
    return n
