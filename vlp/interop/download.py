"""The model zoo's downloads: the transfer (a per-read timeout and a whole-download deadline), the
check a downloaded PyTorch checkpoint passes before it enters the cache (read as a container, never
unpickled); two fetches into one cache wait for each other through :func:`vlp.locks.file_lock`.

Time limits (seconds, positive; the environment variables win over the defaults):

- ``VLP_ZOO_TIMEOUT_S`` (default :data:`TIMEOUT_S`, 60): the limit of each socket operation
  (connect, each read). A server that stops sending fails after this long.
- ``VLP_ZOO_DEADLINE_S`` (default :data:`DEADLINE_S`, 6 h): the limit of the whole download. A
  server that keeps sending a few bytes before each read times out fails once the deadline has
  passed. It is checked between reads, so it may be overshot by at most one per-read timeout.
"""

from __future__ import annotations

import io
import math
import os
import pickletools
import re
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import IO, Optional

from torch.serialization import MAGIC_NUMBER, PROTOCOL_VERSION

from vlp.errors import ConfigError
from vlp.progress import progress as progress_bar

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


def transfer(url: str, part: Path, size: Optional[int], desc: str, progress: bool) -> tuple[int, Optional[int]]:
    """Stream ``url`` into ``part`` with a byte progress bar: (bytes received, Content-Length or None).

    ``size`` (the published size, if any) only sizes the bar when the server sends no
    Content-Length. Raises :class:`TimeoutError` naming the limit when a read waits longer than
    :func:`timeout_s` or the whole transfer has taken longer than :func:`deadline_s`, and what
    ``urllib`` raises on other network failures; ``part`` is left for the caller to remove."""
    timeout, deadline = timeout_s(), deadline_s()
    end = time.monotonic() + deadline
    with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as f:
        header = resp.headers.get("Content-Length")
        length = int(header) if header else None
        bar = progress_bar(length or size or 0, desc, progress)
        bar.unit, bar.unit_scale, bar.unit_divisor = "B", True, 1024
        read = getattr(resp, "read1", resp.read)  # read1: what one socket read returns, not a full CHUNK
        got = 0
        try:
            while True:
                if time.monotonic() > end:
                    raise TimeoutError(
                        f"not complete within the deadline of {deadline:g} s ({DEADLINE_ENV}): "
                        f"{got} bytes received" + (f" of {length}" if length is not None else "")
                    )
                try:
                    chunk = read(CHUNK)
                except TimeoutError as e:
                    raise TimeoutError(
                        f"no data for {timeout:g} s ({TIMEOUT_ENV}) after {got} bytes"
                        + (f" of {length}" if length is not None else "")
                    ) from e
                if not chunk:
                    break
                f.write(chunk)
                got += len(chunk)
                bar.update(len(chunk))
        finally:
            bar.close()
    return got, length


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
