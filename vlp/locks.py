"""One exclusive file lock for every place where processes take turns: experiment result files
shared by ``--shard`` workers (``scripts/experiments/seed_results.py``) and the model zoo's cache
(:mod:`vlp.interop.download`)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from filelock import FileLock, Timeout

__all__ = ["file_lock"]


@contextmanager
def file_lock(path: str | Path, waiting: Optional[str] = None) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` for the ``with`` block (the ``filelock`` package:
    ``flock`` on POSIX). The file is created if missing and never deleted: removing a lock file
    another process waits on would let a third one in. Another holder, in this process or another,
    is waited for; ``waiting`` is then printed on stderr first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if waiting:
            print(waiting, file=sys.stderr, flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
