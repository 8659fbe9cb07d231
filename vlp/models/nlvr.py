"""NLVR2 model: ALBEF with a doubled fusion block that alternates between two images.

The fusion block has ``2F`` layers (F = the configured fusion-layer count): even layers attend to
image 0, odd layers to image 1, and layers ``2i``/``2i+1`` share one cross-attention key and value
projection (the same fused ``kv`` Linear). Pretrained fusion layer ``N`` initialises both ``2N``
and ``2N+1`` (:meth:`NLVRModel.adapt_pretrained`).

Two heads: ``cls`` (NLVR2 fine-tuning, True/False on the [CLS] fused state, with momentum twins
for distillation) and ``ta`` (text-assignment pre-training, 3 classes, no momentum twin).
"""

from __future__ import annotations

import copy
import re
from typing import Mapping

import torch
from torch import nn

from vlp.config import TEXT_PRESETS, ModelConfig, resolved
from vlp.models.albef import ALBEF

HEADS = ("cls", "ta")
TWIN = "momentum.twin."
# Pretraining-only parts that an NLVR model never has (projections are handled per head).
_PRETRAIN_ONLY = ("mlm_head.", "text_proj.", "itm_head.", "queue.")
_WORD_EMB = "text.embeddings.word_embeddings.weight"
_MLM_DECODER = "mlm_head.decoder.weight"  # tied to the word embeddings in pretraining models


def doubled_config(cfg: ModelConfig) -> tuple[ModelConfig, int]:
    """A copy of ``cfg`` with ``2F`` fusion layers and no initialisation source -> (cfg, F)."""
    base = int(resolved(cfg.text, TEXT_PRESETS)["fusion_layers"])
    out = copy.deepcopy(cfg)
    out.text.fusion_layers = 2 * base
    out.text.init = "random"  # BERT has no layers for the doubled block: weights come from a checkpoint
    out.vision.pretrained = None
    return out, base


class NLVRModel(ALBEF):
    """ALBEF encoders + doubled, image-alternating fusion block + an NLVR2 (``cls``) or text-
    assignment (``ta``) head on the [CLS] fused state.

    ``self.cfg`` is the ORIGINAL (un-doubled) config, so ``NLVRModel(model.cfg, head)`` rebuilds
    the same model; ``self.base_fusion_layers`` is F.
    """

    def __init__(self, cfg: ModelConfig, head: str = "cls") -> None:
        if head not in HEADS:
            raise ValueError(f"NLVRModel head must be one of {list(HEADS)}, got {head!r}")
        doubled, base = doubled_config(cfg)
        self.head_type = head  # read by build_heads / momentum_modules during super().__init__
        self.base_fusion_layers = base
        # TA needs vision_proj (hard images); only ALBEF's ITC switch builds it.
        super().__init__(doubled, itc=head == "ta", itm=False, mlm=False)
        self.cfg = cfg
        self.queue = None  # never used by NLVR; no (empty) queue buffers in the state

    # -- construction hooks ----------------------------------------------------------------

    def build_heads(self) -> None:
        """Tie the cross-attention K/V of each layer pair and add the head (before the twin)."""
        for i in range(self.base_fusion_layers):
            even, odd = self.fusion.layer[2 * i].crossattention.self, self.fusion.layer[2 * i + 1].crossattention.self
            odd.kv = even.kv
        hidden = self.text.config.hidden_size
        if self.head_type == "cls":
            self.cls_head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))
        else:
            self.ta_head = nn.Linear(hidden, 3)
            # Only vision_proj is used, and only without gradient: freeze it (no unused trainable
            # parameter under DDP, no weight decay on it) and drop the rest of ITC.
            self.vision_proj.requires_grad_(False)
            self.text_proj = None
            self.temp = None

    def momentum_modules(self) -> dict[str, nn.Module]:
        """``cls``: twins of vision, text, fusion, cls_head (K/V ties survive the deepcopy). ``ta``: none."""
        if self.head_type == "ta":
            return {}
        return {n: getattr(self, n) for n in ("vision", "text", "fusion", "cls_head")}

    @property
    def n_classes(self) -> int:
        return 2 if self.head_type == "cls" else 3

    def head_module(self, momentum: bool = False) -> nn.Module:
        if momentum and self.head_type == "ta":
            raise ValueError("the text-assignment model has no momentum twin")
        return self._m("cls_head" if self.head_type == "cls" else "ta_head", momentum)

    # -- forward pieces --------------------------------------------------------------------

    def image_tokens(self, images: torch.Tensor, momentum: bool = False) -> torch.Tensor:
        """``images`` [B, 3, H, W] -> ViT tokens [B, 1 + N, W] (no projection)."""
        if momentum and self.head_type == "ta":
            raise ValueError("the text-assignment model has no momentum twin")
        return self._m("vision", momentum).forward_features(images)

    def pair_logits(
        self,
        tokens0: torch.Tensor,
        tokens1: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        momentum: bool = False,
    ) -> torch.Tensor:
        """Image tokens [B, 1+N, W] x2 + text ids/mask [B, T] -> head logits [B, n_classes].

        Even fusion layers attend to ``tokens0``, odd ones to ``tokens1``.
        """
        head = self.head_module(momentum)
        hidden = self.text_states(input_ids, attention_mask, momentum)
        fused = self.fuse(hidden, attention_mask, [tokens0, tokens1], momentum)
        return head(fused[:, 0])

    def classify(
        self,
        images0: torch.Tensor,
        images1: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        momentum: bool = False,
    ) -> torch.Tensor:
        """Two images [B, 3, H, W] each + text [B, T] -> logits [B, n_classes].

        Both images go through ONE ViT pass (concatenated on the batch axis, then split).
        """
        b = images0.shape[0]
        tokens = self.image_tokens(torch.cat([images0, images1], 0), momentum)
        return self.pair_logits(tokens[:b], tokens[b:], input_ids, attention_mask, momentum)

    # -- checkpoints -----------------------------------------------------------------------

    @staticmethod
    def needs_momentum_copy(state: Mapping[str, torch.Tensor]) -> bool:
        """True when ``state`` has no momentum weights: copy online -> momentum AFTER loading it."""
        return not any(k.startswith(TWIN) for k in state)

    @staticmethod
    def adapt_pretrained(
        state: Mapping[str, torch.Tensor], model: NLVRModel
    ) -> tuple[dict[str, torch.Tensor], list[str]]:
        """Map a checkpoint state to ``model``'s names -> (state, allow_missing patterns).

        * Pretraining state (fusion layers ``0..F-1``): layer N -> layers 2N and 2N+1 (online and
          momentum twin); pretraining heads, queue, temperature and projections the model lacks are
          dropped; word embeddings saved only under their tied MLM-decoder alias are recovered.
        * NLVR state (already doubled, e.g. text assignment): heads/projections the model lacks
          are dropped.
        * Fine-tuned NLVR state: unchanged.

        ``allow_missing`` names the model's head(s) absent from the state, and every momentum key
        when the state has none (then call ``model.momentum.copy_from_online()`` after loading).
        Tied aliases absent from the state (one name per tied group on disk) are the caller's.
        """
        out = dict(state)
        base = model.base_fusion_layers
        layers = _fusion_layers(out)
        if layers and max(layers) >= 2 * base:
            raise ValueError(f"checkpoint has fusion layers up to {max(layers)}, the model only {2 * base}")
        if 2 * base - 1 not in layers:  # not doubled yet: a pretraining state
            if layers != set(range(base)):
                raise ValueError(
                    f"pretraining checkpoint has fusion layers {sorted(layers)}, "
                    f"expected 0..{base - 1} to double into {2 * base}"
                )
            out = _recover_word_embeddings(out)
            out = _double_fusion(out)
        twins = set(model.momentum.twin.keys())
        drop = list(_PRETRAIN_ONLY)
        for name in ("vision_proj", "cls_head", "ta_head"):
            if getattr(model, name, None) is None:
                drop.append(name + ".")
        out = {
            k: v
            for k, v in out.items()
            if not _dropped(k, drop) and not (k.startswith(TWIN) and k[len(TWIN) :].split(".")[0] not in twins)
        }
        no_twin_state = NLVRModel.needs_momentum_copy(out)
        allow: list[str] = []
        for name in ("cls_head", "ta_head"):
            if getattr(model, name, None) is not None and not any(k.startswith(name + ".") for k in out):
                allow.append(name + ".*")
                if name in twins and not no_twin_state:
                    allow.append(f"{TWIN}{name}.*")
        if no_twin_state and twins:
            allow.append(TWIN + "*")
        return out, allow


_LAYER = re.compile(r"^(momentum\.twin\.)?fusion\.layer\.(\d+)\.(.*)$")


def _fusion_layers(state: Mapping[str, torch.Tensor]) -> set[int]:
    """Indices of the online fusion layers present in ``state``."""
    return {int(m.group(2)) for k in state if (m := _LAYER.match(k)) and m.group(1) is None}


def _double_fusion(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``[momentum.twin.]fusion.layer.N.*`` -> ``...layer.2N.*`` and ``...layer.2N+1.*`` (same tensor)."""
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        m = _LAYER.match(k)
        if m is None:
            out[k] = v
            continue
        prefix, n, rest = m.group(1) or "", int(m.group(2)), m.group(3)
        for i in (2 * n, 2 * n + 1):
            out[f"{prefix}fusion.layer.{i}.{rest}"] = v
    return out


def _recover_word_embeddings(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors saves one name per tied group: ``mlm_head.decoder.weight`` (sorted first) may be
    the only copy of the word embeddings. Restore ``text.embeddings.word_embeddings.weight``."""
    out = dict(state)
    for prefix in ("", TWIN):
        if prefix + _WORD_EMB not in out and prefix + _MLM_DECODER in out:
            out[prefix + _WORD_EMB] = out[prefix + _MLM_DECODER]
    return out


def _dropped(key: str, prefixes: list[str]) -> bool:
    """Pretraining-only or absent-head key (``temp`` is the learned ITC temperature)."""
    return key == "temp" or any(key.startswith(p) for p in prefixes)
