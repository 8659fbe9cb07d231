"""Which :class:`~vlp.api.VLPModel` methods a checkpoint runs: its kind's registry entry's
``capabilities`` (:data:`vlp.kinds.KINDS`), checked by each inference function before it runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from vlp.config.model import ARCH_DUAL
from vlp.errors import CheckpointError
from vlp.kinds import KINDS, checkpoint_kinds

if TYPE_CHECKING:
    from vlp.api import VLPModel


class UnsupportedKind(ValueError):
    """A method the loaded checkpoint kind cannot run (e.g. ``answer`` on a pretraining checkpoint)."""


def checked_kind(kind: str) -> str:
    """``kind`` if a checkpoint can be of that kind; else :class:`~vlp.errors.CheckpointError`
    naming the checkpoint kinds."""
    if kind not in checkpoint_kinds():
        raise CheckpointError(f"unknown checkpoint kind {kind!r}; expected one of {list(checkpoint_kinds())}")
    return kind


def require(vm: VLPModel, method: str, what: str, fusion: bool = False, name: Optional[str] = None) -> None:
    """Raise :class:`UnsupportedKind` unless the kind of ``vm``'s checkpoint offers VLPModel method
    ``method`` (``KINDS.get(vm.kind).capabilities``; ``fusion``: and the model has a fusion
    encoder). The message names the function (``name``, default ``VLPModel.<method>``), ``what``
    it needs and the kinds that have it."""
    dual = vm.model_config.arch == ARCH_DUAL
    if method in KINDS.get(vm.kind).capabilities and not (fusion and dual):
        return
    kinds = [n for n, entry in KINDS.items() if method in entry.capabilities]
    arch = " with model.arch=dual (no fusion encoder)" if dual else ""
    raise UnsupportedKind(
        f"{name or 'VLPModel.' + method} needs {what} ({' or '.join(kinds)} checkpoint"
        f"{', model.arch=albef' if fusion else ''}); this is a {vm.kind} checkpoint{arch}"
    )
