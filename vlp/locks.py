"""File locks. :func:`file_lock`: one exclusive lock for every place where processes take turns:
experiment result files shared by ``--shard`` workers (``scripts/experiments/seed_results.py``) and the
model zoo's cache (:mod:`vlp.interop.download`). :func:`lock_folder`: one run per folder, held for
the run's life, a second run refused in one line naming the first (a training run's ``output_dir``,
``vlp demo``'s ``--out``)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from filelock import FileLock, Timeout

from vlp.errors import ConfigError
from vlp.remote.url_credentials import redacted

logger = logging.getLogger(__name__)

__all__ = ["LOCK_NAME", "file_lock", "lock_folder", "release_folder", "releasing_folders"]


@contextmanager
def file_lock(path: str | Path, waiting: Optional[str] = None) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` for the ``with`` block (the ``filelock`` package:
    ``flock`` on POSIX). The file is created if missing and never deleted: removing a lock file
    another process waits on would let a third one in. Another holder, in this process or another,
    is waited for; ``waiting`` is then logged first (a warning: stderr on the console)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if waiting:
            logger.warning(waiting)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


# ------------------------------------------------------------------ one run per folder

#: the lock file of a folder a run (or ``vlp demo``) writes into; kept after the run (never deleted:
#: removing a lock file another process is about to lock would let a third one in)
LOCK_NAME = ".lock"
#: the command line recorded in a lock file is cut to this many characters
COMMAND_CHARS = 200


@dataclass
class _Held:
    """A lock this process holds: the open file (its ``flock``) and the process that took it (a
    forked child inherits the table, not the right to let go of it)."""

    fd: int
    pid: int


_HELD: dict[str, _Held] = {}
_UNLOCKABLE_WARNED: set[str] = set()


def _forget_in_child() -> None:
    """In a forked child (a data loader worker): close its copies of the held locks' files, without
    unlocking (which would let go of the parent's lock). The lock stays the parent's and ends when
    the parent lets go of it or exits, not when a worker the parent left behind does."""
    for held in _HELD.values():
        try:
            os.close(held.fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def lock_folder(folder: str | Path, key: str) -> None:
    """Hold an exclusive lock on ``folder/.lock`` (``folder`` created if missing) for as long as this
    process lives or until :func:`release_folder`: the kernel lets go of an ``flock`` when its process
    ends, however it ends, so the lock file of a dead process stops nothing. The lock file records the
    holder (pid, host, start time, command line, URL credentials redacted). Taking a lock this process
    holds already is a no-op. Another holder: one :class:`ConfigError` naming ``key`` (the config key
    or option that named the folder), the folder and that process. A filesystem without ``flock`` (some
    network mounts): a warning, once per folder, and no lock."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    real = os.path.realpath(path)
    held = _HELD.get(real)
    if held is not None and held.pid == os.getpid():
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as e:
        raise ConfigError(f"{key} {folder}: cannot create its lock file {path} ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = _holder(fd)
        os.close(fd)
        raise ConfigError(
            f"{key} {folder} is in use by another run: {other}; wait for it to end, stop it, or choose another "
            f"{key} (its lock {path} is let go of when that process ends)"
        ) from None
    except OSError as e:  # ENOLCK, EOPNOTSUPP: a filesystem that does not lock
        os.close(fd)
        if real not in _UNLOCKABLE_WARNED:
            _UNLOCKABLE_WARNED.add(real)
            logger.warning(
                f"vlp: warning: {key} {folder}: cannot lock {path} ({e.strerror}): a second run into this folder "
                "is not detected"
            )
        return
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(_holder_record()) + "\n").encode())
    _HELD[real] = _Held(fd, os.getpid())


def release_folder(folder: str | Path) -> None:
    """Let go of the lock :func:`lock_folder` took on ``folder`` in this process (nothing if none)."""
    real = os.path.realpath(Path(folder) / LOCK_NAME)
    held = _HELD.get(real)
    if held is not None and held.pid == os.getpid():
        del _HELD[real]
        os.close(held.fd)


@contextmanager
def releasing_folders() -> Iterator[None]:
    """Let go, when the block ends (however it ends), of every folder lock taken inside it: a command
    called in-process (tests, the experiment scripts) holds its folders for its own life only."""
    before = set(_HELD)
    try:
        yield
    finally:
        for real in set(_HELD) - before:
            release_folder(Path(real).parent)


def _holder_record() -> dict[str, Any]:
    """What a lock file says of its holder."""
    command = " ".join([Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", *sys.argv[1:]])
    command = redacted(command)
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": command[:COMMAND_CHARS] + ("..." if len(command) > COMMAND_CHARS else ""),
    }


def _holder(fd: int) -> str:
    """The holder that the lock file open as ``fd`` names, in words (it writes itself there just after
    taking the lock: an empty file is read again for a moment)."""
    record: Any = None
    for _ in range(20):
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 65536).decode(errors="replace").strip()
        try:
            record = json.loads(text) if text else None
        except ValueError:
            record = None
        if isinstance(record, dict):
            break
        time.sleep(0.05)
    if not isinstance(record, dict):
        return "a process that has not written its name into the lock file"
    pid, host = record.get("pid"), record.get("host")
    alive = ""
    if host == socket.gethostname() and isinstance(pid, int) and not _running(pid):
        alive = " (not running any more: a child process of it still holds the lock)"
    return f"pid {pid} on {host}{alive}, since {record.get('since')}: {record.get('command')}"


def _running(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
