"""Resource-constrained dual encoder: timm image tower + GRU text tower, contrastive loss only.

In the spirit of the LTD paper's ResNet-50 + bi-GRU: each tower ends in a bias-free 2-layer
projection head (feature -> ``proj_hidden`` -> ``embed_dim``), optionally a BatchNorm1d
(``model.dual.batchnorm``), and an L2 norm. It exposes the same
``encode_image`` / ``encode_text`` as :class:`~vlp.models.albef.ALBEF`, so the retrieval engine
(``eval.score=itc``) and the analysis tools serve both.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from vlp.config import ModelConfig
from vlp.models.albef import ImageFeatures, TextFeatures
from vlp.models.vision import create_timm


def projection(d_in: int, hidden: int, d_out: int, batchnorm: bool = False) -> nn.Sequential:
    """Linear -> ReLU -> Linear without biases (the reference's projection heads), then with
    ``batchnorm`` a BatchNorm1d(d_out) (the reference's triplet runs: before the final L2 norm)."""
    layers = [nn.Linear(d_in, hidden, bias=False), nn.ReLU(), nn.Linear(hidden, d_out, bias=False)]
    return nn.Sequential(*layers, *([nn.BatchNorm1d(d_out)] if batchnorm else []))


class GRUText(nn.Module):
    """Word embeddings + (bi-)GRU over the real tokens. ``forward(ids [B, T], mask [B, T])`` ->
    (states [B, T, D], pooled [B, D]) with D = hidden x directions; pooled = the last forward
    state concatenated with the first backward state."""

    def __init__(self, vocab_size: int, word_dim: int, hidden: int, layers: int, bidirectional: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, word_dim)
        self.gru = nn.GRU(word_dim, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.width = hidden * (2 if bidirectional else 1)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = mask.sum(1).clamp_min(1).cpu()
        packed = pack_padded_sequence(self.embed(ids), lengths, batch_first=True, enforce_sorted=False)
        out, h = self.gru(packed)
        states, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        dirs = 2 if self.gru.bidirectional else 1
        pooled = h.view(self.gru.num_layers, dirs, ids.shape[0], -1)[-1]  # last layer [dirs, B, H]
        return states, pooled.transpose(0, 1).reshape(ids.shape[0], -1)


class DualEncoder(nn.Module):
    """Image tower (any timm model, pooled features) + GRU text tower, projected and normalised."""

    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.dual
        self.vision = create_timm(d.image, d.image_pretrained, num_classes=0, **d.image_kwargs)
        self.vision_proj = projection(self.vision.num_features, d.proj_hidden, cfg.embed_dim, d.batchnorm)
        self.text = GRUText(vocab_size, d.word_dim, d.gru_hidden, d.gru_layers, d.bidirectional)
        self.text_proj = projection(self.text.width, d.proj_hidden, cfg.embed_dim, d.batchnorm)

    def encode_image(self, images: torch.Tensor) -> ImageFeatures:
        """``images`` [B, 3, H, W] -> pooled features (as ``tokens`` [B, 1, F]) and normalised [B, E]."""
        pooled = self.vision(images)
        proj = self.vision_proj(pooled).float()
        return ImageFeatures(pooled[:, None], F.normalize(proj, dim=-1), proj)

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TextFeatures:
        states, pooled = self.text(input_ids, attention_mask)
        proj = self.text_proj(pooled).float()
        return TextFeatures(states, attention_mask, F.normalize(proj, dim=-1), proj)

    def after_optimizer_step(self, step: int | torch.Tensor, skipped: Optional[torch.Tensor] = None) -> None:
        """Nothing to do (no momentum twin); the task interface calls it."""
