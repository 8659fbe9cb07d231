"""LTD / ITD on a task's text embedding: the decoder head, the reconstruction loss and lambda.

:class:`Reconstruction` is shared by every task with a text tower (ALBEF pretraining, the dual
encoder, retrieval fine-tuning). It adds its term to the task's contrastive objective and steps
the Lagrange multiplier after the model's optimizer step.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from vlp.config import LTDConfig
from vlp.losses.ltd import LagrangeMultiplier, constrained, cosine_reconstruction, token_nll, weighted
from vlp.models.heads import ITDDecoder, LTDDecoder


class Reconstruction(nn.Module):
    """``loss.ltd`` on the normalised caption embedding.

    ``decoder=latent`` (LTD): an MLP to the caption's sentence-encoder target (``batch["ltd_target"]``
    [B, target_dim]), ``L_rec = mean(1 - cos)``. ``decoder=tokens`` (ITD): a GRU that re-generates
    ``batch["input_ids"]``, ``L_rec`` = token NLL summed per caption. ``mode=constraint`` adds
    ``lambda (L_rec / eta - 1)``, ``dual`` adds ``beta L_rec``. The head is trained by the model's
    optimizer and is not used at evaluation.
    """

    def __init__(self, cfg: LTDConfig, embed_dim: int, target_dim: Optional[int], vocab_size: int) -> None:
        super().__init__()
        if cfg.mode == "off":
            raise ValueError("loss.ltd.mode=off: no Reconstruction needed")
        self.cfg = cfg
        if cfg.decoder == "latent":
            if target_dim is None:
                raise ValueError("LTD needs the targets' dimension")
            self.decoder: nn.Module = LTDDecoder(embed_dim, target_dim, cfg.hidden)
        else:
            self.decoder = ITDDecoder(embed_dim, vocab_size, cfg.itd_word_dim)
        self.multiplier = LagrangeMultiplier(cfg.multiplier) if cfg.mode == "constraint" else None

    def rec_loss(self, text_emb: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``text_emb`` [B, E] normalised caption embeddings -> scalar L_rec."""
        if self.cfg.decoder == "latent":
            return cosine_reconstruction(self.decoder(text_emb), batch["ltd_target"])
        ids, mask = batch["input_ids"], batch["attention_mask"]
        return token_nll(self.decoder(text_emb, ids), ids[:, 1:], mask[:, 1:], self.cfg.itd_time_axis_bug)

    def forward(
        self, l_con: torch.Tensor, text_emb: torch.Tensor, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The objective with reconstruction, and its statistics (``ltd_rec``, ``ltd_lambda``, ``ltd_violation``)."""
        l_rec = self.rec_loss(text_emb, batch)
        stats = {"ltd_rec": l_rec.detach()}
        if self.multiplier is None:
            return weighted(l_con, l_rec, self.cfg.beta), stats
        lam = self.multiplier.value()
        stats["ltd_lambda"] = lam.detach()
        stats["ltd_violation"] = l_rec.detach() / self.cfg.eta - 1.0
        return constrained(l_con, l_rec, lam, self.cfg.eta), stats

    def after_optimizer_step(self, skipped: Optional[torch.Tensor] = None) -> None:
        if self.multiplier is not None:
            self.multiplier.step(skipped)
