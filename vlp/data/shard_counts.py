"""A shard's listed count, one rule wherever it is listed: img2dataset's ``{name}_stats.json``
(``successes``; beside a local tar or at a URL) and vlp's scan index (``vlp data index``, or the
scan of a local folder without stats). Counts are checked at start-up, before any shard is read:

- a count is a whole number (an ``int``, not a bool) from 0 to :data:`MAX_SHARD_SAMPLES`;
  anything else is one :class:`DataError` naming the file, the shard and the count
  (:func:`checked_count`);
- a local tar's count should fit in its bytes: every sample takes at least :data:`MIN_SAMPLE_BYTES`;
  one that does not is named in a warning at start-up (:func:`warn_unfit`): the count is wrong or
  the tar was cut short, which costs its missing samples when it is read (as any truncated tar: a
  bad shard under ``data.on_bad_sample=skip``, an error under ``raise``). A URL shard's size is not
  asked for at start-up (a request per shard);
- a shard listed with 0 samples (img2dataset writes that for a shard whose every download failed)
  is left out, named in one warning line (:func:`warn_empty`).

Files holding counts are read under a byte budget: a stats file :data:`STATS_MAX_BYTES`, a scan
index :func:`index_budget` (it lists every shard's URL or path); a larger one is refused by name.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from vlp.errors import DataError
from vlp.regular_files import is_regular, open_regular

#: The largest count a shard may list: 2**24 samples (img2dataset writes 10,000 a shard by default;
#: the stride of estimated image ids, ``vlp.data.shard_format.ID_STRIDE``, is the same).
MAX_SHARD_SAMPLES = 1 << 24
#: The fewest bytes a sample takes in a tar: an image and a caption member, each a 512-byte header
#: and at least one 512-byte block of data.
MIN_SAMPLE_BYTES = 2048
#: The byte budget of a stats file: img2dataset's are a few KiB (their ``status_dict`` of download
#: errors grows with a shard's failures); more is refused unread.
STATS_MAX_BYTES = 1 << 20
#: The byte budget of a scan index per shard it lists (its URL or path, stamp and count), and in all.
INDEX_BYTES_PER_SHARD, INDEX_BASE_BYTES = 4096, 1 << 16

RULE = f"expected a whole number of samples from 0 to {MAX_SHARD_SAMPLES:,}"


def is_count(value: object) -> bool:
    """Whether ``value`` is a count the rule accepts (module doc)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SHARD_SAMPLES


def checked_count(value: object, where: str, hint: str = "") -> int:
    """``value`` when it is a count (:func:`is_count`), else one :class:`DataError`: ``where``
    (what lists it, e.g. ``"F: 'successes' (the count of T)"``), the value, the rule and ``hint``."""
    if not is_count(value):
        raise DataError(f"{where} is {value!r}, {RULE}{hint}")
    return value  # type: ignore[return-value]


def warn_unfit(count: int, where: str, tar: Path) -> None:
    """One warning line unless ``count`` samples fit in the bytes of local ``tar``
    (:data:`MIN_SAMPLE_BYTES` each)."""
    size = tar.stat().st_size
    room = size // MIN_SAMPLE_BYTES
    if count > room:
        print(
            f"vlp data: warning: {where} is {count}, but the tar's {size:,} bytes hold at most {room:,} samples "
            f"({MIN_SAMPLE_BYTES:,} bytes each at least: an image and a caption member): the count is wrong or the "
            "tar was cut short; the samples it lacks count as bad samples when it is read",
            file=sys.stderr,
            flush=True,
        )


def stats_count(data: bytes, stats: str | Path, shard: str | Path) -> int:
    """The count in the bytes of img2dataset stats file ``stats`` of ``shard`` (``successes``),
    checked by the rule; one :class:`DataError` naming the file when it is no such JSON object."""
    if len(data) > STATS_MAX_BYTES:
        raise DataError(f"{stats}: cannot read img2dataset's stats: {over_budget(STATS_MAX_BYTES)}")
    try:
        n = json.loads(data).get("successes")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, RecursionError):
        raise DataError(f"{stats}: expected img2dataset's stats, a JSON object with 'successes'") from None
    return checked_count(n, f"{stats}: 'successes' (the count of {shard})")


def over_budget(budget: int) -> str:
    """The reason of a body refused for its size."""
    return f"over its budget of {size_text(budget)}"


def size_text(n: int) -> str:
    """``n`` bytes in the largest binary unit that divides them (``1 MiB``, ``4 KiB``, ``700 B``)."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n:,} B"


def local_stats_counts(tars: Sequence[Path]) -> Optional[list[int]]:
    """Each local tar's count from its ``{name}_stats.json`` (read under :data:`STATS_MAX_BYTES`),
    checked by the rule and against the tar's bytes (:func:`warn_unfit`); None unless every tar has one."""
    counts = []
    for tar in tars:
        f = tar.with_name(tar.stem + "_stats.json")
        if not is_regular(f, "shard stats file"):
            return None
        with open_regular(f, "shard stats file") as file:
            n = stats_count(file.read(STATS_MAX_BYTES + 1), f, tar)
        warn_unfit(n, f"{f}: 'successes' (the count of {tar})", tar)
        counts.append(n)
    return counts


def index_budget(shards: int) -> int:
    """The byte budget of a scan index of ``shards`` shards."""
    return INDEX_BASE_BYTES + INDEX_BYTES_PER_SHARD * shards


def read_index(f: Path, tars: Sequence[Path | str], hint: str) -> Optional[list[int]]:
    """The counts of ``tars`` in scan index ``f``; None when there is none, or it is damaged as a
    file (not JSON, cut, for other tars, over :func:`index_budget`: it is written again). A count
    that breaks the rule is one :class:`DataError` naming the index, the shard and the count,
    ending with ``hint`` (what to do)."""
    try:
        with open_regular(f, "shard scan index") as file:
            data = file.read(index_budget(len(tars)) + 1)
        counts = json.loads(data)["counts"] if len(data) <= index_budget(len(tars)) else None
    except (OSError, DataError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, RecursionError):
        return None  # none yet, or a damaged index: (re)built
    if not isinstance(counts, list) or len(counts) != len(tars):
        return None
    for tar, n in zip(tars, counts):
        checked_count(n, f"{f}: the count of {tar}", f"; vlp's scan index is damaged: {hint}")
    return counts


def warn_empty(tar: Path | str, source: Optional[Path | str]) -> None:
    """The one line naming a shard left out because it lists no samples."""
    print(f"vlp data: warning: {tar}: {source} lists no samples; the shard is left out", file=sys.stderr, flush=True)
