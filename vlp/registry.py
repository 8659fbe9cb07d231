"""One registry type for everything vlp looks up by name: kinds, their model builders, fine-tuning
runners and evaluators, contrastive losses and presets.

Each entry registers itself where it is defined, with the object itself (never a
``"module:attribute"`` string), so a registry module imports none of its entries and no layer
reaches up. The verbs are the same for every registry::

    LOSSES = Registry("contrastive loss", key="loss.contrastive.name")

    @LOSSES.register("hinge")          # a decorator on a class or function (returns it unchanged)
    class Hinge: ...

    LOSSES.register("hinge", Hinge)    # or a call with the entry
    LOSSES.get("hinge")                # the entry; an unknown name is one UnknownName
    LOSSES.names()                     # ('infonce', ..., 'hinge'), in registration order
    "hinge" in LOSSES                  # membership
    LOSSES.unregister("hinge")         # a test's or a plugin's own entry, after use

Outside code registers the same way, from its own package (``docs/architecture.md``, "Plugins").
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Generic, Iterator, Optional, TypeVar, overload

from vlp.errors import ConfigError

T = TypeVar("T")
E = TypeVar("E")


class UnknownName(ConfigError, KeyError):
    """A name no entry of a registry has; the message names the config key (where there is one),
    the name and the registered names. A :class:`~vlp.errors.ConfigError` (a user's mistake) and a
    ``KeyError`` (a failed look-up)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    """Entries of type ``T`` by name, in registration order.

    ``what``: the entries' noun in messages ("kind", "contrastive loss"); ``key``: the config key
    whose value is looked up, named in the error ("" : none)."""

    def __init__(self, what: str, key: str = "") -> None:
        self.what = what
        self.key = key
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str, entry: None = None, *, replace: bool = False) -> Callable[[E], E]: ...

    @overload
    def register(self, name: str, entry: T, *, replace: bool = False) -> T: ...

    def register(self, name: str, entry: Optional[T] = None, *, replace: bool = False) -> object:
        """Register ``entry`` under ``name`` and return it; without ``entry``, a decorator that
        registers what it decorates and returns it unchanged. A name registered already raises
        ``ValueError`` unless ``replace``."""
        if entry is None:

            def decorate(obj: E) -> E:
                self.register(name, obj, replace=replace)  # type: ignore[arg-type]
                return obj

            return decorate
        if not name:
            raise ValueError(f"a {self.what} needs a name")
        if name in self._entries and not replace:
            raise ValueError(
                f"{self.what} {name!r} is registered already ({self._entries[name]!r}); replace=True replaces it"
            )
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> T:
        """Remove the entry ``name`` and return it (:class:`UnknownName` if there is none)."""
        entry = self.get(name)
        del self._entries[name]
        return entry

    @contextmanager
    def registered(self, name: str, entry: T) -> Iterator[T]:
        """``entry`` registered as ``name`` inside the block and removed after (a test's own entry). Yields it."""
        self.register(name, entry)
        try:
            yield entry
        finally:
            self._entries.pop(name, None)

    def get(self, name: str) -> T:
        """The entry ``name``; an unknown name raises :class:`UnknownName` naming the registered ones."""
        try:
            return self._entries[name]
        except KeyError:
            where = f"config key {self.key!r}: " if self.key else ""
            raise UnknownName(f"{where}unknown {self.what} {name!r}; known: {list(self._entries)}") from None

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def items(self) -> tuple[tuple[str, T], ...]:
        """``(name, entry)`` pairs, in registration order."""
        return tuple(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self._entries)})"
