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

Stats files at URLs are fetched concurrently (:func:`read_stats`, through :mod:`vlp.remote`).
Files holding counts are read under a byte budget: a stats file :data:`STATS_MAX_BYTES`, a scan
index :func:`index_budget` (it lists every shard's URL or path); a larger one is refused by name.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence

from vlp.errors import DataError
from vlp.regular_files import is_regular, open_regular
from vlp.remote.shard_urls import PIPE, check_reachable, read_small
from vlp.remote.url_bodies import over_budget
from vlp.remote.url_deadlines import UrlTimeouts

logger = logging.getLogger(__name__)

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
STATS_THREADS = 64  # stats files at URLs fetched at once

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
        logger.warning(
            f"vlp data: warning: {where} is {count}, but the tar's {size:,} bytes hold at most {room:,} samples "
            f"({MIN_SAMPLE_BYTES:,} bytes each at least: an image and a caption member): the count is wrong or the "
            "tar was cut short; the samples it lacks count as bad samples when it is read"
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


def stats_url(url: str) -> str:
    """img2dataset's stats file of the tar at ``url``: ``{name}_stats.json`` beside it."""
    return url[: -len(".tar")] + "_stats.json"


def read_stats(urls: list[str], timeouts: Optional[UrlTimeouts] = None) -> Optional[list[int]]:
    """Each tar's ``successes`` from its ``_stats.json`` at its URL, fetched concurrently (nothing
    else is requested) and checked by the rule (:func:`stats_count`); None when the first tar has
    none or any is missing (``pipe:`` URLs have none). A stats file that cannot be read for another
    reason (no credentials, a server error) or does not hold a count raises one :class:`DataError`
    naming it; so does a first tar that cannot be found (no such bucket or key), asked for when its
    stats file is missing. ``timeouts``: the per-read deadline of each request (:class:`UrlTimeouts`)."""
    if not urls or any(u.startswith(PIPE) for u in urls):
        return None
    t = timeouts or UrlTimeouts()
    first = _url_stats_count(urls[0], t)
    if first is None:
        check_reachable(urls[0], t)
        return None
    with ThreadPoolExecutor(min(STATS_THREADS, len(urls))) as pool:
        rest = list(pool.map(lambda u: _url_stats_count(u, t), urls[1:]))
    if any(n is None for n in rest):
        return None
    return [first] + [n for n in rest if n is not None]


def _url_stats_count(url: str, timeouts: UrlTimeouts) -> Optional[int]:
    """The count in the stats file of the tar at ``url``, read whole within ``timeouts.read_s`` and
    :data:`STATS_MAX_BYTES`; None when it does not exist."""
    f = stats_url(url)
    data = read_small(f, STATS_MAX_BYTES, timeouts, "img2dataset's stats")
    return None if data is None else stats_count(data, f, url)


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
    logger.warning(f"vlp data: warning: {tar}: {source} lists no samples; the shard is left out")
