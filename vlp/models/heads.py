"""Task heads on top of the fused text states."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLMHead(nn.Module):
    """BERT's ``cls.predictions``: dense -> GELU -> LayerNorm -> decoder (tied to word embeddings) + bias.

    Applied only to the hidden states of masked positions ([M, H] -> [M, V]).
    """

    def __init__(self, hidden: int, vocab_size: int, eps: float = 1e-12) -> None:
        super().__init__()
        self.transform = nn.Module()
        self.transform.dense = nn.Linear(hidden, hidden)
        self.transform.LayerNorm = nn.LayerNorm(hidden, eps=eps)
        self.decoder = nn.Linear(hidden, vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def tie(self, word_embeddings: nn.Embedding) -> None:
        self.decoder.weight = word_embeddings.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self.transform.LayerNorm(F.gelu(self.transform.dense(h)))
        return self.decoder(h) + self.bias
