"""A cosine-hinge contrastive loss, written as an outside researcher would (docs/methods.md, "Adding a
loss"): public vlp names only. For each query q, positive p and negative n of a direction, the hinge
max(0, margin - s_qp + s_qn) on the cosine similarities, averaged over the (q, p, n) triples of the
direction; the loss is the mean of the two directions. COCOS: the violating pairs per query."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlp.losses import CocosInputs, ContrastiveInputs, ContrastiveLoss, Stats, count_stats


@dataclass(frozen=True)
class HingeParams:
    margin: float = 0.2  # loss.contrastive.params.margin


def hinges(sim: torch.Tensor, pos: torch.Tensor, margin: float) -> torch.Tensor:
    """``[margin - s_qp + s_qn]_+`` as [Q, C (p), C (n)], 0 unless p is a positive and n a negative of q."""
    sim = sim.float()
    h = (margin - sim[:, :, None] + sim[:, None, :]).clamp_min(0.0)
    return h * (pos[:, :, None] & ~pos[:, None, :])


class CosineHinge(ContrastiveLoss):
    """The mean hinge over a direction's triples, averaged over both directions."""

    Params = HingeParams

    def forward(self, x: ContrastiveInputs) -> torch.Tensor:
        """The loss of both directions of ``x`` (a scalar)."""
        i2t, t2i = x.directions()
        return 0.5 * (self.mean_hinge(i2t.sim, i2t.pos) + self.mean_hinge(t2i.sim, t2i.pos))

    def mean_hinge(self, sim: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One direction's hinge (``sim``, ``pos`` [Q, C]) averaged over its (q, p, n) triples."""
        triples = (pos.sum(1) * (~pos).sum(1)).sum().clamp_min(1)
        return hinges(sim, pos, self.params.margin).sum() / triples

    def cocos(self, x: CocosInputs) -> Stats:
        """Violating (positive, negative) pairs per query."""
        return count_stats((hinges(x.sim, x.positives, self.params.margin) > 0).sum((1, 2)), x.positives.any(1))
