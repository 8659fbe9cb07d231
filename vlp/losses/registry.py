"""Contrastive losses as registered objects: one class per loss, picked by ``loss.contrastive.name``.

A loss is a subclass of :class:`ContrastiveLoss` decorated with :func:`register_loss`: its name, its
hyperparameters (a dataclass, ``Params``), its forward on the two directions' similarity tensors and
its COCOS counter, plus capability flags (``uses_tau``, ``log_weights``, ``soft_targets``) that the
callers read instead of comparing names. :func:`build_loss` makes the loss of a
:class:`~vlp.config.ContrastiveConfig`; :func:`loss_names` lists the registered names.

Hyperparameters come from the config: a ``Params`` field named like a key of ``loss.contrastive``
(``margin``, ``smoothap_tau``) takes that key's value; every other field comes from
``loss.contrastive.params`` (``loss.contrastive.params.scale=2.0``), checked against the field's type.
The modules of :mod:`vlp.losses` are imported on the first look-up, so a loss class anywhere in that
package registers itself (the built-ins are in :mod:`vlp.losses.zoo`).
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import pkgutil
import types
import typing
from contextlib import contextmanager
from typing import Any, ClassVar, Iterator, Optional, TypeVar, Union

import torch

from vlp.config import ContrastiveConfig
from vlp.config.loss import install_loss_check
from vlp.errors import ConfigError

Tau = Union[float, torch.Tensor, None]
#: COCOS statistics (:mod:`vlp.losses.cocos`): ``counts`` [Q] and python-float statistics
Stats = dict[str, Union[float, torch.Tensor]]


@dataclasses.dataclass(frozen=True)
class NoParams:
    """The hyperparameters of a loss that has none."""


class ContrastiveLoss(abc.ABC):
    """A two-direction contrastive loss on similarity matrices (conventions of :mod:`vlp.losses.contrastive`).

    Subclasses set ``name`` (by :func:`register_loss`), ``Params`` (a dataclass of typed
    hyperparameters; ``self.params`` holds the config's values) and the flags, and implement
    :meth:`forward` and :meth:`cocos`; a loss with ``soft_targets`` implements :meth:`soft_forward`.
    """

    name: ClassVar[str] = ""
    Params: ClassVar[type[Any]] = NoParams
    #: takes the temperature ``tau`` (a fixed ``loss.contrastive.tau`` or the model's learned one)
    uses_tau: ClassVar[bool] = False
    #: takes per-negative log-weights (SRCL regulation, ``loss.regulation``)
    log_weights: ClassVar[bool] = False
    #: has :meth:`soft_forward`: soft targets, i.e. ALBEF's momentum distillation (``loss.distill``)
    soft_targets: ClassVar[bool] = False

    def __init__(self, params: Any = None) -> None:
        self.params = self.Params() if params is None else params

    def __call__(
        self,
        sim_i2t: torch.Tensor,
        pos_i2t: torch.Tensor,
        sim_t2i: torch.Tensor,
        pos_t2i: torch.Tensor,
        *,
        tau: Tau = None,
        log_weights_i2t: Optional[torch.Tensor] = None,
        log_weights_t2i: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """The loss of ``sim_i2t``/``pos_i2t`` [B_i, C_t] and ``sim_t2i``/``pos_t2i`` [B_t, C_i] (independent:
        no transpose is assumed), after checking that the loss takes what it is given. Returns a scalar."""
        if not self.log_weights and (log_weights_i2t is not None or log_weights_t2i is not None):
            raise ValueError(f"log_weights are only supported by losses that take them, not {self.name!r}")
        if self.uses_tau and tau is None:
            raise ValueError(f"{self.name} needs a temperature tau")
        return self.forward(
            sim_i2t,
            pos_i2t,
            sim_t2i,
            pos_t2i,
            tau=tau,
            log_weights_i2t=log_weights_i2t,
            log_weights_t2i=log_weights_t2i,
        )

    @abc.abstractmethod
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
        """The loss over both directions (shapes as in :meth:`__call__`). Returns a scalar."""

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
        """The loss against soft target distributions ``targets_*`` [Q, C] (rows summing to 1) of the
        temperature-scaled ``logits_*`` [Q, C] (only where ``soft_targets``). Returns a scalar."""
        raise NotImplementedError(f"{self.name} has no soft targets")

    @abc.abstractmethod
    def cocos(
        self, sim: torch.Tensor, positives: torch.Tensor, *, tau: float, threshold: float, inv_tau: bool
    ) -> Stats:
        """COCOS of one direction ``sim``/``positives`` [Q, C]: ``tau`` the temperature, ``threshold`` the
        weight above which a candidate counts, ``inv_tau`` count the gradient with its 1/tau factor.
        Returns the :data:`Stats` dict (``counts`` [Q], ``valid``, ``zeros``, ...)."""

    def hyperparameters(self) -> dict[str, Any]:
        """The loss's hyperparameters, ``{field: value}`` of ``self.params``."""
        return dataclasses.asdict(self.params)


_REGISTRY: dict[str, type[ContrastiveLoss]] = {}
_discovered = False
L = TypeVar("L", bound=type[ContrastiveLoss])


def register_loss(name: str) -> typing.Callable[[L], L]:
    """Class decorator: register the :class:`ContrastiveLoss` subclass under ``name`` (its
    ``loss.contrastive.name``) and return the class. A name registered twice raises ValueError."""

    def register(cls: L) -> L:
        _discover()  # the built-ins first, whoever registers first
        if name in _REGISTRY:
            raise ValueError(f"contrastive loss {name!r} is already registered ({_REGISTRY[name].__qualname__})")
        if not (dataclasses.is_dataclass(cls.Params) and isinstance(cls.Params, type)):
            raise TypeError(f"{cls.__qualname__}.Params must be a dataclass")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return register


def unregister_loss(name: str) -> None:
    """Remove the loss ``name`` from the registry (a test's own loss); returns nothing."""
    del _REGISTRY[name]


@contextmanager
def registered(cls: type[ContrastiveLoss], name: str) -> Iterator[type[ContrastiveLoss]]:
    """Context manager: ``cls`` registered under ``name`` inside the block, unregistered after. Yields the class."""
    register_loss(name)(cls)
    try:
        yield cls
    finally:
        unregister_loss(name)


def _discover() -> None:
    """Import every module of :mod:`vlp.losses` once (the built-ins first), so that their loss classes register."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    import vlp.losses

    importlib.import_module("vlp.losses.zoo")
    for info in pkgutil.iter_modules(vlp.losses.__path__):
        importlib.import_module(f"vlp.losses.{info.name}")


def loss_names() -> tuple[str, ...]:
    """The registered names, in registration order (the built-ins first)."""
    _discover()
    return tuple(_REGISTRY)


def loss_class(name: str) -> type[ContrastiveLoss]:
    """The class registered as ``name``; an unknown name raises one ConfigError naming
    ``loss.contrastive.name`` and the registered names."""
    _discover()
    if name not in _REGISTRY:
        raise ConfigError(
            f"config key 'loss.contrastive.name': unknown contrastive loss {name!r}, expected one of {list(_REGISTRY)}"
        )
    return _REGISTRY[name]


def build_loss(config: ContrastiveConfig) -> ContrastiveLoss:
    """The loss ``config.name`` with its hyperparameters from ``config`` (module docstring); an
    unknown name, an unknown ``params`` key or an ill-typed value raises ConfigError naming the key."""
    cls = loss_class(config.name)
    named = {f.name for f in dataclasses.fields(ContrastiveConfig)} - {"name", "params"}
    hints = typing.get_type_hints(cls.Params)
    values: dict[str, Any] = {}
    for key, value in config.params.items():
        where = f"loss.contrastive.params.{key}"
        if key in named:
            raise ConfigError(f"config key '{where}': {key} is a key of its own, set loss.contrastive.{key}")
        if key not in hints:
            own = sorted(set(hints) - named)
            raise ConfigError(
                f"config key '{where}': {config.name} has no such hyperparameter, "
                + (f"expected one of {own}" if own else "it takes no loss.contrastive.params")
            )
        values[key] = _typed(where, value, hints[key])
    for f in dataclasses.fields(cls.Params):
        if f.name in named:
            values[f.name] = getattr(config, f.name)
        elif f.name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(
                f"config key 'loss.contrastive.params.{f.name}' is not set: {config.name} needs it ({_type_name(hints[f.name])})"
            )
    return cls(cls.Params(**values))


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _typed(key: str, value: Any, tp: Any) -> Any:
    """``value`` of config key ``key`` as type ``tp`` (a class, ``Any``, a generic such as ``list[float]``
    checked as its origin, or an Optional of one; an int is a valid float); raises ConfigError naming
    the key and the type expected."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (Union, types.UnionType) and type(None) in args:
        if value is None:
            return None
        tp = next(a for a in args if a is not type(None))
    if tp is Any:
        return value
    cls = typing.get_origin(tp) or tp
    if cls is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, cls) or (cls is not bool and isinstance(value, bool)):
        raise ConfigError(f"config key '{key}': got {value!r}, expected {_type_name(tp)}")
    return value


install_loss_check(build_loss)
