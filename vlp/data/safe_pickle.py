"""Reading pickled annotation files (the RefCOCO family's ``refs(unc).p``) without running code.

``pickle.load`` calls whatever callable a file names: a pickle can run ``os.system`` as it loads.
:func:`restricted_load` reads a pickle with an unpickler that only builds plain data -- dicts,
lists, tuples, strings, bytes, numbers, booleans and None, which the pickle opcodes build by
themselves -- and admits exactly two globals (:data:`ALLOWED_GLOBALS`):

- ``set`` and ``frozenset``: a set has no opcode before protocol 4, so protocols 0-3 (and every
  Python 2 pickle) write it as a call of the builtin ``set`` / ``frozenset`` on a list. Calling
  them builds a container from values that are themselves plain data (nothing else can be
  constructed), runs no user code and touches nothing outside the process.

Every other global (``os.system``, ``builtins.eval``, ``copyreg._reconstructor``, any class) and
every persistent id is refused before anything is called: one :class:`~vlp.errors.DataError`
naming the file and the refused ``module.name``. Python 2 pickles load with ``encoding="latin1"``
(their byte strings become ``str``), as the refer toolkit's files need.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, Callable

from vlp.errors import DataError

__all__ = ["ALLOWED_GLOBALS", "restricted_load", "restricted_loads"]

#: the globals a pickle may name: (module, name) -> the object; ``__builtin__`` is Python 2's
#: name of ``builtins`` (protocols < 3 write it so, and the overridden ``find_class`` sees it unmapped)
ALLOWED_GLOBALS: dict[tuple[str, str], Callable[..., Any]] = {
    (module, name): obj
    for module in ("builtins", "__builtin__")
    for name, obj in (("set", set), ("frozenset", frozenset))
}


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`ALLOWED_GLOBALS` and no persistent id; ``source``
    names the file in the errors."""

    def __init__(self, file: io.BufferedIOBase, source: str) -> None:
        super().__init__(file, encoding="latin1")
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise DataError(
                f"{self.source}: refused to unpickle the global '{module}.{name}' (only plain containers, "
                "strings and numbers are read; allowed globals: set, frozenset)"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise DataError(f"{self.source}: refused to unpickle a persistent id ({pid!r}): only plain data is read")


def restricted_loads(data: bytes, source: str = "<bytes>") -> Any:
    """The plain data pickled in ``data`` (any protocol, Python 2 pickles included); ``source``
    names it in errors. Raises :class:`DataError` for a refused global or persistent id, or for
    bytes that are not a complete, well-formed pickle."""
    try:
        return _RestrictedUnpickler(io.BytesIO(data), source).load()
    except DataError:
        raise
    except RecursionError:
        raise DataError(f"{source}: not a readable pickle (nested too deeply)") from None
    except Exception as e:  # UnpicklingError, EOFError, and what a malformed stream makes the opcodes raise
        raise DataError(f"{source}: not a readable pickle ({type(e).__name__}: {e})") from None


def restricted_load(path: str | Path) -> Any:
    """Read the pickle file ``path`` with the restricted unpickler (:func:`restricted_loads`)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"pickle file not found: {path}")
    return restricted_loads(path.read_bytes(), str(path))
