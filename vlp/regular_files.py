"""Only regular files are read as data: shards, their indexes (``sizes.json``, img2dataset's
``_stats.json``) and annotation files.

A FIFO (named pipe) opened for reading blocks until a writer appears, a device may block or
never end, and a directory or socket cannot be read; a file named like a shard may be any of
these. Every data file vlp reads from a folder goes through :func:`open_regular` (the type is
checked before opening, and the file is opened without blocking and checked again, so a file
replaced in between is refused too); listings keep only what :func:`is_regular` accepts. A
refusal is one :class:`~vlp.errors.DataError` naming the file and what it is.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from vlp.errors import DataError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words ("a regular file", "a FIFO (named pipe)", ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


class NotRegular(DataError):
    """A data file that is not a regular file (a FIFO, socket, device or directory)."""


def refusal(path: str | Path, what: str, mode: int) -> NotRegular:
    """The error for ``what`` (e.g. "shard") at ``path`` that is not a regular file."""
    return NotRegular(
        f"{path}: {what} is {kind_of(mode)}, not a regular file; vlp reads data only from regular files "
        "(remove it or replace it with the real file)"
    )


def is_regular(path: str | Path, what: str) -> bool:
    """Whether ``path`` (symbolic links followed) is a regular file: False when nothing is there,
    :func:`refusal` raised when something else is (a FIFO, socket, device or directory)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as e:
        raise DataError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise refusal(path, what, mode)
    return True


def open_regular(path: str | Path, what: str) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file, else :func:`refusal`; a missing
    file raises :class:`FileNotFoundError`. Opened with ``O_NONBLOCK`` (so a FIFO put there after the
    check cannot block the open) and checked again on the open descriptor."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise refusal(path, what, mode)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise refusal(path, what, mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
