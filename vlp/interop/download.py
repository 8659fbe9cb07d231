"""The model zoo's downloads: the transfer into a partial file, continued from the byte it reached
(after a dropped connection within the command, or by the next command), the check a downloaded
PyTorch checkpoint passes before it enters the cache (read as a container, never unpickled); two
fetches into one cache wait for each other through :func:`vlp.locks.file_lock`.

The transfer reads through the retrying reader URL shards use
(:func:`vlp.remote.url_downloads.open_tail`): a failed read is retried from the byte reached with
``Range: bytes=N-`` (:data:`vlp.remote.shard_urls.RETRIES` tries after the first, backoff from
:data:`~vlp.remote.shard_urls.BACKOFF_S` doubled each try), only a 206 starting at N is taken, and
a server that ignores ranges sends the whole file again, whose first N bytes are passed over.

Time limits (seconds, positive; the environment variables win over the defaults):

- ``VLP_ZOO_TIMEOUT_S`` (default :data:`TIMEOUT_S`, 60): the limit of each socket operation
  (connect, each read). A server that stops sending fails that try after this long.
- ``VLP_ZOO_DEADLINE_S`` (default :data:`DEADLINE_S`, 6 h): the limit of the whole download's
  waiting for bytes in one command (tries and backoff included, writing the file not). A server
  that keeps sending a few bytes before each read times out fails once the deadline has passed. It
  is checked between reads, so it may be overshot by at most one per-read timeout.
"""

from __future__ import annotations

import io
import math
import os
import pickletools
import re
import zipfile
from contextlib import closing
from pathlib import Path
from typing import IO, Callable, Optional

from torch.serialization import MAGIC_NUMBER, PROTOCOL_VERSION

from vlp.errors import ConfigError
from vlp.progress import progress as progress_bar
from vlp.remote.shard_urls import RetryingReader
from vlp.remote.url_bodies import ServerFault
from vlp.remote.url_deadlines import ShardTimeout, UrlTimeouts
from vlp.remote.url_downloads import Answer, open_tail

TIMEOUT_S = 60.0  # per socket operation (connect, each read), not for the whole file
DEADLINE_S = 6 * 3600.0  # the whole download: about 1.3 Mbit/s for the 3.25 GiB ALBEF.pth
TIMEOUT_ENV, DEADLINE_ENV = "VLP_ZOO_TIMEOUT_S", "VLP_ZOO_DEADLINE_S"
CHUNK = 1 << 20
#: the first bytes of a zip archive (a local file header): torch.save's format since PyTorch 1.6
ZIP_MAGIC = b"PK\x03\x04"
#: the pickle opcodes that hold an integer (what the legacy header's two pickles are)
_INT_OPS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"}


def _seconds(env: str, default: float) -> float:
    """``$env`` as a positive, finite number of seconds, else ``default``; :class:`ConfigError` if malformed."""
    raw = os.environ.get(env)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{env}={raw}: expected a positive number of seconds (default {default:g})")
    return value


def timeout_s() -> float:
    """The per-read timeout: ``$VLP_ZOO_TIMEOUT_S``, else :data:`TIMEOUT_S`."""
    return _seconds(TIMEOUT_ENV, TIMEOUT_S)


def deadline_s() -> float:
    """The whole-download deadline: ``$VLP_ZOO_DEADLINE_S``, else :data:`DEADLINE_S`."""
    return _seconds(DEADLINE_ENV, DEADLINE_S)


class TransferError(Exception):
    """A download that failed: the network (after the reader's tries), the deadline, or a server's
    answer for other bytes than those asked for. ``continuable``: whether the partial file may be
    continued by the next try (False: its bytes do not fit what the server now answers)."""

    def __init__(self, message: str, continuable: bool = True) -> None:
        super().__init__(message)
        self.continuable = continuable


def transfer(
    url: str, part: Path, size: Optional[int], desc: str, progress: bool, on_whole: Callable[[int], None]
) -> tuple[int, Optional[int]]:
    """Download ``url`` into ``part``, continuing from the bytes ``part`` holds already (a dropped
    connection or an earlier, stopped command): (the bytes ``part`` holds, the file's size as the
    server gave it or None). Read through :func:`vlp.remote.url_downloads.open_tail`: a request from
    byte N asks ``Range: bytes=N-`` and takes only a 206 that starts there (a server that ignores
    ranges sends the whole file, whose first N bytes are passed over: ``on_whole(N)``); a failed read
    is retried from the byte reached (:class:`~vlp.remote.shard_urls.RetryingReader`: its tries and
    backoff), each socket operation within :func:`timeout_s` and the whole download's waiting
    within :func:`deadline_s`. A byte progress bar (``size``, the published size, sizes it until the
    server gives one). Raises :class:`TransferError`; ``part`` keeps what arrived."""
    timeouts = UrlTimeouts(read_s=timeout_s(), shard_s=deadline_s())
    start = part.stat().st_size if part.is_file() else 0
    answer = Answer()
    bar = progress_bar(size or 0, desc, progress, initial=start)
    bar.unit, bar.unit_scale, bar.unit_divisor = "B", True, 1024
    buffer, got = bytearray(CHUNK), start
    try:
        with open(part, "ab") as f, closing(open_tail(url, start, timeouts, answer, on_whole)) as reader:
            while True:
                n = _read(reader, buffer, got, answer)
                if answer.size is not None and bar.total != answer.size:
                    bar.total = answer.size
                    bar.refresh()
                if not n:
                    break
                f.write(memoryview(buffer)[:n])
                got += n
                bar.update(n)
    finally:
        bar.close()
    return got, answer.size


def _read(reader: RetryingReader, buffer: bytearray, got: int, answer: Answer) -> int:
    """The next bytes of the download into ``buffer`` (how many; 0 at its end); a failure as
    :class:`TransferError` saying how far it came (``got`` bytes)."""
    so_far = f"{got} bytes received" + (f" of {answer.size}" if answer.size is not None else "")
    try:
        return reader.readinto(buffer)
    except ShardTimeout:
        raise TransferError(
            f"not complete within the deadline of {deadline_s():g} s ({DEADLINE_ENV}): {so_far}"
        ) from None
    except OSError as e:  # the reader's tries spent, a missing file, or an answer for other bytes
        limit = f"{TIMEOUT_ENV}={timeout_s():g} s a read"
        refused = isinstance(e, ServerFault) or isinstance(e.__context__, ServerFault)  # the reader's final error
        raise TransferError(f"{e}; {so_far}; {limit}", continuable=not refused) from e


def torch_file_problem(path: Path) -> Optional[str]:
    """What keeps ``path`` from being a PyTorch checkpoint file (None: it is one), read as a
    container and never unpickled:

    - a zip archive (``torch.save``'s format since PyTorch 1.6) must have an intact central
      directory, a ``<folder>/data.pkl`` member and every member matching its CRC-32. That reads
      the whole file once (about 3 GiB for ALBEF.pth): the price of catching a cut-off or damaged
      download before it is cached;
    - a legacy ``torch.save`` file (``_use_new_zipfile_serialization=False``) must start with the
      two pickled integers ``torch.serialization`` writes first, its magic number and protocol
      version (parsed by opcode with :mod:`pickletools`; nothing is constructed), in pickle
      protocol 2 or later (``torch.save``'s default is 2). Only the header can be checked: a legacy
      file cut off later passes, and is caught by the Content-Length or a published size alone.

    Anything else (an HTML error page served with status 200, an empty file, another pickle) is
    refused with its first bytes quoted."""
    with open(path, "rb") as f:
        head = f.read(64)
    if not head:
        return "empty file (0 bytes); expected a PyTorch checkpoint"
    if head.startswith(ZIP_MAGIC):
        return _zip_problem(path)
    if head.startswith(b"\x80"):  # pickle's PROTO opcode: the legacy format
        return _legacy_problem(head)
    return (
        f"not a PyTorch checkpoint (starts with {ascii(head[:24].decode('latin-1'))}...); expected a "
        "torch.save zip archive (starting 'PK') or a legacy torch.save pickle"
    )


def _zip_problem(path: Path) -> Optional[str]:
    """What is wrong with a zip archive meant to be a ``torch.save`` file (see :func:`torch_file_problem`)."""
    try:
        with zipfile.ZipFile(path) as z:
            if not any(re.fullmatch(r"[^/]+/data\.pkl", name) for name in z.namelist()):
                return f"a zip archive but not a torch.save archive (no <folder>/data.pkl among {z.namelist()[:5]})"
            bad = z.testzip()
    except zipfile.BadZipFile as e:
        if "not a zip file" in str(e):  # no end-of-central-directory record: the end is missing
            return f"truncated zip: no central directory at its end ({e}); expected a complete torch.save archive"
        return f"damaged zip ({e}); expected a complete torch.save archive"
    except (OSError, EOFError) as e:  # a member's data cut off or unreadable
        return f"damaged zip ({e}); expected a complete torch.save archive"
    if bad is not None:
        return f"damaged zip: member {bad} fails its CRC-32; expected a complete torch.save archive"
    return None


def _legacy_problem(head: bytes) -> Optional[str]:
    """What is wrong with the header of a legacy ``torch.save`` file (its first bytes ``head``)."""
    stream = io.BytesIO(head)
    magic = _pickled_int(stream)
    if magic != MAGIC_NUMBER:
        found = "another pickle" if magic is None else f"magic number {magic:#x}"
        return f"a pickle but not a legacy torch.save file ({found}, expected the magic number {MAGIC_NUMBER:#x})"
    version = _pickled_int(stream)
    if version != PROTOCOL_VERSION:
        return (
            f"a legacy torch.save file of protocol version {version}, expected {PROTOCOL_VERSION} "
            "(what torch.load reads)"
        )
    return None


def _pickled_int(stream: IO[bytes]) -> Optional[int]:
    """The integer that the next pickle in ``stream`` consists of, read opcode by opcode; None if it
    is anything else or cut off."""
    values = []
    try:
        for op, arg, _ in pickletools.genops(stream):
            if op.name in ("PROTO", "FRAME", "STOP"):
                continue
            values.append(arg if op.name in _INT_OPS and isinstance(arg, int) else None)
    except ValueError:  # cut off (the header is read from the first bytes only) or not a pickle
        return None
    return values[0] if len(values) == 1 else None
