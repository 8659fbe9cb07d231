"""Shards named by URL: ``s3://``, ``gs://``, ``http(s)://`` (or any other fsspec protocol) and
``pipe:COMMAND`` (the command's standard output is the tar, webdataset's convention).

A ``data.train`` entry that is a URL names tars: one ``.tar`` URL or a brace pattern of them
(``s3://bucket/cc12m/{00000..01242}.tar``). A shard is read as a stream: :func:`open_url` gives a
binary file that :mod:`tarfile` reads in stream mode, holding at most one block
(:data:`BLOCK_SIZE`) of the shard in memory; nothing is written to disk. Reads that fail are
retried from the byte they stopped at (:class:`RetryingReader`, bounded tries with backoff and
jitter); a ``pipe:`` stream cannot be reopened there and is not retried.

Counts without reading a shard: img2dataset's ``{name}_stats.json`` beside each tar, fetched
concurrently (:func:`read_stats`). Credentials and the endpoint come from the filesystem's own
configuration (for S3: the ``AWS_*`` environment variables or a profile, ``AWS_ENDPOINT_URL`` for
an S3-compatible server); vlp passes none. A URL holding credentials (a user part, a signed URL's
query) is refused by :func:`shard_urls`, which every URL entry goes through before it is read.
"""

from __future__ import annotations

import io
import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import IO, Any, BinaryIO, Callable, Iterator, Optional, cast

from vlp.errors import DataError
from vlp.url_credentials import refusal

PIPE = "pipe:"
BLOCK_SIZE = 4 << 20  # bytes of a shard a reader holds (fsspec's read-ahead block)
STATS_THREADS = 64  # stats files fetched at once
RETRIES = 4  # tries after the first failed read of a shard, before it counts as broken
BACKOFF_S = 0.5  # the first retry's wait; doubled each try, times a jitter in [0.5, 1.5)


def is_url(entry: str) -> bool:
    """Whether a ``data.train`` entry names shards by URL (``scheme://...`` or ``pipe:...``)."""
    return entry.startswith(PIPE) or "://" in entry


def shard_urls(entry: str) -> list[str]:
    """The tar URLs of a URL entry: the brace pattern expanded (``{00000..00041}``, ``{a,b}``), or
    the one URL. A URL that is not a ``.tar`` (but for ``pipe:``), or that holds credentials
    (:mod:`vlp.url_credentials`), raises one :class:`DataError` (naming it with the secret as ``***``)."""
    import braceexpand

    urls = list(braceexpand.braceexpand(entry))
    refused = next((r for r in map(refusal, [entry, *urls]) if r), None)
    if refused:
        raise DataError(refused)
    bad = [u for u in urls if not u.startswith(PIPE) and not u.endswith(".tar")]
    if bad:
        raise DataError(
            f"data.train entry {entry!r}: {bad[0]!r} is not a .tar URL; a URL entry names tars, one or a brace "
            "pattern of them (s3://bucket/prefix/{00000..00041}.tar), or pipe:COMMAND writing a tar"
        )
    return urls


def stats_url(url: str) -> str:
    """img2dataset's stats file of the tar at ``url``: ``{name}_stats.json`` beside it."""
    return url[: -len(".tar")] + "_stats.json"


def read_stats(urls: list[str]) -> Optional[list[int]]:
    """Each tar's ``successes`` from its ``_stats.json``, fetched concurrently (nothing else is
    requested); None when the first tar has none or any is missing (``pipe:`` URLs have none).
    A stats file that cannot be read for another reason (no credentials, a server error) or does
    not hold a count raises one :class:`DataError` naming it; so does a first tar that cannot be
    found (no such bucket or key), asked for when its stats file is missing."""
    if not urls or any(u.startswith(PIPE) for u in urls):
        return None
    first = _fetch_stats(urls[0])
    if first is None:
        _check_reachable(urls[0])
        return None
    with ThreadPoolExecutor(min(STATS_THREADS, len(urls))) as pool:
        rest = list(pool.map(_fetch_stats, urls[1:]))
    if any(n is None for n in rest):
        return None
    return [first] + [n for n in rest if n is not None]


def _fetch_stats(url: str) -> Optional[int]:
    """``successes`` of ``url``'s stats file; None when it does not exist."""
    import json

    f = stats_url(url)
    try:
        data = _filesystem(f).cat_file(f)
    except FileNotFoundError:
        return None
    except Exception as e:  # fsspec backends raise their own types: credentials, permissions, HTTP status
        raise DataError(f"{f}: cannot read img2dataset's stats: {reason_of(e)}") from None
    try:
        n = json.loads(data).get("successes")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        raise DataError(f"{f}: expected img2dataset's stats, a JSON object with 'successes'") from None
    if not isinstance(n, int) or n < 0:
        raise DataError(f"{f}: 'successes' is {n!r}, expected a count >= 0")
    return n


def _check_reachable(url: str) -> None:
    """Raise one :class:`DataError` naming ``url`` unless the shard there can be found."""
    try:
        _filesystem(url).info(url)
    except FileNotFoundError:
        raise DataError(f"{url}: no such shard (or no such bucket); expected the tars data.train names") from None
    except Exception as e:  # fsspec backends raise their own types
        raise DataError(f"{url}: cannot reach the shard: {reason_of(e)}") from None


def reason_of(e: BaseException) -> str:
    """One line saying what went wrong: the exception's type and its first line."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _filesystem(url: str) -> Any:
    """The fsspec filesystem of ``url`` (cached per process by fsspec). A missing backend (s3fs,
    gcsfs, aiohttp) raises one :class:`DataError` naming the extra that brings it."""
    import fsspec.core

    try:
        fs, _ = fsspec.core.url_to_fs(url)
    except ImportError as e:
        extra = {"s3": "vlp[s3]", "gs": "vlp[gcs]", "gcs": "vlp[gcs]"}.get(url.partition("://")[0], "vlp[http]")
        raise DataError(f"{url}: cannot read this URL: {reason_of(e)}; install {extra}") from None
    except ValueError as e:
        raise DataError(f"{url}: not a URL fsspec can read: {reason_of(e)}") from None
    return fs


class RetryingReader(io.RawIOBase):
    """A shard at a URL as a raw binary stream that survives failed reads: a read that raises is
    retried up to ``retries`` times (default :data:`RETRIES`), each after a wait of ``backoff * 2**k`` seconds times a jitter
    in [0.5, 1.5) (``backoff``: :data:`BACKOFF_S`), by reopening the URL at the byte the stream had reached. Then it raises
    :class:`OSError` with the reason (a read that succeeds resets the count)."""

    def __init__(
        self, url: str, opener: Callable[[], IO[bytes]], retries: Optional[int] = None, backoff: Optional[float] = None
    ):
        super().__init__()
        self.url, self.opener = url, opener
        self.retries = RETRIES if retries is None else retries
        self.backoff = BACKOFF_S if backoff is None else backoff
        self.file: Optional[IO[bytes]] = None
        self.pos, self.failures = 0, 0
        self.rng = random.Random()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            try:
                if self.file is None:
                    self.file = self.opener()
                    if self.pos:
                        self.file.seek(self.pos)
                data = self.file.read(len(buffer))
            except Exception as e:  # fsspec backends raise their own types (aiohttp, botocore)
                self._drop()
                self.failures += 1
                if isinstance(e, FileNotFoundError) or self.failures > self.retries:
                    tries = "" if isinstance(e, FileNotFoundError) else f" (after {self.failures} tries)"
                    raise OSError(f"{reason_of(e)}{tries}") from None
                time.sleep(self.backoff * 2 ** (self.failures - 1) * self.rng.uniform(0.5, 1.5))
                continue
            self.failures = 0
            n = len(data)
            buffer[:n] = data
            self.pos += n
            return n

    def _drop(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except Exception:  # a broken connection may fail to close; it is dropped either way
                pass
            self.file = None

    def close(self) -> None:
        self._drop()
        super().close()


@contextmanager
def open_url(url: str) -> Iterator[BinaryIO]:
    """The tar at ``url`` as a buffered binary stream (module doc); ``pipe:COMMAND``: the command's
    standard output (a non-zero exit status raises :class:`OSError` at the end)."""
    if url.startswith(PIPE):
        with _pipe(url[len(PIPE) :]) as out:
            yield out
        return
    fs = _filesystem(url)

    def opener() -> IO[bytes]:
        return fs.open(url, "rb", block_size=BLOCK_SIZE, cache_type="readahead")

    with io.BufferedReader(RetryingReader(url, opener), buffer_size=1 << 16) as f:
        yield f


@contextmanager
def _pipe(command: str) -> Iterator[BinaryIO]:
    """The standard output of ``command``; its non-zero exit status (not one from the kill that
    stops a command read only in part) raises :class:`OSError`, in place of what its short output
    made the reader raise."""
    proc = subprocess.Popen(command, shell=True, stdout=subprocess.PIPE)
    out = cast(BinaryIO, proc.stdout)
    done = False
    try:
        yield out
        for _ in iter(lambda: out.read(1 << 16), b""):  # the tar's padding: the command ends on its own
            pass
        done = True
    finally:
        if not done and proc.poll() is None:
            proc.kill()
        out.close()
        status = proc.wait()
        if status > 0:
            raise OSError(f"`{command}` exited with status {status}")
