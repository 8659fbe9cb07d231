"""Helpers shared by the ``vlp prepare`` converters (:mod:`vlp.prepare` and its
``prepare_*`` modules): typed access to the keys of official release files with errors that name
file, place and key, line reading, and image existence checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from vlp.errors import DataError

# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def required_key(path: Path, where: str, obj: Any, key: str, types: tuple[type, ...], what: str) -> Any:
    """``obj[key]`` (the object at ``where``, e.g. ``"entry 3"``, of file ``path``); raise
    :class:`DataError` naming file, place and key when ``obj`` is not an object, or the key is missing
    or not one of ``types`` (a bool never passes); ``what`` names the expectation."""
    if not isinstance(obj, dict):
        raise DataError(f"{path}: {where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise DataError(f"{path}: {where}: missing key '{key}' (expected {what})")
    v = obj[key]
    if not isinstance(v, types) or isinstance(v, bool):
        raise DataError(f"{path}: {where}: key '{key}' is {type(v).__name__}, expected {what}")
    return v


def required_text(path: Path, where: str, obj: Any, key: str, what: str) -> str:
    """The string ``obj[key]``, stripped; raise :class:`DataError` naming file, place and key where
    :func:`required_key` does (``types`` a string) and when the string is empty or blank."""
    v = required_key(path, where, obj, key, (str,), what)
    if not v.strip():
        raise DataError(f"{path}: {where}: key '{key}' is empty, expected {what}")
    return v.strip()


def top_list(path: Path, data: Any, key: Optional[str]) -> list:
    """``data[key]`` (or ``data`` itself when ``key`` is None) of file ``path``; raise
    :class:`DataError` naming the file (and key) when it is missing or not a list."""
    if key is not None:
        if not isinstance(data, dict) or key not in data:
            raise DataError(f"{path}: missing top-level key '{key}' (expected an object with a list under '{key}')")
        data = data[key]
        if not isinstance(data, list):
            raise DataError(f"{path}: key '{key}' is {type(data).__name__}, expected a list")
    elif not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list, got {type(data).__name__}")
    return data


def check_images_exist(rel_paths: Iterable[str], image_root: Optional[str | Path], source: Path) -> None:
    """Return nothing when ``image_root`` is None or every (relative) image of ``rel_paths`` is a file
    under it; otherwise raise one :class:`DataError` naming ``source``, the count of missing images
    and a few of them."""
    if image_root is None:
        return
    root = Path(image_root)
    distinct = list(dict.fromkeys(rel_paths))
    missing = [p for p in distinct if not (root / p).is_file()]
    if missing:
        raise DataError(
            f"{source}: {len(missing)} of {len(distinct)} images not found under {root}, e.g. " + ", ".join(missing[:3])
        )


def absolute_path(root: Path, rel: str) -> str:
    """``rel`` joined to the resolved ``root``, as a string (the file need not exist)."""
    return str(root.resolve() / rel)


def read_lines(path: Path) -> list[str]:
    """The lines of the UTF-8 text file ``path`` (without line ends); raise :class:`DataError` when it
    is not a file or not UTF-8."""
    if not path.is_file():
        raise DataError(f"file not found: {path}")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None


def read_json_lines(path: Path) -> Iterator[tuple[str, Any]]:
    """``("line N", object)`` for every non-blank line of a JSON-lines file; a line that is not JSON
    raises :class:`DataError` naming file and line (so does a file :func:`read_lines` rejects)."""
    for n, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        where = f"line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: {where}: invalid JSON ({err.msg})") from None
        yield where, obj
