"""The built-in contrastive losses (docs/methods.md, loss zoo) as registered classes over the tensor
functions of :mod:`vlp.losses.contrastive` and the counters of :mod:`vlp.losses.cocos`.

InfoNCE and SmoothAP average the two directions, Triplet and Triplet-SH sum them (the references').
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from vlp.losses.cocos import cocos_infonce, cocos_smoothap, cocos_triplet
from vlp.losses.contrastive import infonce, smooth_ap, soft_infonce, triplet, triplet_sh
from vlp.losses.registry import ContrastiveLoss, Stats, Tau, register_loss


@register_loss("infonce")
class InfoNCE(ContrastiveLoss):
    """Multi-positive InfoNCE (:func:`~vlp.losses.contrastive.infonce`); ALBEF's ITC with soft targets
    (momentum distillation, :func:`~vlp.losses.contrastive.soft_infonce`) and SRCL log-weights."""

    uses_tau = True
    log_weights = True
    soft_targets = True

    def forward(
        self,
        sim_i2t: torch.Tensor,
        pos_i2t: torch.Tensor,
        sim_t2i: torch.Tensor,
        pos_t2i: torch.Tensor,
        *,
        tau: Tau,
        log_weights_i2t: Optional[torch.Tensor],
        log_weights_t2i: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """Mean of the two directions' InfoNCE at temperature ``tau``. Returns a scalar."""
        assert tau is not None  # checked by __call__
        return 0.5 * (infonce(sim_i2t, pos_i2t, tau, log_weights_i2t) + infonce(sim_t2i, pos_t2i, tau, log_weights_t2i))

    def soft_forward(
        self,
        logits_i2t: torch.Tensor,
        targets_i2t: torch.Tensor,
        logits_t2i: torch.Tensor,
        targets_t2i: torch.Tensor,
        log_weights_i2t: Optional[torch.Tensor] = None,
        log_weights_t2i: Optional[torch.Tensor] = None,
        removal: bool = False,
    ) -> torch.Tensor:
        """Mean of the two directions' soft cross-entropy (log-weights of ``-inf`` remove candidates
        under ``removal``). Returns a scalar."""
        return 0.5 * (
            soft_infonce(logits_i2t, targets_i2t, log_weights_i2t, removal)
            + soft_infonce(logits_t2i, targets_t2i, log_weights_t2i, removal)
        )

    def cocos(
        self, sim: torch.Tensor, positives: torch.Tensor, *, tau: float, threshold: float, inv_tau: bool
    ) -> Stats:
        """Softmax weights above ``threshold`` (:func:`~vlp.losses.cocos.cocos_infonce`; ``inv_tau`` unused)."""
        return cocos_infonce(sim, positives, tau, threshold)


@dataclass(frozen=True)
class TripletParams:
    margin: float = 0.2  # loss.contrastive.margin


@register_loss("triplet")
class Triplet(ContrastiveLoss):
    """Triplet loss over all negatives, summed over both directions (:func:`~vlp.losses.contrastive.triplet`)."""

    Params = TripletParams
    hardest = False

    def forward(
        self,
        sim_i2t: torch.Tensor,
        pos_i2t: torch.Tensor,
        sim_t2i: torch.Tensor,
        pos_t2i: torch.Tensor,
        *,
        tau: Tau,
        log_weights_i2t: Optional[torch.Tensor],
        log_weights_t2i: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """Sum of the two directions' losses at ``params.margin``. Returns a scalar."""
        fn = triplet_sh if self.hardest else triplet
        return fn(sim_i2t, pos_i2t, self.params.margin) + fn(sim_t2i, pos_t2i, self.params.margin)

    def cocos(
        self, sim: torch.Tensor, positives: torch.Tensor, *, tau: float, threshold: float, inv_tau: bool
    ) -> Stats:
        """Violating triplets per query (:func:`~vlp.losses.cocos.cocos_triplet`; ``tau``, ``threshold``,
        ``inv_tau`` unused)."""
        return cocos_triplet(sim, positives, self.params.margin, hardest=self.hardest)


@register_loss("triplet_sh")
class TripletSH(Triplet):
    """VSE++ max-violation triplet (:func:`~vlp.losses.contrastive.triplet_sh`), summed over both directions."""

    hardest = True


@dataclass(frozen=True)
class SmoothAPParams:
    smoothap_tau: float = 0.01  # loss.contrastive.smoothap_tau: the sigmoid temperature


@register_loss("smoothap")
class SmoothAP(ContrastiveLoss):
    """SmoothAP (:func:`~vlp.losses.contrastive.smooth_ap`), the mean of both directions."""

    Params = SmoothAPParams

    def forward(
        self,
        sim_i2t: torch.Tensor,
        pos_i2t: torch.Tensor,
        sim_t2i: torch.Tensor,
        pos_t2i: torch.Tensor,
        *,
        tau: Tau,
        log_weights_i2t: Optional[torch.Tensor],
        log_weights_t2i: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """Mean of the two directions' SmoothAP at ``params.smoothap_tau``. Returns a scalar."""
        t = self.params.smoothap_tau
        return 0.5 * (smooth_ap(sim_i2t, pos_i2t, t) + smooth_ap(sim_t2i, pos_t2i, t))

    def cocos(
        self, sim: torch.Tensor, positives: torch.Tensor, *, tau: float, threshold: float, inv_tau: bool
    ) -> Stats:
        """Sigmoid-derivative pairs above ``threshold`` (:func:`~vlp.losses.cocos.cocos_smoothap`; with
        ``inv_tau`` the true gradient magnitude, 1/smoothap_tau included; ``tau`` unused)."""
        return cocos_smoothap(sim, positives, self.params.smoothap_tau, threshold, inv_tau=inv_tau)
