"""Shards named by URL: ``s3://``, ``gs://``, ``http(s)://`` (or any other fsspec protocol) and
``pipe:COMMAND`` (the command's standard output is the tar, webdataset's convention).

A ``data.train`` entry that is a URL names tars: one ``.tar`` URL or a brace pattern of them
(``s3://bucket/cc12m/{00000..01242}.tar``). A shard is read as a stream: :func:`open_url` gives a
binary file that :mod:`tarfile` reads in stream mode, holding at most one block
(:data:`BLOCK_SIZE`) of the shard in memory; nothing is written to disk. Reads that fail are
retried from the byte they stopped at (:class:`RetryingReader`, bounded tries with backoff and
jitter); a ``pipe:`` stream cannot be reopened there and is not retried. Reads have a per-read and
a per-shard deadline (:mod:`vlp.remote.url_deadlines`, :class:`UrlTimeouts`).

A small body (img2dataset's ``{name}_stats.json`` beside a tar, which
:func:`vlp.data.shard_counts.read_stats` fetches) is read whole under a byte budget
(:func:`read_small`). Credentials and the endpoint come from the filesystem's own
configuration (for S3: the ``AWS_*`` environment variables or a profile, ``AWS_ENDPOINT_URL`` for
an S3-compatible server); vlp passes none. A URL holding credentials (a user part, a signed URL's
query) is refused by :func:`shard_urls`, which every URL entry goes through before it is read.
"""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO, Callable, Iterator, Optional, cast

from vlp.errors import DataError
from vlp.remote.brace_patterns import expand
from vlp.remote.url_bodies import BLOCK_SIZE, RangeFile, ServerFault, fetch_small
from vlp.remote.url_credentials import redacted, refusal
from vlp.remote.url_deadlines import (
    S3FS_RETRIES,
    Deadline,
    PipeReader,
    ShardTimeout,
    UrlTimeouts,
    is_timeout,
    storage_options,
)

PIPE = "pipe:"
RETRIES = 4  # tries after the first failed read of a shard, before it counts as broken
BACKOFF_S = 0.5  # the first retry's wait; doubled each try, times a jitter in [0.5, 1.5)


def is_url(entry: str) -> bool:
    """Whether a ``data.train`` entry names shards by URL (``scheme://...`` or ``pipe:...``)."""
    return entry.startswith(PIPE) or "://" in entry


def shard_urls(entry: str) -> list[str]:
    """The tar URLs of a URL entry: the brace pattern expanded (``{00000..00041}``, ``{a,b}``), or
    the one URL. A URL that is not a ``.tar`` (but for ``pipe:``), or that holds credentials
    (:mod:`vlp.remote.url_credentials`), raises one :class:`DataError` (naming it with the secret as ``***``);
    so does a pattern of more shards than :data:`~vlp.remote.brace_patterns.MAX_PATTERN_SHARDS`,
    counted before it is expanded."""
    refused = refusal(entry)
    if refused:
        raise DataError(refused)
    urls = expand(entry, "data.train entry")
    refused = next((r for r in map(refusal, urls) if r), None)
    if refused:
        raise DataError(refused)
    bad = [u for u in urls if not u.startswith(PIPE) and not u.endswith(".tar")]
    if bad:
        raise DataError(
            f"data.train entry {entry!r}: {bad[0]!r} is not a .tar URL; a URL entry names tars, one or a brace "
            "pattern of them (s3://bucket/prefix/{00000..00041}.tar), or pipe:COMMAND writing a tar"
        )
    return urls


def read_small(url: str, budget: int, timeouts: UrlTimeouts, what: str) -> Optional[bytes]:
    """The body at ``url`` read whole within ``timeouts.read_s`` and ``budget`` bytes
    (:func:`~vlp.remote.url_bodies.fetch_small`); None when it does not exist. Any other failure
    (no credentials, a server error, past the deadline or the budget) raises one :class:`DataError`
    naming ``url``: ``cannot read {what}: {reason}``."""
    fs = _filesystem(url, timeouts)
    try:
        return fetch_small(fs, fs._strip_protocol(url), budget, timeouts.read_s)
    except FileNotFoundError:
        return None
    except Exception as e:  # fsspec backends raise their own types: credentials, permissions, HTTP status
        reason = f"no answer within {timeouts.read_s:g} s" if is_timeout(e) else reason_of(e)
        raise DataError(f"{url}: cannot read {what}: {reason}{expected(url, e)}") from None


def check_reachable(url: str, timeouts: Optional[UrlTimeouts] = None) -> None:
    """Raise one :class:`DataError` naming ``url`` unless the shard there can be found (one
    ``info`` request: a HEAD); ``pipe:`` URLs are not checked."""
    if url.startswith(PIPE):
        return
    t = timeouts or UrlTimeouts()
    fs = _filesystem(url, t)
    try:
        if getattr(fs, "async_impl", False):  # one deadline over the request, whatever is retried under it
            import fsspec.asyn

            fsspec.asyn.sync(fs.loop, fs._info, fs._strip_protocol(url), timeout=t.read_s)
        else:
            fs.info(url)
    except FileNotFoundError:
        raise DataError(f"{url}: no such shard (or no such bucket); expected the tars data.train names") from None
    except Exception as e:  # fsspec backends raise their own types
        reason = f"no answer within {t.read_s:g} s" if is_timeout(e) else reason_of(e)
        raise DataError(f"{url}: cannot reach the shard: {reason}{expected(url, e)}") from None


def expected(url: str, e: BaseException) -> str:
    """What was expected, for an S3 request whose error says credentials are missing (else "")."""
    name = type(e).__name__
    if url.startswith("s3") and "Credentials" in name:
        return (
            "; expected S3 credentials in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile (AWS_PROFILE), "
            "allowed to read this bucket (and AWS_ENDPOINT_URL for an S3-compatible server)"
        )
    return ""


def reason_of(e: BaseException) -> str:
    """One line saying what went wrong: the exception's type and its first line, credentials redacted
    (a backend's text may hold a URL vlp never saw, e.g. a redirect to a presigned one)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return redacted(f"{type(e).__name__}: {text}") if text else type(e).__name__


#: the fsspec filesystems this process has opened (weakly: fsspec's own cache decides how long they live)
_OPENED: weakref.WeakSet[Any] = weakref.WeakSet()
#: in a forked child, the parent's filesystems, held so that they are never finalized in the child
_INHERITED: list[Any] = []


def _hold_inherited() -> None:
    """Run in every forked child (loader workers): hold the filesystems the parent had opened. Their
    sessions' sockets are the parent's, registered in its event loop's epoll set, which a fork
    shares; fsspec drops its cached instances in a child, and their finalizers closing those
    sockets there unregister them in the parent, whose next request on them then waits for its
    read deadline (seen as every stats file timing out once a loader had forked workers)."""
    _INHERITED.extend(_OPENED)


os.register_at_fork(after_in_child=_hold_inherited)


def _filesystem(url: str, timeouts: UrlTimeouts) -> Any:
    """The fsspec filesystem of ``url`` with ``timeouts``' per-read deadline (cached per process
    and options by fsspec). A missing backend (s3fs, gcsfs, aiohttp) raises one :class:`DataError`
    naming the extra that brings it."""
    import fsspec.core

    try:
        fs, _ = fsspec.core.url_to_fs(url, **storage_options(url.partition("://")[0], timeouts))
    except ImportError as e:
        extra = {"s3": "vlp[s3]", "gs": "vlp[gcs]", "gcs": "vlp[gcs]"}.get(url.partition("://")[0], "vlp[http]")
        raise DataError(f"{url}: cannot read this URL: {reason_of(e)}; install {extra}") from None
    except ValueError as e:
        raise DataError(f"{url}: not a URL fsspec can read: {reason_of(e)}") from None
    if hasattr(fs, "_call_s3"):  # s3fs: one attempt a request (url_deadlines.storage_options)
        fs.retries = S3FS_RETRIES
    _OPENED.add(fs)
    return fs


class RetryingReader(io.RawIOBase):
    """A shard at a URL as a raw binary stream that survives failed reads: a read that raises (a
    reset, an error status, no byte for ``timeouts.read_s``) is retried up to ``retries`` times
    (default :data:`RETRIES`), each after a wait of ``backoff * 2**k`` seconds times a jitter in
    [0.5, 1.5) (``backoff``: :data:`BACKOFF_S`), by reopening the URL at the byte the stream had
    reached (``opener(deadline)``); then it raises :class:`OSError` with the reason (a read that
    succeeds resets the count). A missing shard is not retried, nor an answer that is not what
    was asked for (:class:`~vlp.remote.url_bodies.ServerFault`); nor is one past its per-shard
    deadline (:class:`~vlp.remote.url_deadlines.Deadline`, ``timeouts.shard_s``). ``start``: the byte
    the stream begins at (a download continued from a partial file: :mod:`vlp.remote.url_downloads`)."""

    def __init__(
        self,
        url: str,
        opener: Callable[[Deadline], IO[bytes]],
        retries: Optional[int] = None,
        backoff: Optional[float] = None,
        timeouts: Optional[UrlTimeouts] = None,
        start: int = 0,
    ):
        super().__init__()
        self.url, self.opener = url, opener
        self.retries = RETRIES if retries is None else retries
        self.backoff = BACKOFF_S if backoff is None else backoff
        self.deadline = Deadline(timeouts or UrlTimeouts())
        self.file: Optional[IO[bytes]] = None
        self.pos, self.failures = start, 0
        self.rng = random.Random()

    def readable(self) -> bool:
        """Always True: the stream is read, never written."""
        return True

    def readinto(self, buffer: Any) -> int:
        """Read up to ``len(buffer)`` bytes at the stream's position into ``buffer``, retrying failed reads
        (class doc); returns how many (0 at the end). Raises :class:`~vlp.remote.url_deadlines.ShardTimeout`
        past the shard's deadline, :class:`OSError` for a missing shard or once the retries are spent."""
        with self.deadline.timing():
            data = self._read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.pos += n
        return n

    def _read(self, n: int) -> bytes:
        while True:
            try:
                self.deadline.check()
                if self.file is None:
                    self.file = self.opener(self.deadline)
                    if self.pos:
                        self.file.seek(self.pos)
                data = self.file.read(n)
            except Exception as e:  # fsspec backends raise their own types (aiohttp, botocore)
                self._drop()
                if isinstance(e, ShardTimeout) or self.deadline.left() <= 0:
                    raise self.deadline.expired() from None
                self.failures += 1
                final = isinstance(e, (FileNotFoundError, ServerFault))  # the server would answer the same
                reason = (
                    str(e) if isinstance(e, ServerFault) else self.deadline.stalled() if is_timeout(e) else reason_of(e)
                )
                if final or self.failures > self.retries:
                    tries = "" if final else f" (after {self.failures} tries)"
                    raise OSError(f"{reason}{tries}") from None
                wait = self.backoff * 2 ** (self.failures - 1) * self.rng.uniform(0.5, 1.5)
                time.sleep(max(0.0, min(wait, self.deadline.left())))
                continue
            self.failures = 0
            return data

    def _drop(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except Exception:  # a broken connection may fail to close; it is dropped either way
                pass
            self.file = None

    def close(self) -> None:
        """Close the open connection to the URL, if any (errors in closing it ignored), then the stream."""
        self._drop()
        super().close()


@contextmanager
def open_url(url: str, timeouts: Optional[UrlTimeouts] = None) -> Iterator[BinaryIO]:
    """The tar at ``url`` as a buffered binary stream (module doc) under ``timeouts``' deadlines;
    ``pipe:COMMAND``: the command's standard output (a non-zero exit status raises
    :class:`OSError` at the end)."""
    t = timeouts or UrlTimeouts()
    if url.startswith(PIPE):
        with _pipe(url[len(PIPE) :], t) as out:
            yield out
        return
    fs = _filesystem(url, t)
    path = fs._strip_protocol(url)

    def opener(deadline: Deadline) -> IO[bytes]:
        if getattr(fs, "async_impl", False):  # http(s), s3, gs: ranged requests cancelled at the deadline
            return cast(IO[bytes], RangeFile(fs, path, deadline))
        return fs.open(url, "rb", block_size=BLOCK_SIZE, cache_type="readahead")

    with io.BufferedReader(RetryingReader(url, opener, timeouts=t), buffer_size=1 << 16) as f:
        yield f


#: the guard that runs a ``pipe:`` command in a process group of its own (:mod:`vlp.remote.pipe_guard`)
PIPE_GUARD = str(Path(__file__).with_name("pipe_guard.py"))


@contextmanager
def _pipe(command: str, timeouts: UrlTimeouts) -> Iterator[BinaryIO]:
    """The standard output of ``command`` under ``timeouts``' deadlines (:class:`PipeReader`: a
    read past one raises :class:`OSError`). The command runs under :data:`PIPE_GUARD` in a process
    group of its own, killed whole when it is not read to its end (a deadline, a reader that stopped
    early), when it is, whatever it left running, and when this process dies (the guard's doc). Its
    non-zero exit status (not one from the kill that stops a command read only in part) raises
    :class:`OSError`, in place of what its short output made the reader raise."""
    guard = [sys.executable, "-S", "-I", PIPE_GUARD, str(os.getpid()), command]
    proc = subprocess.Popen(guard, stdout=subprocess.PIPE, bufsize=0, start_new_session=True)
    raw = cast(IO[bytes], proc.stdout)
    out = cast(BinaryIO, io.BufferedReader(PipeReader(raw.fileno(), Deadline(timeouts)), buffer_size=1 << 16))
    done = False
    try:
        yield out
        for _ in iter(lambda: out.read(1 << 16), b""):  # the tar's padding: the command ends on its own
            pass
        done = True
    finally:
        if not done:
            _kill_group(proc.pid)
        out.close()
        raw.close()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped: its group id is held
        _kill_group(proc.pid)  # what the command left running
        status = proc.wait()
        if status > 0:
            raise OSError(f"`{command}` exited with status {status}")


def _kill_group(pgid: int) -> None:
    """SIGKILL to every process of group ``pgid`` (none left: nothing to do)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
