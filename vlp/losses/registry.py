"""The contrastive losses by name: :data:`LOSSES`, looked up by ``loss.contrastive.name``.

A loss (:class:`~vlp.losses.protocol.ContrastiveLoss`) registers itself where it is defined, with
``@LOSSES.register("name")``; the built-ins are :mod:`vlp.losses.zoo`, imported by the package
:mod:`vlp.losses`, so any import of a loss module registers them. :func:`build_loss` makes the loss of
a :class:`~vlp.config.ContrastiveConfig`: its hyperparameters (``Params``) come from
``loss.contrastive.params`` (``loss.contrastive.params.margin=0.3``), checked against the fields' types.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

from vlp.config import ContrastiveConfig
from vlp.config.loss import install_loss_check
from vlp.errors import ConfigError
from vlp.losses.protocol import ContrastiveLoss
from vlp.registry import Registry

LOSSES: Registry[type[ContrastiveLoss]] = Registry("contrastive loss", key="loss.contrastive.name")


def build_loss(config: ContrastiveConfig) -> ContrastiveLoss:
    """The loss ``config.name`` with its hyperparameters from ``config.params``; an unknown name, an
    unknown ``params`` key, an ill-typed value or a missing required one raises ConfigError naming the key."""
    cls = LOSSES.get(config.name)
    hints = typing.get_type_hints(cls.Params)
    values: dict[str, Any] = {}
    for key, value in config.params.items():
        where = f"loss.contrastive.params.{key}"
        if key not in hints:
            raise ConfigError(
                f"config key '{where}': {config.name} has no such hyperparameter, "
                + (f"expected one of {sorted(hints)}" if hints else "it takes no loss.contrastive.params")
            )
        values[key] = _typed(where, value, hints[key])
    for f in dataclasses.fields(cls.Params):
        if f.name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(
                f"config key 'loss.contrastive.params.{f.name}' is not set: {config.name} needs it ({_type_name(hints[f.name])})"
            )
    return cls(cls.Params(**values), name=config.name)


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
