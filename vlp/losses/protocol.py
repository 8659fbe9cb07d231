"""What a contrastive loss is: the protocol every loss of ``loss.contrastive.name`` implements.

A loss is a subclass of :class:`ContrastiveLoss` registered in :data:`vlp.losses.registry.LOSSES`. It
has typed hyperparameters (``Params``, a dataclass, filled from ``loss.contrastive.params``), capability
flags the callers read instead of comparing names, and two methods, each taking one object:
:meth:`ContrastiveLoss.forward` a :class:`ContrastiveInputs` (both directions' similarities and what
SRCL and momentum distillation add) and :meth:`ContrastiveLoss.cocos` a :class:`CocosInputs` (one
direction, for COCOS: :mod:`vlp.losses.cocos` has the counting helpers). docs/methods.md, "Adding a
loss", writes one.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar, NamedTuple, Optional, Union

import torch

Tau = Union[float, torch.Tensor, None]
#: COCOS statistics (:mod:`vlp.losses.cocos`): ``counts`` [Q] and python-float statistics
Stats = dict[str, Union[float, torch.Tensor]]


class Direction(NamedTuple):
    """One retrieval direction of :class:`ContrastiveInputs`: ``sim``, ``pos`` [Q, C] and the optional
    ``log_weights``, ``targets`` [Q, C] (None where not given)."""

    sim: torch.Tensor
    pos: torch.Tensor
    log_weights: Optional[torch.Tensor]
    targets: Optional[torch.Tensor]


@dataclasses.dataclass(frozen=True)
class ContrastiveInputs:
    """Both directions of a contrastive loss (the conventions of :mod:`vlp.losses.contrastive`).

    ``sim_i2t``/``pos_i2t`` [B_i, C_t]: each image query's (cosine) similarity to every text candidate
    and which candidates are its positives (bool); ``sim_t2i``/``pos_t2i`` [B_t, C_i] the same for text
    queries. The directions are independent (a momentum bank gives two different matrices); a dual
    encoder passes ``sim.T``, ``pos.T`` (:meth:`dual`). ``tau``: the temperature (a float, or the
    model's learned 0-d tensor; None: none given). SRCL: ``log_weights_*`` (shape of ``sim_*``) are
    added to the negatives' logits; with ``removal`` a log-weight of ``-inf`` removes a candidate.
    Momentum distillation: ``targets_*`` (shape of ``sim_*``, rows summing to 1) are soft targets;
    when they are set the loss is taken against them (``soft``).
    """

    sim_i2t: torch.Tensor
    pos_i2t: torch.Tensor
    sim_t2i: torch.Tensor
    pos_t2i: torch.Tensor
    tau: Tau = None
    log_weights_i2t: Optional[torch.Tensor] = None
    log_weights_t2i: Optional[torch.Tensor] = None
    targets_i2t: Optional[torch.Tensor] = None
    targets_t2i: Optional[torch.Tensor] = None
    removal: bool = False

    @classmethod
    def dual(cls, sim: torch.Tensor, pos: torch.Tensor, **extra: Any) -> ContrastiveInputs:
        """The inputs of a dual encoder's ``sim``/``pos`` [B_i, B_t]: i2t ``sim``, t2i ``sim.T``."""
        return cls(sim, pos, sim.T, pos.T, **extra)

    @property
    def soft(self) -> bool:
        """Soft targets are given (momentum distillation)."""
        return self.targets_i2t is not None or self.targets_t2i is not None

    @property
    def weighted(self) -> bool:
        """Log-weights are given (SRCL)."""
        return self.log_weights_i2t is not None or self.log_weights_t2i is not None

    def directions(self) -> tuple[Direction, Direction]:
        """The two directions, i2t then t2i."""
        return (
            Direction(self.sim_i2t, self.pos_i2t, self.log_weights_i2t, self.targets_i2t),
            Direction(self.sim_t2i, self.pos_t2i, self.log_weights_t2i, self.targets_t2i),
        )


@dataclasses.dataclass(frozen=True)
class CocosInputs:
    """One direction's COCOS question: ``sim``/``positives`` [Q, C] (as in :class:`ContrastiveInputs`);
    ``tau`` the temperature; a candidate counts where its gradient weight is above ``threshold``;
    ``inv_tau``: that weight with its 1/tau factor (SmoothAP, :func:`vlp.losses.cocos.cocos_smoothap`)."""

    sim: torch.Tensor
    positives: torch.Tensor
    tau: float = 0.05
    threshold: float = 0.01
    inv_tau: bool = False


@dataclasses.dataclass(frozen=True)
class NoParams:
    """The hyperparameters of a loss that has none."""


class ContrastiveLoss(abc.ABC):
    """A two-direction contrastive loss. Subclasses set ``Params`` (a dataclass of typed
    hyperparameters: ``self.params`` holds the config's values) and the flags, and implement
    :meth:`forward` and :meth:`cocos`. ``name``: the name it was built under (messages)."""

    Params: ClassVar[type[Any]] = NoParams
    #: takes the temperature ``tau`` (a fixed ``loss.contrastive.tau`` or the model's learned one)
    uses_tau: ClassVar[bool] = False
    #: takes per-negative log-weights (SRCL regulation, ``loss.regulation``)
    log_weights: ClassVar[bool] = False
    #: takes soft targets (``ContrastiveInputs.targets_*``): ALBEF's momentum distillation (``loss.distill``)
    soft_targets: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not (dataclasses.is_dataclass(cls.Params) and isinstance(cls.Params, type)):
            raise TypeError(f"{cls.__qualname__}.Params must be a dataclass")

    def __init__(self, params: Any = None, name: str = "") -> None:
        self.params = self.Params() if params is None else params
        self.name = name or type(self).__name__

    def __call__(self, x: ContrastiveInputs) -> torch.Tensor:
        """:meth:`forward` of ``x`` after checking that the loss takes what ``x`` gives. Returns a scalar."""
        for given, flag, what in (
            (x.weighted, self.log_weights, "log_weights"),
            (x.soft, self.soft_targets, "targets"),
        ):
            if given and not flag:
                raise ValueError(f"{what} are only supported by losses that take them, not {self.name!r}")
        if self.uses_tau and x.tau is None:
            raise ValueError(f"{self.name} needs a temperature tau")
        return self.forward(x)

    @abc.abstractmethod
    def forward(self, x: ContrastiveInputs) -> torch.Tensor:
        """The loss over both directions of ``x``. Returns a scalar."""

    @abc.abstractmethod
    def cocos(self, x: CocosInputs) -> Stats:
        """COCOS of one direction: the :data:`Stats` dict (``counts`` [Q], ``valid``, ``zeros``, ...;
        :func:`vlp.losses.cocos.count_stats` makes it from the per-query counts)."""

    def hyperparameters(self) -> dict[str, Any]:
        """The loss's hyperparameters, ``{field: value}`` of ``self.params``."""
        return dataclasses.asdict(self.params)
