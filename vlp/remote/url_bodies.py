"""Bodies read from URLs, checked and bounded: what vlp accepts of a server's answer.

**A shard** (:class:`RangeFile`, for the async fsspec filesystems: http(s), s3, gs) is read in
ranged requests of :data:`BLOCK_SIZE` bytes. An answer is used only when it is a 206 whose
``Content-Range`` is exactly the range asked for (``bytes a-b/size``, the size as listed or ``*``),
and exactly that many bytes are read of it, whatever its body holds beyond. A 200 (a server that
ignores ``Range:``, as ``python -m http.server`` and many CDNs do for small files) is the whole file:
it is streamed from its start once, the bytes before the reader's position passed over (a shard is
read in order, so that happens only after a retry), never read as the block asked for. Any other
answer (a 206 for other bytes) is a :class:`ServerFault`, named and not retried: the server would
answer the same. A shard whose size is not listed (a HEAD without ``Content-Length``) is streamed
from its start too.

**Byte budgets.** A shard's body is read up to its listed size and no further (a body that goes on
past it is cut there); one of no listed size up to :data:`UNSIZED_SHARD_BYTES`, past which it is a
:class:`ServerFault`. A small body (a stats file: :func:`fetch_small`) is refused past its budget,
unread when its ``Content-Length`` says so. Memory holds at most one block of a shard.

**Time.** Every request runs under one deadline that cancels it whatever the backend retries
underneath: a shard's per-shard deadline (:class:`~vlp.remote.url_deadlines.Deadline`), a small
body's total (``seconds`` of :func:`fetch_small`). Protocols other than http(s) and s3 are read
through fsspec's ``_cat_file``: the length of each answer is checked, its bytes are not bounded
before they arrive (gcsfs asks ranges of GCS, which honours them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

from vlp.remote.url_deadlines import Deadline, is_timeout

BLOCK_SIZE = 4 << 20  # bytes of one ranged request (a reader holds one block of its shard)
#: The most bytes read of a shard whose size is not listed: 16 GiB, 30 times a LAION shard of
#: 10,000 samples (about 0.5 GB). Memory is never at stake (the body is streamed); bandwidth is.
UNSIZED_SHARD_BYTES = 16 << 30
PIECE = 1 << 20  # the most bytes asked of a streamed body at once when passing over bytes
CLOSE_S = 5.0  # the longest a connection's close may take


def over_budget(budget: int) -> str:
    """The reason of a body refused for its size."""
    return f"over its budget of {size_text(budget)}"


def size_text(n: int) -> str:
    """``n`` bytes in the largest binary unit that divides them (``1 MiB``, ``4 KiB``, ``700 B``)."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n:,} B"


class ServerFault(OSError):
    """An answer that is not what was asked for (a ranged answer for other bytes, a body past its
    budget): named, and not retried (the server would answer the same)."""


@dataclass
class Body:
    """A server's answer: its status, ``Content-Range`` and ``Content-Length`` (None when absent),
    ``read(n)`` (a coroutine: up to ``n`` bytes of the body, b"" at its end), ``close()`` (a
    coroutine, run on the filesystem's loop as every use of the connection: it drops the connection
    unless the body was read to its end), and whether ``content_range`` is the server's own
    (``checked``; else only the length of what arrives can be checked)."""

    status: int
    content_range: Optional[str]
    length: Optional[int]
    read: Callable[[int], Awaitable[bytes]]
    close: Callable[[], Awaitable[None]]
    checked: bool = True


def _identity_headers(fs: Any, ranged: Optional[tuple[int, int]]) -> tuple[dict, dict]:
    """The request options of an http(s) filesystem (its headers, auth, ...) for a GET or HEAD of a
    shard's bytes as stored (no content coding), of ``ranged`` = (start, end) when given."""
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers["Accept-Encoding"] = "identity"
    if ranged is not None:
        headers["Range"] = f"bytes={ranged[0]}-{ranged[1] - 1}"
    kw.setdefault("allow_redirects", True)
    return headers, kw


async def _http_get(fs: Any, url: str, ranged: Optional[tuple[int, int]]) -> Body:
    headers, kw = _identity_headers(fs, ranged)
    session = await fs.set_session()
    r = await session.get(fs.encode_url(url), headers=headers, **kw)
    if r.status >= 400:
        r.close()
        if r.status == 404:
            raise FileNotFoundError(url)
        r.raise_for_status()
    length = r.headers.get("Content-Length")

    async def close() -> None:
        if r.content.at_eof():
            r.release()  # read to its end: the connection goes back to the pool
        else:
            r.close()

    return Body(r.status, r.headers.get("Content-Range"), int(length) if length else None, r.content.read, close)


async def _s3_get(fs: Any, path: str, ranged: Optional[tuple[int, int]]) -> Body:
    bucket, key, version = fs.split_path(path)
    kw = {"Range": f"bytes={ranged[0]}-{ranged[1] - 1}"} if ranged is not None else {}
    if version:
        kw["VersionId"] = version
    resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
    body = resp["Body"]
    status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 206 if ranged else 200)

    async def close() -> None:
        body.close()

    return Body(status, resp.get("ContentRange"), resp.get("ContentLength"), body.read, close)


async def _other_get(fs: Any, path: str, ranged: Optional[tuple[int, int]], most: int) -> Body:
    """Another protocol's answer, through fsspec's ``_cat_file`` (buffered by the backend; a whole
    body is asked as its first ``most`` bytes)."""
    start, end = ranged if ranged is not None else (0, most)
    data = await fs._cat_file(path, start=start, end=end)
    view = memoryview(bytes(data))

    async def read(n: int) -> bytes:
        nonlocal view
        out, view = bytes(view[:n]), view[n:]
        return out

    async def close() -> None:
        pass

    return Body(206 if ranged else 200, None, len(data), read, close, checked=False)


async def get(fs: Any, path: str, ranged: Optional[tuple[int, int]] = None, most: int = 0) -> Body:
    """A GET of ``path`` (of the bytes ``ranged`` = (start, end) when given) on async filesystem
    ``fs``; a missing file raises :class:`FileNotFoundError`, an error status the backend's error.
    ``most``: protocols read through ``_cat_file`` ask a whole body as this many bytes."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("http", "https"):
        return await _http_get(fs, path, ranged)
    if protocol in ("s3", "s3a"):
        return await _s3_get(fs, path, ranged)
    return await _other_get(fs, path, ranged, most)


async def listed_size(fs: Any, path: str) -> Optional[int]:
    """The size a server lists for ``path``: an http(s) HEAD's ``Content-Length`` (None without one,
    or for a server that takes no HEAD), else the filesystem's ``info``; a missing file raises
    :class:`FileNotFoundError`."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol not in ("http", "https"):
        size = (await fs._info(path)).get("size")
        return None if size is None else int(size)
    headers, kw = _identity_headers(fs, None)
    session = await fs.set_session()
    async with session.head(fs.encode_url(path), headers=headers, **kw) as r:
        if r.status == 404:
            raise FileNotFoundError(path)
        if r.status in (405, 501):  # no HEAD here: the size comes with the body
            return None
        r.raise_for_status()
        length, coding = r.headers.get("Content-Length"), r.headers.get("Content-Encoding", "identity")
        return int(length) if length is not None and coding in ("identity", "") else None


async def read_exactly(body: Body, n: int) -> bytes:
    """Up to ``n`` bytes of ``body``: ``n`` unless it ends first."""
    out = bytearray()
    while len(out) < n:
        piece = await body.read(n - len(out))
        if not piece:
            break
        out += piece
    return bytes(out)


def fetch_small(fs: Any, path: str, budget: int, seconds: float) -> bytes:
    """The whole body of ``path`` (a stats file), read within ``seconds`` in all and refused past
    ``budget`` bytes (:class:`ServerFault`; unread when its ``Content-Length`` says so); a missing
    file raises :class:`FileNotFoundError`, a timeout the backend's or fsspec's timeout error."""
    if not getattr(fs, "async_impl", False):
        with fs.open(path, "rb") as f:
            data = f.read(budget + 1)
    else:
        import fsspec.asyn

        data = fsspec.asyn.sync(fs.loop, _read_small, fs, path, budget, timeout=seconds)
    if len(data) > budget:
        raise ServerFault(over_budget(budget))
    return data


async def _read_small(fs: Any, path: str, budget: int) -> bytes:
    body = await get(fs, path, most=budget + 1)
    try:
        if body.length is not None and body.length > budget:
            raise ServerFault(f"{over_budget(budget)} (its Content-Length is {body.length:,})")
        return await read_exactly(body, budget + 1)
    finally:
        await body.close()


_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_UNSATISFIED = re.compile(r"^bytes \*/(\d+)$")  # a 416's Content-Range: the file's size


class RangeFile:
    """A shard of an async fsspec filesystem (http(s), s3, gs) read under ``deadline`` (``seek`` then
    ``read``, as :class:`~vlp.remote.shard_urls.RetryingReader` uses it): in checked ranged requests of
    ``block`` bytes (default :data:`BLOCK_SIZE`), or streamed from its start when its server ignores
    ranges or lists no size; never past its byte budget (module doc). Each request is cancelled when
    ``deadline`` runs out, raising :class:`~vlp.remote.url_deadlines.ShardTimeout`."""

    def __init__(self, fs: Any, path: str, deadline: Deadline, block: Optional[int] = None) -> None:
        self.fs, self.path, self.deadline = fs, path, deadline
        self.block_size = block or BLOCK_SIZE
        self.pos, self.start, self.data = 0, 0, b""
        self.stream: Optional[Body] = None  # a whole-file answer being read
        self.streamed = 0  # bytes of ``stream`` read so far
        self.size: Optional[int] = self._call(listed_size, fs, path)

    def _call(self, method: Any, *args: Any) -> Any:
        import fsspec.asyn

        self.deadline.check()
        try:
            return fsspec.asyn.sync(self.fs.loop, method, *args, timeout=self.deadline.left())
        except Exception as e:
            if is_timeout(e) and self.deadline.left() <= 0:
                raise self.deadline.expired() from None
            raise

    def seek(self, pos: int) -> int:
        """Move to byte ``pos`` (read from there by the next :meth:`read`); returns ``pos``."""
        self.pos = pos
        return pos

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes from the position (b"" at the end)."""
        if self.size is not None and self.pos >= self.size:
            return b""
        if self.stream is None and self.size is not None:
            if not self.start <= self.pos < self.start + len(self.data):
                self._fetch_block()
            if self.stream is None:
                out = self.data[self.pos - self.start : self.pos - self.start + n]
                self.pos += len(out)
                return out
        return self._read_stream(n)

    def _fetch_block(self) -> None:
        """The block at the position, from a checked 206 (:func:`block`); a 200 starts the stream."""
        assert self.size is not None
        end = min(self.pos + self.block_size, self.size)
        whole, data = self._call(block, self.fs, self.path, self.pos, end, self.size)
        if whole is not None:
            self._start_stream(whole)
            return
        if len(data) < end - self.pos:  # cut short: retried from here
            raise OSError(f"the server sent {len(data)} of the {end - self.pos} bytes asked for at offset {self.pos}")
        self.start, self.data = self.pos, data

    def _start_stream(self, body: Body) -> None:
        """Read the file from a whole-file answer from now on (its length must be the listed size)."""
        if body.length is not None and self.size is not None and body.length != self.size:
            self._close(body)
            raise ServerFault(f"the server's whole-file answer holds {body.length} bytes, its listing {self.size}")
        self.stream, self.streamed, self.data = body, 0, b""

    def _read_stream(self, n: int) -> bytes:
        """Up to ``n`` bytes at the position from the whole-file stream (opened here, from the
        file's start, when the size is not listed), within the byte budget."""
        if self.stream is None:
            self._start_stream(self._call(get, self.fs, self.path, None, UNSIZED_SHARD_BYTES + 1))
        assert self.stream is not None
        while self.streamed < self.pos:  # after a retry: pass over the bytes read before
            skipped = self._call(self.stream.read, min(PIECE, self.pos - self.streamed))
            if not skipped:
                raise OSError(f"the server's answer ended at byte {self.streamed}, before {self.pos}")
            self.streamed += len(skipped)
        budget = self.size if self.size is not None else UNSIZED_SHARD_BYTES
        if self.pos >= budget:
            if self._call(self.stream.read, 1):
                raise ServerFault(
                    f"its body passed {size_text(budget)}, the budget of a shard that lists no size "
                    "(vlp.remote.url_bodies.UNSIZED_SHARD_BYTES)"
                )
            return b""
        data = self._call(self.stream.read, min(n, budget - self.pos))
        if not data and self.size is not None:
            raise OSError(f"the server's answer ended at byte {self.pos} of {self.size}")
        self.pos += len(data)
        self.streamed += len(data)
        return data

    def _close(self, body: Body) -> None:
        """Close ``body`` on the filesystem's loop (errors ignored: the connection is dropped either way)."""
        import fsspec.asyn

        try:
            fsspec.asyn.sync(self.fs.loop, body.close, timeout=CLOSE_S)
        except Exception:  # a broken or timed-out connection: nothing left to release
            pass

    def close(self) -> None:
        """Drop the block held and the stream open, if any."""
        self.data = b""
        if self.stream is not None:
            self._close(self.stream)
            self.stream = None


async def block(fs: Any, path: str, start: int, end: int, size: int) -> tuple[Optional[Body], bytes]:
    """Bytes ``start`` to ``end`` of ``path`` (of listed ``size``) in one ranged request, read only
    from a 206 whose Content-Range is exactly that range (:func:`check_range`); (the answer, b"")
    when it is a 200, the whole file, for the caller to stream. Up to ``end - start`` bytes: fewer
    when the body is cut short."""
    body = await get(fs, path, (start, end))
    if body.status == 200:
        return body, b""
    try:
        check_range(body, start, end, size)
        return None, await read_exactly(body, end - start)
    finally:
        await body.close()


def check_range(body: Body, start: int, end: int, size: int) -> None:
    """A :class:`ServerFault` unless ``body`` answers for bytes ``start`` to ``end`` of a file of
    ``size`` exactly: a 206 with that Content-Range (of total ``size`` or ``*``); a backend's
    buffered answer (not ``checked``) must have the range's length."""
    if not body.checked:
        if body.length == end - start:
            return
        raise ServerFault(f"asked for bytes {start}-{end - 1}, the backend returned {body.length} bytes")
    m = _RANGE.match(body.content_range or "")
    exact = m is not None and (int(m.group(1)), int(m.group(2)) + 1) == (start, end)
    whole = m is not None and m.group(3) in ("*", str(size))
    if body.status == 206 and exact and whole:
        return
    raise ServerFault(
        f"asked for bytes {start}-{end - 1}, the server answered {body.status} with Content-Range "
        f"{body.content_range!r}"
    )


def check_tail_range(status: int, content_range: Optional[str], start: int) -> int:
    """The file's size (bytes) from an answer to a request for its bytes from ``start`` to its end
    (``Range: bytes=start-``): a 206 whose Content-Range is ``bytes start-(size-1)/size`` (or
    ``/*``). A :class:`ServerFault` for any other answer (other bytes than those asked for)."""
    m = _RANGE.match(content_range or "")
    if status == 206 and m is not None and int(m.group(1)) == start:
        end = int(m.group(2)) + 1
        if m.group(3) == "*" or int(m.group(3)) == end:
            return end
    raise ServerFault(
        f"asked for bytes {start}- (to the end), the server answered {status} with Content-Range {content_range!r}"
    )


def unsatisfied_size(content_range: Optional[str]) -> Optional[int]:
    """The file's size a 416 (range not satisfiable) gives in its Content-Range ``bytes */size``; None without one."""
    m = _UNSATISFIED.match(content_range or "")
    return int(m.group(1)) if m is not None else None
