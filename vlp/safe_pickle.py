"""Reading a pickle without running code: plain data only, bounded in memory. Its user is ``vlp
prepare refcoco+`` (the RefCOCO family's ``refs(unc).p``); like :mod:`vlp.weights` (checkpoints read
without unpickling) it is a safe reader of untrusted files, and knows no annotation format.

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

A small file must not make the reader, or whoever uses what it read, allocate much
(:data:`BOUND_PER_BYTE`, :data:`BYTES_PER_BYTE`). Before anything is built, the opcodes are scanned
(:mod:`pickletools`, which allocates nothing a length field claims): a length that runs past the
end of the file and a memo index beyond the file's size (a 9-byte pickle can otherwise size the memo
table to gigabytes) are refused. While loading, the elements ``set``/``frozenset`` calls copy are
counted (a call on one shared list, repeated, copies it each time). After loading, the result is
measured as its users walk it -- shared references followed, as a tree -- and refused past either
bound, or if a container holds itself:

- elements: an 80 KB pickle of one list referenced 10,000 times holds 10**8 elements for whoever
  walks it;
- bytes: the characters of every string, the bytes of every bytes object and the decimal digits of
  every integer, counted each time a container references it (a shared object counts each time).
  A 53 KB ``refs.p`` whose one 50 KB sentence is referenced 500,000 times holds 25 GB of text
  for whoever writes it out (``vlp prepare refcoco+`` writes each sentence into its JSON).
"""

from __future__ import annotations

import io
import itertools
import pickle
import pickletools
from pathlib import Path
from typing import Any, Callable, Iterable

from vlp.errors import DataError

__all__ = ["ALLOWED_GLOBALS", "BOUND_PER_BYTE", "BYTES_PER_BYTE", "restricted_load", "restricted_loads"]

#: the most elements a pickle of ``b`` bytes may hold when walked as a tree, and that its
#: ``set``/``frozenset`` calls may copy: ``BOUND_FLOOR + BOUND_PER_BYTE * b`` (plain data needs at
#: least a byte or two per element; a real refs(unc).p of 40 MB stays far below)
BOUND_PER_BYTE = 16
BOUND_FLOOR = 1_000_000
#: the most bytes (string characters, bytes, integer digits) a pickle of ``b`` bytes may hold when
#: walked as a tree: ``BYTES_FLOOR + BYTES_PER_BYTE * b`` (a real refs(unc).p holds each sentence
#: once: its text is well under its file size)
BYTES_PER_BYTE = 16
BYTES_FLOOR = 1 << 24
#: the opcodes that store into the memo at an index given in the file
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})

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

    def __init__(self, file: io.BufferedIOBase, source: str, bound: int) -> None:
        super().__init__(file, encoding="latin1")
        self.source, self.bound, self.copied = source, bound, 0

    def find_class(self, module: str, name: str) -> Any:
        try:
            build = ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise DataError(
                f"{self.source}: refused to unpickle the global '{module}.{name}' (only plain containers, "
                "strings and numbers are read; allowed globals: set, frozenset)"
            ) from None
        return lambda items=(): build(self._count(items))

    def _count(self, items: Any) -> Any:
        """``items`` (what a set/frozenset call copies), after counting them against the bound."""
        self.copied += len(items)
        if self.copied > self.bound:
            raise DataError(
                f"{self.source}: refused: its set/frozenset calls copy more than {self.bound} elements "
                "(shared references copied again and again), more than a file this size can hold"
            )
        return items

    def persistent_load(self, pid: Any) -> Any:
        raise DataError(f"{self.source}: refused to unpickle a persistent id ({pid!r}): only plain data is read")


def restricted_loads(data: bytes, source: str = "<bytes>") -> Any:
    """The plain data pickled in ``data`` (any protocol, Python 2 pickles included); ``source``
    names it in errors. Raises :class:`DataError` for a refused global or persistent id, or for
    bytes that are not a complete, well-formed pickle."""
    bound = BOUND_FLOOR + BOUND_PER_BYTE * len(data)
    budget = BYTES_FLOOR + BYTES_PER_BYTE * len(data)
    try:
        _scan(data, source)
        loaded = _RestrictedUnpickler(io.BytesIO(data), source, bound).load()
        _check_tree(loaded, (bound, budget), f"{source}: refused: a file of {len(data)} bytes")
        return loaded
    except DataError:
        raise
    except RecursionError:
        raise DataError(f"{source}: not a readable pickle (nested too deeply)") from None
    except Exception as e:  # UnpicklingError, EOFError, and what a malformed stream makes the opcodes raise
        raise DataError(f"{source}: not a readable pickle ({type(e).__name__}: {e})") from None


def _scan(data: bytes, source: str) -> None:
    """Walk the opcodes of ``data`` without building anything: a length past the end of the file
    (``pickletools`` reads what is there, never the claimed size) and a memo index beyond the file's
    size raise :class:`DataError`."""
    try:
        for op, arg, pos in pickletools.genops(data):
            if op.name in _PUTS and isinstance(arg, int) and arg > len(data):
                raise DataError(
                    f"{source}: not a readable pickle (byte {pos}: memo index {arg} is beyond what a file of "
                    f"{len(data)} bytes can fill; refused before allocating for it)"
                )
    except DataError:
        raise
    except Exception as e:  # ValueError from a length running past the end, an unknown opcode, ...
        raise DataError(f"{source}: not a readable pickle ({e})") from None


#: the containers plain data is built of (everything else is a leaf)
_CONTAINERS = (list, tuple, set, frozenset, dict)


def _children(obj: Any) -> Iterable[Any]:
    """The elements of a container (a dict's keys and values), without copying a sequence."""
    return itertools.chain(obj.keys(), obj.values()) if type(obj) is dict else obj


def _leaf_bytes(leaf: Any) -> int:
    """What a leaf counts against the byte budget: a string's characters, a bytes object's length,
    an integer's decimal digits (at most ``bits // 3 + 1``); 0 for anything else (floats, None)."""
    if isinstance(leaf, (str, bytes, bytearray)):
        return len(leaf)
    return leaf.bit_length() // 3 + 1 if isinstance(leaf, int) else 0


def _check_tree(root: Any, bounds: tuple[int, int], refused: str) -> None:
    """Refuse ``root`` (:class:`DataError` starting with ``refused``, which names the file) if,
    walked as a tree (each shared reference followed again), it holds more than ``bounds[0]``
    elements or more than ``bounds[1]`` bytes (:func:`_leaf_bytes`), or if a container holds itself.
    Iterative, each container visited once; leaves count 1 element each and are never pushed."""
    if type(root) not in _CONTAINERS:
        return
    bound, budget = bounds
    size: dict[int, tuple[int, int]] = {}  # id -> (elements, bytes) of the container's tree, itself included
    on_path: set[int] = set()
    todo: list[tuple[Any, bool]] = [(root, False)]
    while todo:
        obj, finished = todo.pop()
        key = id(obj)
        if finished:
            on_path.discard(key)
            elements, nbytes = 1, 0
            for child in _children(obj):
                e, b = size.get(id(child)) or (1, _leaf_bytes(child))
                elements, nbytes = elements + e, nbytes + b
            size[key] = (elements, nbytes)
            if elements > bound:
                raise DataError(
                    f"{refused} expands to more than {bound} elements when its shared references are followed "
                    "(one container referenced many times), more than a file this size can hold"
                )
            if nbytes > budget:
                raise DataError(
                    f"{refused} holds more than {budget} bytes of text (strings, bytes, integer digits) when its shared "
                    f"references are followed (one string referenced many times; the budget is {BYTES_PER_BYTE} bytes per byte of the "
                    f"file, at least {BYTES_FLOOR})"
                )
            continue
        if key in size:
            continue
        if key in on_path:
            raise DataError(f"{refused} has a container that holds itself (a cycle; plain data has none)")
        on_path.add(key)
        todo.append((obj, True))
        todo.extend((k, False) for k in _children(obj) if type(k) in _CONTAINERS and id(k) not in size)


def restricted_load(path: str | Path) -> Any:
    """Read the pickle file ``path`` with the restricted unpickler (:func:`restricted_loads`)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"pickle file not found: {path}")
    return restricted_loads(path.read_bytes(), str(path))
