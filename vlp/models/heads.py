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


class LTDDecoder(nn.Module):
    """LTD head: Linear(d_in, H) -> ReLU -> Linear(H, H) -> ReLU -> Linear(H, d_target), Xavier-uniform
    weights, default biases, no output activation. Input: the L2-normalised caption embedding [B, d_in]."""

    def __init__(self, d_in: int, d_target: int, hidden: int = 1024) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, d_target)
        )
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        return self.net(emb)


class ITDDecoder(nn.Module):
    """ITD baseline: a GRU that reconstructs the caption's tokens from its embedding.

    Its own word embeddings (not tied to the encoder), a GRU whose initial hidden state is the
    caption embedding (so its width is the embedding's), teacher forcing, and a vocabulary
    projection: ``forward(emb [B, E], input_ids [B, T]) -> logits [B, T-1, V]`` predicting tokens 1..T-1.
    """

    def __init__(self, embed_dim: int, vocab_size: int, word_dim: int = 300) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, word_dim)
        self.gru = nn.GRU(word_dim, embed_dim, batch_first=True)
        self.out = nn.Linear(embed_dim, vocab_size)

    def forward(self, emb: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(self.embed(input_ids[:, :-1]), emb.to(self.out.weight.dtype)[None].contiguous())
        return self.out(h)
