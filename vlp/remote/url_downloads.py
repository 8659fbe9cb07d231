"""A whole file read from a URL from a given byte to its end, for a download that continues a partial
file (the model zoo's checkpoints, :mod:`vlp.interop.zoo`): read through the same retrying reader
as URL shards (:class:`~vlp.remote.shard_urls.RetryingReader`: bounded tries with backoff and
jitter, each reopening the URL at the byte reached; a per-read and a whole-file deadline).

Each try is one request made with :mod:`urllib` (``http(s)://``, ``file://``: no extra package), every
socket operation limited to ``timeouts.read_s``. A request from byte N > 0 asks ``Range: bytes=N-``.
Its answer is used only when it is a 206 whose ``Content-Range`` starts at N and runs to the file's
end (:func:`~vlp.remote.url_bodies.check_tail_range`, the check shards' ranged reads have); a 416
whose ``Content-Range`` is ``bytes */N`` says the file is complete. A 200 (a server that ignores
``Range:``) is the whole file: it is read again from byte 0 and its first N bytes are passed over,
as :class:`~vlp.remote.url_bodies.RangeFile` does with a shard, and ``on_whole`` is told (the caller
names it once). Any other answer (a 206 for other bytes, a whole file shorter than N) is a
:class:`~vlp.remote.url_bodies.ServerFault`: named and not retried. A body that ends before the
size its answer gave raises :class:`OSError`, so the reader retries from the byte reached; a 404 is
a :class:`FileNotFoundError`, not retried.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import IO, Any, Callable, Optional, cast

from vlp.remote.shard_urls import RetryingReader
from vlp.remote.url_bodies import PIECE, ServerFault, check_tail_range, unsatisfied_size
from vlp.remote.url_deadlines import Deadline, UrlTimeouts


@dataclass
class Answer:
    """What the server said of the file so far: ``size`` (bytes; None until an answer gave it) and
    ``whole`` (whether it answered a ranged request with the whole file)."""

    size: Optional[int] = None
    whole: bool = False


class TailFile:
    """The body of ``url`` from the byte :meth:`seek` sets to the file's end, in one request made on
    the first :meth:`read` (module doc). ``answer`` records the file's size; ``on_whole(n)`` is
    called when a server answers a request from byte ``n`` > 0 with the whole file."""

    def __init__(self, url: str, read_s: float, answer: Answer, on_whole: Callable[[int], None]) -> None:
        self.url, self.read_s, self.answer, self.on_whole = url, read_s, answer, on_whole
        self.pos = 0
        self.end: Optional[int] = None  # the byte the answer's body ends at, when it said
        self.resp: Any = None
        self.done = False

    def seek(self, pos: int) -> int:
        """Start at byte ``pos`` (before the first :meth:`read`); returns ``pos``."""
        self.pos = pos
        return pos

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes from the position (b"" at the file's end); :class:`OSError` when the
        body ends before the size its answer gave."""
        if self.resp is None and not self.done:
            self._open()
        if self.done:
            return b""
        data = self._read1(n)
        if not data:
            if self.end is not None and self.pos < self.end:
                raise OSError(f"the server's answer ended at byte {self.pos} of {self.end}")
            self.done = True
            return b""
        self.pos += len(data)
        return data

    def _read1(self, n: int) -> bytes:
        read = getattr(self.resp, "read1", self.resp.read)  # read1: what one socket read returns
        return cast(bytes, read(n))

    def _open(self) -> None:
        """Send the request from the position and check its answer (module doc)."""
        headers = {"Accept-Encoding": "identity"}
        if self.pos:
            headers["Range"] = f"bytes={self.pos}-"
        try:
            self.resp = urllib.request.urlopen(urllib.request.Request(self.url, headers=headers), timeout=self.read_s)
        except urllib.error.HTTPError as e:
            e.close()
            if e.code == 404:
                raise FileNotFoundError(f"{self.url}: HTTP 404 (not found)") from None
            if e.code == 416 and self.pos and unsatisfied_size(e.headers.get("Content-Range")) == self.pos:
                self.answer.size, self.done = self.pos, True  # every byte is here already
                return
            raise
        except urllib.error.URLError as e:
            if isinstance(e.reason, FileNotFoundError):  # a file:// URL of no file
                raise FileNotFoundError(f"{self.url}: no such file") from None
            raise
        status = getattr(self.resp, "status", None) or 200  # a file:// answer has no status
        if status == 206 and self.pos:
            self.end = self.answer.size = check_tail_range(status, self.resp.headers.get("Content-Range"), self.pos)
            return
        if status != 200:
            self.close()
            raise ServerFault(f"asked for bytes {self.pos}- (to the end), the server answered {status}")
        length = self.resp.headers.get("Content-Length")
        self.end = int(length) if length else None
        self.answer.size = self.end if self.end is not None else self.answer.size
        if self.pos:
            self._pass_over()

    def _pass_over(self) -> None:
        """A whole-file answer to a request from the position: its bytes before the position read and dropped."""
        if self.end is not None and self.end < self.pos:
            self.close()
            raise ServerFault(f"the server's whole file holds {self.end} bytes, fewer than the {self.pos} asked past")
        self.answer.whole = True
        self.on_whole(self.pos)
        passed = 0
        while passed < self.pos:
            piece = self._read1(min(PIECE, self.pos - passed))
            if not piece:
                raise OSError(f"the server's answer ended at byte {passed}, before {self.pos}")
            passed += len(piece)

    def close(self) -> None:
        """Close the connection (dropped unless read to its end)."""
        if self.resp is not None:
            self.resp.close()
            self.resp = None


def open_tail(
    url: str, start: int, timeouts: UrlTimeouts, answer: Answer, on_whole: Callable[[int], None]
) -> RetryingReader:
    """The file at ``url`` from byte ``start`` to its end as a retried raw stream: each try a
    :class:`TailFile` from the byte reached, under ``timeouts`` (``read_s`` a socket operation,
    ``shard_s`` the whole file's waiting; module doc). ``answer`` records the file's size."""

    def opener(_deadline: Deadline) -> IO[bytes]:
        return cast(IO[bytes], TailFile(url, timeouts.read_s, answer, on_whole))

    return RetryingReader(url, opener, timeouts=timeouts, start=start)
