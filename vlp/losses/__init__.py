"""Losses as functions of tensors (never models): the contrastive losses of ``loss.contrastive.name``,
ITM, MLM, SRCL's regulation, LTD/ITD reconstruction, the fine-tuning heads' losses.

What a new contrastive loss needs is here (docs/methods.md, "Adding a loss"): the protocol
(:class:`ContrastiveLoss`, :class:`ContrastiveInputs`, :class:`CocosInputs`, :data:`Stats`), the
registry (:data:`LOSSES`, :func:`build_loss`) and the COCOS counting helper (:func:`count_stats`).
Importing the package imports the built-in losses (:mod:`vlp.losses.zoo`), so they are registered.
"""

from vlp.losses import zoo
from vlp.losses.cocos import count_stats
from vlp.losses.protocol import CocosInputs, ContrastiveInputs, ContrastiveLoss, Direction, NoParams, Stats
from vlp.losses.registry import LOSSES, build_loss

__all__ = [
    "LOSSES",
    "CocosInputs",
    "ContrastiveInputs",
    "ContrastiveLoss",
    "Direction",
    "NoParams",
    "Stats",
    "build_loss",
    "count_stats",
    "zoo",
]
