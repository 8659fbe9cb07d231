"""JSON annotation files in and out, and the per-key entry rules every annotation loader shares.

The loaders of :mod:`vlp.data.formats` (pretraining, retrieval) and :mod:`vlp.data.downstream_formats`
(VQA, NLVR2) build their entry parsers from the rules here (:func:`entry_object`, :func:`entry_field`,
:func:`entry_text`, :func:`entry_image`), which raise :class:`EntryError`; the parsers report through an
:class:`Issues` sink that either raises the first problem or collects them all. Files are written atomically
(:func:`write_atomic`, :func:`write_json_atomic`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Optional, TypeVar

from vlp.errors import BadJSON, DataError, EntryError
from vlp.file_modes import umask_mode
from vlp.regular_files import is_regular, open_regular

T = TypeVar("T")


class Issues:
    """Where the entry parsers below put the problems they find: raised at once (the loaders'
    default: the first problem stops the file) or, with ``collect=True``, recorded in ``found``
    while parsing goes on (``vlp data check``, ``load_pairs(on_bad="skip")``). One set of rules,
    two ways of reporting."""

    def __init__(self, collect: bool = False) -> None:
        self.collect = collect
        self.found: list[EntryError] = []

    def add(self, err: EntryError) -> None:
        """Raise ``err``, or record it when collecting."""
        if not self.collect:
            raise err
        self.found.append(err)

    def get(self, rule: Callable[..., T], *args: Any) -> Optional[T]:
        """``rule(*args)``; when collecting, the :class:`EntryError` it raises is recorded and None returned."""
        try:
            return rule(*args)
        except EntryError as err:
            if not self.collect:
                raise
            self.found.append(err)
            return None

    def entry(self, path: Path, i: int, e: Any) -> Optional[Entry]:
        """Entry ``i`` of ``path`` as an :class:`Entry` to read key by key, or None when it is not a
        JSON object (the problem goes here)."""
        obj = self.get(entry_object, path, i, e)
        return None if obj is None else Entry(self, path, i, obj)


class Entry:
    """One entry (a JSON object ``e``, number ``i`` of file ``path``) read key by key under
    ``issues``: :meth:`get` applies one rule to it; :attr:`ok` says whether every rule applied so
    far passed (always true unless collecting: a failing rule raises); :attr:`origin` names it."""

    def __init__(self, issues: Issues, path: Path, i: int, e: dict) -> None:
        self.issues, self.path, self.i, self.e = issues, path, i, e
        self._found = len(issues.found)

    def get(self, rule: Callable[..., T], *args: Any) -> Optional[T]:
        """``rule(path, i, e, *args)`` under :meth:`Issues.get`."""
        return self.issues.get(rule, self.path, self.i, self.e, *args)

    def __contains__(self, key: str) -> bool:
        return key in self.e

    @property
    def ok(self) -> bool:
        """Whether no rule applied through :meth:`get` so far recorded a problem."""
        return len(self.issues.found) == self._found

    @property
    def origin(self) -> str:
        """The entry's name in messages: ``"{path} entry {i}"``."""
        return f"{self.path} entry {self.i}"


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; errors name the file (:class:`BadJSON`, with line and column, for syntax errors)."""
    path = Path(path)
    if not is_regular(path, "annotation file"):
        raise DataError(f"annotation file not found: {path}")
    try:
        with open_regular(path, "annotation file") as f:
            return json.loads(f.read().decode("utf-8"))
    except json.JSONDecodeError as e:
        raise BadJSON(path, e.lineno, e.colno, e.msg) from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: invalid JSON (not UTF-8 text: byte {e.start}: {e.reason})") from None
    except RecursionError:
        raise DataError(f"{path}: invalid JSON (nested too deeply to parse)") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise DataError(f"{path}: invalid JSON ({e})") from None


def entry_list(path: Path, data: Any) -> list:
    """The entries of an annotation file: its top level must be a JSON list."""
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of entries, got {type(data).__name__}")
    return data


def read_entries(path: Path) -> list:
    """The entries of the annotation file ``path``: :func:`read_json`, its top level a JSON list
    (:func:`entry_list`)."""
    return entry_list(path, read_json(path))


def entry_object(path: Path, i: int, e: Any) -> dict:
    """Entry ``i`` (``e``) of ``path`` itself, returned as is; raise :class:`EntryError` (no key)
    when it is not a JSON object."""
    if not isinstance(e, dict):
        raise EntryError(path, i, None, f"expected an object, got {type(e).__name__}")
    return e


def entry_field(path: Path, i: int, e: dict, key: str, types: tuple[type, ...], what: str) -> Any:
    """``e[key]`` of entry ``i`` of ``path``; raise :class:`EntryError` naming the key when it is
    missing or not one of ``types`` (a bool never passes); ``what`` names the expectation."""
    if key not in e:
        raise EntryError(path, i, key, f"missing key '{key}' (expected {what})")
    v = e[key]
    if not isinstance(v, types) or isinstance(v, bool):
        raise EntryError(path, i, key, f"key '{key}' is {type(v).__name__}, expected {what}")
    return v


def entry_text(path: Path, i: int, e: dict, key: str, what: str) -> str:
    """The string ``e[key]`` of entry ``i`` of ``path``, as written; raise :class:`EntryError` naming
    the key when it is missing, not a string, or empty or blank (``what`` names the expectation)."""
    v = entry_field(path, i, e, key, (str,), what)
    if not v.strip():
        raise EntryError(path, i, key, f"key '{key}' is an empty string, expected {what}")
    return v


def entry_image(path: Path, i: int, e: dict) -> str:
    """The ``image`` path of entry ``i`` of ``path``, as written (not resolved); raise
    :class:`EntryError` when it is missing, not a string, or empty."""
    return entry_text(path, i, e, "image", "an image path string")


def _normal(image: str) -> bool:
    """Whether ``str(Path(image)) == image``: no doubled slash, ``.`` part or trailing slash."""
    return not (
        not image
        or "//" in image
        or "/./" in image
        or image.startswith("./")
        or image.endswith(("/", "/."))
        or image == "."
    )


def resolve_image(image: str, root: Path) -> str:
    """``str(Path(image))`` when absolute, else ``str(root / image)``. The common case (an image
    path ``pathlib`` would leave as it is) is joined as strings: millions of entries load faster."""
    if _normal(image):
        if image.startswith("/"):
            return image
        base = str(root)
        return image if base == "." else base + image if base.endswith("/") else f"{base}/{image}"
    p = Path(image)
    return str(p if p.is_absolute() else root / p)


def plural(n: int, one: str, many: str = "") -> str:
    """``"1 entry"``, ``"2 entries"``: ``n`` and the noun, plural ``many`` (default ``one + "s"``)."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def write_atomic(path: Path, write: Callable[[IO], Any], binary: bool = False) -> None:
    """Call ``write(file)`` on a temporary file in ``path``'s folder, then ``os.replace`` it into
    place (its mode following the umask): a reader never sees a half-written file, a failure leaves nothing behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
        os.chmod(tmp, umask_mode())  # mkstemp creates 0600 files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: Path, obj: Any, **dump_kwargs: Any) -> None:
    """Write JSON (plus a newline) atomically; ``dump_kwargs`` go to ``json.dump``."""

    def write(f: IO) -> None:
        json.dump(obj, f, **dump_kwargs)
        f.write("\n")

    write_atomic(path, write)
