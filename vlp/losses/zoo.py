"""The built-in contrastive losses (docs/methods.md, loss zoo) as registered classes over the tensor
functions of :mod:`vlp.losses.contrastive` and the counters of :mod:`vlp.losses.cocos`.

InfoNCE and SmoothAP average the two directions, Triplet and Triplet-SH sum them (the references').
Their hyperparameters are ``loss.contrastive.params`` keys (``params.margin``, ``params.tau``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlp.errors import ConfigError
from vlp.losses.cocos import cocos_infonce, cocos_smoothap, cocos_triplet
from vlp.losses.contrastive import infonce, smooth_ap, soft_infonce, triplet, triplet_sh
from vlp.losses.protocol import CocosInputs, ContrastiveInputs, ContrastiveLoss, Stats
from vlp.losses.registry import LOSSES


@LOSSES.register("infonce")
class InfoNCE(ContrastiveLoss):
    """Multi-positive InfoNCE (:func:`~vlp.losses.contrastive.infonce`) at temperature ``tau``, the mean
    of both directions; ALBEF's ITC with soft targets (momentum distillation: the soft cross-entropy of
    ``sim / tau``, :func:`~vlp.losses.contrastive.soft_infonce`) and SRCL log-weights."""

    uses_tau = True
    log_weights = True
    soft_targets = True

    def forward(self, x: ContrastiveInputs) -> torch.Tensor:
        """Mean of the two directions' (soft) InfoNCE. Returns a scalar."""
        assert x.tau is not None  # checked by __call__
        a, b = [
            soft_infonce(d.sim / x.tau, d.targets, d.log_weights, x.removal)
            if d.targets is not None
            else infonce(d.sim, d.pos, x.tau, d.log_weights)
            for d in x.directions()
        ]
        return 0.5 * (a + b)

    def cocos(self, x: CocosInputs) -> Stats:
        """Softmax weights above ``threshold`` (:func:`~vlp.losses.cocos.cocos_infonce`; ``inv_tau`` unused)."""
        return cocos_infonce(x.sim, x.positives, x.tau, x.threshold)


@dataclass(frozen=True)
class TripletParams:
    margin: float = 0.2  # loss.contrastive.params.margin


@LOSSES.register("triplet")
class Triplet(ContrastiveLoss):
    """Triplet loss over all negatives, summed over both directions (:func:`~vlp.losses.contrastive.triplet`)."""

    Params = TripletParams
    hardest = False

    def forward(self, x: ContrastiveInputs) -> torch.Tensor:
        """Sum of the two directions' losses at ``params.margin``. Returns a scalar."""
        fn = triplet_sh if self.hardest else triplet
        a, b = [fn(d.sim, d.pos, self.params.margin) for d in x.directions()]
        return a + b

    def cocos(self, x: CocosInputs) -> Stats:
        """Violating triplets per query (:func:`~vlp.losses.cocos.cocos_triplet`; ``tau``, ``threshold``,
        ``inv_tau`` unused)."""
        return cocos_triplet(x.sim, x.positives, self.params.margin, hardest=self.hardest)


@LOSSES.register("triplet_sh")
class TripletSH(Triplet):
    """VSE++ max-violation triplet (:func:`~vlp.losses.contrastive.triplet_sh`), summed over both directions."""

    hardest = True


@dataclass(frozen=True)
class SmoothAPParams:
    tau: float = 0.01  # loss.contrastive.params.tau: the sigmoid temperature (not loss.contrastive.tau)

    def __post_init__(self) -> None:
        if self.tau <= 0:
            raise ConfigError(f"config key 'loss.contrastive.params.tau': got {self.tau}, expected > 0")


@LOSSES.register("smoothap")
class SmoothAP(ContrastiveLoss):
    """SmoothAP (:func:`~vlp.losses.contrastive.smooth_ap`) at its own sigmoid temperature
    ``params.tau``, the mean of both directions."""

    Params = SmoothAPParams

    def forward(self, x: ContrastiveInputs) -> torch.Tensor:
        """Mean of the two directions' SmoothAP. Returns a scalar."""
        a, b = [smooth_ap(d.sim, d.pos, self.params.tau) for d in x.directions()]
        return 0.5 * (a + b)

    def cocos(self, x: CocosInputs) -> Stats:
        """Sigmoid-derivative pairs above ``threshold`` (:func:`~vlp.losses.cocos.cocos_smoothap` at
        ``params.tau``; with ``inv_tau`` the true gradient magnitude, 1/tau included; ``x.tau`` unused)."""
        return cocos_smoothap(x.sim, x.positives, self.params.tau, x.threshold, inv_tau=x.inv_tau)
