"""Deadlines of shard reads by URL (``data.url_read_timeout_s``, ``data.url_shard_timeout_s``).

**Per read**: a read that gets no byte for ``read_s`` seconds fails like a connection reset (the
caller retries it, then counts the shard as broken). The backends' own timeouts enforce it: aiohttp's
``ClientTimeout(sock_connect, sock_read)`` for ``http(s)://`` and botocore's ``connect_timeout`` /
``read_timeout`` for ``s3://`` (:func:`storage_options`); a ``pipe:`` command's output is waited
for with :func:`select.select` (:class:`PipeReader`). The backends' retries are off (botocore's
attempts and s3fs's loop around them: :data:`S3FS_RETRIES`), so one try of vlp's is one request:
a stalled endpoint costs ``read_s`` a try, not a read timeout for each retry of each layer. A small
body (a stats file) must arrive whole within ``read_s`` (:func:`vlp.remote.url_bodies.fetch_small`).

**Per shard**: a shard whose bytes have not all arrived after ``shard_s`` seconds of waiting for
them (a trickling server) is broken at once, not retried. The clock (:class:`Deadline`) runs only
while the reader waits for the shard's bytes (retries and their backoff included), not while the
loader decodes images or waits for the training to take its batches, so a slow consumer never
trips it. A request in flight is cancelled when it runs out
(:class:`~vlp.remote.url_bodies.RangeFile`: asyncio's ``wait_for`` through :func:`fsspec.asyn.sync`),
and so is a ``pipe:`` read.
"""

from __future__ import annotations

import io
import os
import select
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

READ_TIMEOUT_S = 60.0  # botocore's default read timeout: no byte for a minute is a dead connection
SHARD_TIMEOUT_S = 3600.0  # a 1 GB shard needs only 0.3 MB/s to arrive within it
S3FS_RETRIES = 1  # tries of s3fs's own loop around each request (its default, 5, multiplied botocore's)


@dataclass(frozen=True)
class UrlTimeouts:
    """The two deadlines of a URL shard's reads, in seconds (module doc)."""

    read_s: float = READ_TIMEOUT_S
    shard_s: float = SHARD_TIMEOUT_S


class ShardTimeout(OSError):
    """A shard not read within its per-shard deadline: broken at once, not retried."""


def is_timeout(e: BaseException) -> bool:
    """Whether ``e`` is a backend's read or connect timeout (asyncio/aiohttp, fsspec, botocore)."""
    return isinstance(e, TimeoutError) or "Timeout" in type(e).__name__


class Deadline:
    """The per-shard clock: seconds spent waiting for one shard's bytes (:meth:`timing`), against
    ``timeouts.shard_s``."""

    def __init__(self, timeouts: UrlTimeouts) -> None:
        self.timeouts = timeouts
        self.spent = 0.0
        self.since: Optional[float] = None  # when the wait in progress began

    @contextmanager
    def timing(self) -> Iterator[None]:
        """Count the time of the block as time spent waiting for the shard."""
        self.since = time.monotonic()
        try:
            yield
        finally:
            self.spent += time.monotonic() - self.since
            self.since = None

    def left(self) -> float:
        """Seconds of waiting the shard has left (<= 0: its deadline has passed)."""
        running = time.monotonic() - self.since if self.since is not None else 0.0
        return self.timeouts.shard_s - self.spent - running

    def expired(self) -> ShardTimeout:
        """The error (returned, not raised) of a shard past its deadline."""
        return ShardTimeout(f"not read within {self.timeouts.shard_s:g} s")

    def stalled(self) -> str:
        """The reason a read that hit the per-read deadline gives."""
        return f"no byte for {self.timeouts.read_s:g} s"

    def check(self) -> None:
        """Raise :class:`ShardTimeout` when the shard's deadline has passed."""
        if self.left() <= 0:
            raise self.expired()


def storage_options(protocol: str, timeouts: UrlTimeouts) -> dict[str, Any]:
    """fsspec options that give ``protocol``'s backend the per-read deadline: aiohttp's socket
    timeouts for http(s) (no total limit: a block over a slow link may take long), botocore's for
    s3, with botocore's retries off (one attempt a request: a stalled endpoint costs ``read_s``, not
    a read timeout per retry; vlp retries itself, :class:`~vlp.remote.shard_urls.RetryingReader`; s3fs's
    own retries are turned off on the filesystem, :data:`S3FS_RETRIES`); none for other protocols
    (they get the per-shard deadline only)."""
    t = timeouts.read_s
    if protocol in ("http", "https"):
        import aiohttp

        return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=t, sock_read=t)}}
    if protocol in ("s3", "s3a"):
        once = {"total_max_attempts": 1, "mode": "standard"}
        return {"config_kwargs": {"connect_timeout": t, "read_timeout": t, "retries": once}}
    return {}


class PipeReader(io.RawIOBase):
    """A ``pipe:`` command's standard output (file descriptor ``fd``) under both deadlines: a read
    that waits ``read_s`` for a byte, or past the shard's deadline, raises :class:`OSError`."""

    def __init__(self, fd: int, deadline: Deadline) -> None:
        super().__init__()
        self.fd, self.deadline = fd, deadline

    def readable(self) -> bool:
        """Always True: the command's output is read, never written."""
        return True

    def readinto(self, buffer: Any) -> int:
        """Read up to ``len(buffer)`` bytes of the output into ``buffer``; returns how many (0 at its end).
        Raises :class:`ShardTimeout` past the shard's deadline, :class:`OSError` when no byte came for
        ``read_s`` seconds."""
        with self.deadline.timing():
            self.deadline.check()
            wait = min(self.deadline.timeouts.read_s, self.deadline.left())
            ready, _, _ = select.select([self.fd], [], [], max(wait, 0.0))
            if not ready:
                self.deadline.check()
                raise OSError(self.deadline.stalled())
            data = os.read(self.fd, len(buffer))
        buffer[: len(data)] = data
        return len(data)
