"""What a shard folder holds, in the two layouts vlp reads: its index (shards and their counts) and
its samples (tar members), without decoding images.

**vlp's own** (``vlp make-shards``): ``shard-00000.tar``, ... with ``sizes.json`` =
``{"shard-00000.tar": {"images": n, "pairs": m}, ...}``; a sample is ``{key}.jpg`` and
``{key}.json`` = ``{"captions": [...], "image_key": ..., "image_id": ...}``.

**img2dataset's** (CC3M, CC12M, LAION, DataComp as downloaded): any ``*.tar`` files, a sample being
``{key}.{jpg,jpeg,png,webp}`` with its caption in ``{key}.txt`` or in a key of ``{key}.json``
(``caption_key``, default ``caption``; else vlp's ``captions`` list). No vlp file is needed in
the folder, which may be read-only: each shard's count comes from img2dataset's
``{shard}_stats.json`` (``successes``) when present, else from one scan of the tar, kept in an
index outside the data folder (:func:`index_dir`) and reused while the tars' sizes and times are
unchanged. A sample's ``image_key`` is its key, its ``image_id`` its position in the folder
(shard order, then member order): contiguous and distinct. A data entry may also be a brace
pattern of tars, ``cc12m/{00000..01242}.tar``.

**Shards by URL** (``s3://``, ``gs://``, ``http(s)://``, ``pipe:``; :mod:`vlp.remote.shard_urls`):
img2dataset's layout, one tar URL or a brace pattern of them per entry, streamed. Counts come from
the ``_stats.json`` files (fetched concurrently), else from an index written once by ``vlp data
index ENTRY`` (:func:`index_entry`), else from ``data.train_num_samples`` (:func:`estimated`);
a URL shard set is never scanned at start-up.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional, Sequence

from vlp.data.formats import caption_problem, no_words_problem
from vlp.data.json_entries import write_atomic
from vlp.data.shard_counts import local_stats_counts, read_index, read_stats, stats_url, warn_empty
from vlp.errors import DataError
from vlp.regular_files import NotRegular, is_regular, open_regular
from vlp.remote.brace_patterns import expand
from vlp.remote.shard_urls import check_reachable, is_url, open_url, shard_urls
from vlp.remote.url_credentials import redacted
from vlp.remote.url_deadlines import UrlTimeouts

logger = logging.getLogger(__name__)

SIZES_FILE = "sizes.json"
SCAN_THREADS = 16  # URL shards read at once by a scan (`vlp data index`)
ID_STRIDE = 1 << 24  # estimated counts (data.train_num_samples): shard k's image ids start at k * ID_STRIDE
SHARD_NAME = "shard-{:05d}.tar"
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
MAKE_HINT = (
    "write shards with `vlp make-shards --data ANNOTATIONS.json --out DIR`, or point data.train at "
    "img2dataset's tar folder"
)


@dataclass(frozen=True)
class ShardInfo:
    """One shard, with its counts. ``id_offset`` is added to its samples' image ids: folders after
    the first continue the numbering (vlp layout: the folder's ids; img2dataset: each shard's).
    ``path``: a local tar, or a URL (a string). ``counted``: False when ``images`` is an estimate
    (``data.train_num_samples``), which a shard's real count is not checked against."""

    path: Path | str
    images: int
    pairs: int
    id_offset: int
    layout: str = "vlp"  # vlp | img2dataset
    caption_key: str = "caption"  # img2dataset: the caption's key in {key}.json
    count_file: Optional[Path | str] = None  # img2dataset: the _stats.json or scan index ``images`` comes from
    counted: bool = True


@dataclass(frozen=True)
class RawSample:
    """One undecoded shard sample: ``meta`` has ``captions``, ``image_key`` and ``image_id`` (within
    its folder (vlp) or shard (img2dataset)); ``image`` is the encoded image, named ``member``."""

    key: str
    meta: dict[str, Any]
    image: bytes
    member: str
    shard: Path | str


class ShardFault(DataError):
    """A shard that cannot be read to its end (a truncated or empty tar) or whose sample count is not
    its index's: the message names the shard (and the member it broke in); ``lost`` is the samples
    it costs, those its index listed that could not be read (0: it holds more than listed)."""

    def __init__(self, message: str, lost: int) -> None:
        super().__init__(message)
        self.lost = lost

    def __reduce__(self) -> tuple[type[ShardFault], tuple[str, int]]:
        return type(self), (str(self), self.lost)


def read_sizes(
    dirs: Sequence[str | Path],
    caption_key: str = "caption",
    on_bad: str = "raise",
    num_samples: Optional[int] = None,
    timeouts: Optional[UrlTimeouts] = None,
) -> list[ShardInfo]:
    """The shards of ``dirs`` (shard folders, brace patterns of tars, or URL entries) in order
    (entry, then name). Image ids of entry k are offset by the images of entries 0..k-1. A
    ``*.tar`` that is not a regular file (a FIFO, a directory, ...) is refused
    (:mod:`vlp.regular_files`). ``on_bad``: when a folder without counts is scanned, a tar that
    breaks raises (``raise``) or counts the samples read before the break, the broken one
    included, with a warning (``skip``). ``num_samples`` (``data.train_num_samples``): URL
    entries only; no count is read, see :func:`estimated`. ``timeouts``: the per-read deadline of
    the requests for URL entries' counts."""
    if num_samples is not None:
        return estimated([str(d) for d in dirs], caption_key, num_samples, timeouts)
    shards: list[ShardInfo] = []
    offset = 0
    for entry in dirs:
        found = _entry_shards(str(entry), offset, caption_key, on_bad, timeouts)
        shards += found
        offset += sum(s.images for s in found)
    if not shards:
        raise DataError(f"data.train: no shard folders given ({MAKE_HINT})")
    return shards


def is_brace_pattern(entry: str) -> bool:
    """Whether a ``data.train`` entry is a brace pattern of tars (``cc12m/{00000..01242}.tar``)."""
    return "{" in entry and ".." in entry


def estimated(
    entries: list[str], caption_key: str, num_samples: int, timeouts: Optional[UrlTimeouts] = None
) -> list[ShardInfo]:
    """The shards of URL ``entries`` with ``num_samples`` (open_clip's ``--train-num-samples``)
    shared out equally as their estimated counts (the first ``num_samples % shards`` get one more):
    no count is requested, only whether each entry's first shard is there (one ``info`` request,
    so a wrong bucket or missing credentials fail at start-up: :func:`check_reachable`). The epoch
    length follows from ``num_samples``; a shard holding more or fewer samples than its share is
    read whole all the same (readers cycle their shards), and its count is not checked. Shard k's
    image ids start at ``k * ID_STRIDE`` (distinct while a shard holds fewer than 2**24 samples)."""
    local = [e for e in entries if not is_url(e)]
    if local:
        raise DataError(
            f"data.train_num_samples is for URL shard sets (s3://, gs://, http(s)://, pipe:), but data.train "
            f"entry {local[0]!r} is a local path: leave data.train_num_samples unset (local counts are read)"
        )
    per_entry = [shard_urls(e) for e in entries]
    urls = [u for us in per_entry for u in us]
    if not urls or num_samples < len(urls):
        raise DataError(
            f"data.train_num_samples={num_samples}: expected at least one sample per shard ({len(urls)} shards)"
        )
    for us in per_entry:
        check_reachable(us[0], timeouts)
    share, extra = divmod(num_samples, len(urls))
    return [
        ShardInfo(u, share + (k < extra), share + (k < extra), k * ID_STRIDE, "img2dataset", caption_key, None, False)
        for k, u in enumerate(urls)
    ]


def _entry_shards(
    entry: str, offset: int, caption_key: str, on_bad: str, timeouts: Optional[UrlTimeouts]
) -> list[ShardInfo]:
    if is_url(entry):
        return _url_shards(entry, offset, caption_key, timeouts)
    if is_brace_pattern(entry):  # a brace pattern of img2dataset tars
        tars = [Path(p) for p in expand(entry, "data.train entry")]  # counted first: a cap on its size
        missing = [str(p) for p in tars if not is_regular(p, "shard")]
        if missing:
            raise DataError(
                f"data.train entry {entry!r}: {len(missing)} of {len(tars)} tars do not exist, e.g. {missing[0]}"
            )
        return _img2dataset(tars, offset, caption_key, on_bad)
    d = Path(entry)
    if d.is_file():
        raise DataError(f"{d} is a file; data.format=webdataset expects shard folders in data.train ({MAKE_HINT})")
    if is_regular(d / SIZES_FILE, "shard index"):
        return _vlp_folder(d, offset)
    tars = [t for t in sorted(d.glob("*.tar")) if is_regular(t, "shard")] if d.is_dir() else []
    if not tars:
        raise DataError(f"{d}: no {SIZES_FILE} and no .tar files (not a shard folder); {MAKE_HINT}")
    return _img2dataset(tars, offset, caption_key, on_bad)


def _vlp_folder(d: Path, offset: int) -> list[ShardInfo]:
    f = d / SIZES_FILE
    try:
        with open_regular(f, "shard index") as file:
            sizes = json.loads(file.read())
    except json.JSONDecodeError as e:
        raise DataError(f"{f}: line {e.lineno} column {e.colno}: invalid JSON ({e.msg})") from None
    if not isinstance(sizes, dict) or not sizes:
        raise DataError(f'{f}: expected an object {{shard name: {{"images": n, "pairs": m}}}}')
    out = []
    for name in sorted(sizes):
        v = sizes[name]
        ok = isinstance(v, dict) and all(isinstance(v.get(k), int) and v[k] > 0 for k in ("images", "pairs"))
        if not ok or v["pairs"] < v["images"]:
            raise DataError(f'{f}: entry {name!r} is {v!r}, expected {{"images": n, "pairs": m}} with 0 < n <= m')
        if not is_regular(d / name, "shard"):
            raise DataError(f"{f}: shard {name} is listed but {d / name} does not exist")
        out.append(ShardInfo(d / name, v["images"], v["pairs"], offset))
    return out


def _img2dataset(tars: list[Path], offset: int, caption_key: str, on_bad: str) -> list[ShardInfo]:
    """img2dataset tars: one caption per image, so images = pairs; counts from ``_stats.json``
    or the scan index. Shards without samples are left out."""
    counts = local_stats_counts(tars)
    sources: Sequence[Path | str] = [_stats_file(t) for t in tars]
    if counts is None:
        counts = _scanned_counts(tars, caption_key, on_bad)
        sources = [_index_file(tars, caption_key)] * len(tars)
    return _counted(tars, counts, sources, offset, caption_key)


def url_shards_to_check(entry: str, caption_key: str = "caption") -> list[ShardInfo]:
    """The shards of URL ``entry`` for ``vlp data check``, which reads every shard whole: counted by
    their ``_stats.json`` files or ``vlp data index``'s index as for a run (a shard's count is then
    checked), else uncounted (``counted=False``: counted while read) instead of refused. A stats
    file or first shard that cannot be reached (no such bucket, no credentials) raises one
    :class:`DataError` naming it."""
    return _url_shards(entry, 0, caption_key, None, uncounted=True)


def _url_shards(
    entry: str, offset: int, caption_key: str, timeouts: Optional[UrlTimeouts], uncounted: bool = False
) -> list[ShardInfo]:
    """The shards of a URL entry, counted by their ``_stats.json`` files or ``vlp data index``'s
    index; without either, one :class:`DataError` saying how to count them (``uncounted``: the
    shards with no count instead)."""
    urls = shard_urls(entry)
    counts = read_stats(urls, timeouts)
    sources: Sequence[Path | str] = [stats_url(u) for u in urls]
    if counts is None:
        f = _index_file(urls, caption_key)
        counts = read_index(f, urls, f"run `vlp data index '{entry}'` again")
        sources = [f] * len(urls)
        if counts is None and uncounted:
            return [ShardInfo(u, 0, 0, offset, "img2dataset", caption_key, None, False) for u in urls]
        if counts is None:
            raise DataError(
                f"data.train entry {entry!r}: {len(urls)} shard URL(s) without img2dataset's _stats.json beside "
                f"them (e.g. {stats_url(urls[0]) if not urls[0].startswith('pipe:') else urls[0]}): count them "
                f"once with `vlp data index '{entry}'`, or set data.train_num_samples"
            )
    return _counted(urls, counts, sources, offset, caption_key)


def _counted(
    tars: Sequence[Path | str], counts: list[int], sources: Sequence[Path | str], offset: int, caption_key: str
) -> list[ShardInfo]:
    """img2dataset shards with their counts, ids continuing from ``offset``; empty ones left out,
    each named in a warning (:func:`~vlp.data.shard_counts.warn_empty`)."""
    out = []
    for tar, n, source in zip(tars, counts, sources):
        if n > 0:
            out.append(ShardInfo(tar, n, n, offset, "img2dataset", caption_key, source))
            offset += n
        else:
            warn_empty(tar, source)
    return out


def _stats_file(tar: Path) -> Path:
    """img2dataset's stats of ``tar``: ``{name}_stats.json`` beside it."""
    return tar.with_name(tar.stem + "_stats.json")


def index_dir() -> Path:
    """Where scan indexes of img2dataset folders are kept: ``$VLP_CACHE/shard_index``, else
    ``$XDG_CACHE_HOME/vlp/shard_index``, else ``~/.cache/vlp/shard_index``."""
    if os.environ.get("VLP_CACHE"):
        return Path(os.environ["VLP_CACHE"]) / "shard_index"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vlp" / "shard_index"


def _index_file(tars: Sequence[Path | str], caption_key: str) -> Path:
    """The scan index of ``tars``: in :func:`index_dir`, named by a digest of the tars' paths,
    sizes and modification times, or URLs (and ``caption_key``)."""
    digest = hashlib.sha256(json.dumps([_stamp(tars), caption_key]).encode()).hexdigest()[:32]
    return index_dir() / f"{digest}.json"


def _stamp(tars: Sequence[Path | str]) -> list[tuple[str, int, int]]:
    """Each tar's resolved path, size and modification time (what a scan index is valid for); a
    URL's stamp is the URL alone (its size and time would cost a request per shard)."""
    return [
        (t, 0, 0) if isinstance(t, str) else (str(t.resolve()), t.stat().st_size, t.stat().st_mtime_ns) for t in tars
    ]


def index_entry(entry: str, caption_key: str = "caption") -> tuple[Path, list[int]]:
    """``vlp data index``: count the shards of a URL entry in one streamed pass (images skipped)
    and keep the counts where a run finds them (:func:`index_dir`, keyed by the URLs and
    ``caption_key``); returns the index file and the counts. A shard that breaks raises."""
    if not is_url(entry):
        raise DataError(f"{entry!r}: `vlp data index` counts URL shard sets; local folders are counted at start-up")
    urls = shard_urls(entry)
    f = _index_file(urls, caption_key)
    if f.exists():
        f.unlink()  # counted again
    return f, _scanned_counts(urls, caption_key, "raise")


def _scanned_counts(tars: Sequence[Path | str], caption_key: str, on_bad: str) -> list[int]:
    """Samples per tar from one scan (captions parsed, images skipped), kept in :func:`index_dir`
    under a digest of the tars' paths, sizes and modification times. A tar that breaks raises
    (``on_bad="raise"``) or counts its samples up to the break, the broken one included, with a
    warning; an index with such a count is not kept (the next start scans again). URL shards are
    read :data:`SCAN_THREADS` at a time (a scan is mostly waiting on the store), local ones in turn;
    a progress bar shows the shards done."""
    from concurrent.futures import ThreadPoolExecutor

    from vlp.progress import progress

    f = _index_file(tars, caption_key)
    known = read_index(f, tars, "delete it (the next run counts the tars again)")
    if known is not None:
        return known
    logger.info(f"indexing {len(tars)} shard(s) without _stats.json (once; kept in {f.parent})")
    threads = SCAN_THREADS if any(isinstance(t, str) for t in tars) else 1
    counts, broken = [], False
    pool = ThreadPoolExecutor(threads)
    try:
        with progress(len(tars), "vlp data: counting shards") as bar:
            for n, fault in pool.map(lambda t: _scan_one(t, caption_key), tars):
                bar.update(1)
                if fault is not None:
                    if on_bad != "skip":
                        raise DataError(str(fault))
                    broken = True
                    kept = (
                        f"{n} samples counted (read up to the break)"
                        if n
                        else "no samples counted: the shard is left out"
                    )
                    logger.warning(redacted(f"vlp data: warning: {fault}; {kept}"))
                counts.append(n)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a shard that raised: the rest are not read
    if not broken:
        f.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(f, lambda out: out.write(json.dumps({"tars": _stamp(tars), "counts": counts})))
    return counts


def _scan_one(tar: Path | str, caption_key: str) -> tuple[int, Optional[ShardFault]]:
    """One tar's sample count from a scan (images skipped), and the fault that ended it early."""
    errors: list[DataError] = []
    n = sum(1 for _ in iter_shard(ShardInfo(tar, 0, 0, 0, "img2dataset", caption_key), False, errors=errors))
    fault = next((e for e in errors if isinstance(e, ShardFault)), None)
    n += len(errors) - (fault is not None) + (fault.lost if fault is not None else 0)
    return n, fault


def iter_shard(
    info: ShardInfo,
    images: bool = True,
    check_count: bool = False,
    errors: Optional[list[DataError]] = None,
    timeouts: Optional[UrlTimeouts] = None,
) -> Iterator[RawSample]:
    """Stream the samples of one tar (the members of a key adjacent, as webdataset writes them).

    ``images=False`` skips the image bytes (seeks over them; ``image`` is empty). ``check_count``:
    a sample count other than the index's (``info.images``) raises :class:`DataError`. A tar that
    breaks (truncated, empty, not a tar) raises :class:`DataError` naming the member it broke in.
    ``errors``: a malformed sample's :class:`DataError` is appended there and the sample left out
    (it still counts), instead of raised; so is, at the end, a broken tar's or a wrong count's
    :class:`ShardFault` (its ``lost``: the listed samples not read; a sample broken off counts).
    ``timeouts``: a URL shard's deadlines (:class:`~vlp.remote.url_deadlines.UrlTimeouts`); one
    that passes breaks the shard like a reset that retries did not mend."""
    path, walk = info.path, _Walk()
    try:
        with open_url(path, timeouts) if isinstance(path, str) else open_regular(path, "shard") as file:
            walk.size = -1 if isinstance(path, str) else os.fstat(file.fileno()).st_size  # -1: a stream's, unknown
            yield from _samples(info, file, images or walk.size < 0, errors, walk, images)
    except (tarfile.TarError, OSError, NotRegular) as e:
        cut = walk.reading or walk.end > walk.size >= 0  # the data of the last member seen was cut
        after = "after" if walk.size >= 0 else "in or after"  # a stream breaks where it is read, not where it ends
        at = f", in member {walk.member}" if cut else f", {after} member {walk.member}" if walk.member else ""
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        message = str(e) if isinstance(e, NotRegular) else f"{path}: cannot read shard: {reason}{at}"
        fault = ShardFault(message, max(info.images - walk.samples, 1 if walk.key is not None else 0))
        if errors is None:
            raise DataError(str(fault)) from None
        errors.append(fault)
        return
    if check_count and info.counted and walk.samples != info.images:
        fault = ShardFault(
            f"{path}: {walk.samples} samples, but {count_mismatch_hint(info)}", max(info.images - walk.samples, 0)
        )
        if errors is None:
            raise DataError(str(fault))
        errors.append(fault)


def count_mismatch_hint(info: ShardInfo) -> str:
    """What says the shard has ``info.images`` samples, and what to do, fitting the folder's kind:
    vlp's ``sizes.json`` (write the folder again), img2dataset's ``_stats.json`` (re-run img2dataset,
    or let vlp count the tars) or vlp's scan index of an img2dataset folder (delete it) or of a URL
    set (``vlp data index`` again: a run does not scan URL shards)."""
    n, source = info.images, info.count_file
    if info.layout == "vlp":
        return (
            f"{Path(info.path).parent / SIZES_FILE} says {n}; the folder is stale or damaged: write it again with "
            "`vlp make-shards --data ANNOTATIONS.json --out DIR`"
        )
    url = isinstance(info.path, str)
    if isinstance(source, Path) and source.parent == index_dir():
        again = (
            "run `vlp data index` on the data.train entry again"
            if url
            else "delete it (the next run counts the tars again)"
        )
        return f"vlp's scan index {source} says {n}; the tar changed after it was indexed: {again}"
    where = f"{source} says {n} (img2dataset's 'successes')" if source else f"its _stats.json says {n}"
    count = (
        "remove the set's *_stats.json files from the store and count the tars once with `vlp data index` on the "
        "data.train entry"
        if url
        else "delete the folder's *_stats.json files (vlp then counts the tars in one scan)"
    )
    return f"{where}; the tar or its stats are stale or damaged: re-run img2dataset for this shard, or {count}"


@dataclass
class _Walk:
    """How far :func:`_samples` got in a tar of ``size`` bytes: the samples completed, the current
    key, the last member seen, where its data ends and whether it was being read."""

    samples: int = 0
    key: Optional[str] = None
    member: str = ""
    end: int = 0
    reading: bool = False
    size: int = 0


def _samples(
    info: ShardInfo, file: BinaryIO, stream: bool, errors: Optional[list[DataError]], walk: _Walk, images: bool
) -> Iterator[RawSample]:
    """:func:`iter_shard`'s walk over the tar's members, recording its progress in ``walk``;
    ``stream``: read the tar in stream mode (a URL's, or when the images are read), else seek over
    the members not wanted."""
    wanted = IMAGE_EXTS + ("json", "txt")

    def sample(key: str, parts: dict[str, bytes]) -> Optional[RawSample]:
        try:
            return _raw(info, walk.samples, key, parts)
        except DataError as e:
            if errors is None:
                raise
            errors.append(e)
            return None

    with tarfile.open(fileobj=file, mode="r|" if stream else "r:") as tf:
        parts: dict[str, bytes] = {}
        for m in tf:
            walk.member, walk.end = m.name, m.offset_data + m.size
            if not m.isfile():
                continue
            k, _, ext = m.name.rpartition("/")[2].partition(".")
            if k != walk.key and walk.key is not None:
                raw = sample(walk.key, parts)
                walk.samples, parts = walk.samples + 1, {}
                if raw is not None:
                    yield raw
            walk.key, ext = k, ext.lower()
            if ext in wanted:
                walk.reading = True
                f = tf.extractfile(m)
                parts[ext] = f.read() if (images or ext not in IMAGE_EXTS) and f is not None else b""
                walk.reading = False
        if walk.key is not None:
            raw = sample(walk.key, parts)
            walk.samples, walk.key = walk.samples + 1, None
            if raw is not None:
                yield raw


def _raw(info: ShardInfo, index: int, key: str, parts: dict[str, bytes]) -> RawSample:
    path = info.path
    if info.layout == "vlp":
        if "jpg" not in parts or "json" not in parts:
            raise DataError(f"{path}: sample {key!r} has {sorted(parts)}, expected both 'jpg' and 'json'")
        meta = _json(path, key, parts["json"])
        caps = meta.get("captions")
        if not isinstance(caps, list) or not caps or not isinstance(meta.get("image_id"), int):
            raise DataError(
                f"{path}: sample {key!r}: {key}.json needs 'captions' (non-empty list), 'image_id' (int) "
                "and 'image_key' (string)"
            )
        if not isinstance(meta.get("image_key"), str):
            raise DataError(f"{path}: sample {key!r}: {key}.json needs 'image_key' (string)")
        bad = [c for c in caps if not isinstance(c, str)]
        if bad:
            raise DataError(f"{path}: sample {key!r}: {key}.json 'captions' holds {bad[0]!r}, expected caption strings")
        meta["captions"] = [_checked(path, key, f"{key}.json", c) for c in caps]
        return RawSample(key, meta, parts["jpg"], f"{key}.jpg", path)
    ext = next((e for e in IMAGE_EXTS if e in parts), None)
    if ext is None:
        raise DataError(f"{path}: sample {key!r} has {sorted(parts)}, expected an image ({', '.join(IMAGE_EXTS)})")
    captions = _captions(info, key, parts)
    return RawSample(key, {"captions": captions, "image_key": key, "image_id": index}, parts[ext], f"{key}.{ext}", path)


def _json(path: Path | str, key: str, data: bytes) -> dict:
    try:
        meta = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise DataError(f"{path}: sample {key!r}: invalid {key}.json ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path}: sample {key!r}: {key}.json is {type(meta).__name__}, expected an object")
    return meta


def _captions(info: ShardInfo, key: str, parts: dict[str, bytes]) -> list[str]:
    """An img2dataset sample's caption: ``{key}.json``'s ``caption_key`` (or vlp's ``captions``
    list), else ``{key}.txt``."""
    path = info.path
    if "json" in parts:
        meta = _json(path, key, parts["json"])
        value = meta.get(info.caption_key, meta.get("captions"))
        caps = [value] if isinstance(value, str) else value
        if isinstance(caps, list) and caps and all(isinstance(c, str) for c in caps):
            return [_checked(path, key, f"{key}.json", c) for c in caps]
        if "txt" not in parts:
            raise DataError(
                f"{path}: sample {key!r}: {key}.json has no caption under {info.caption_key!r} (data.caption_key) "
                f"or 'captions', and there is no {key}.txt"
            )
    if "txt" not in parts:
        raise DataError(f"{path}: sample {key!r} has {sorted(parts)}, expected a caption in {key}.txt or {key}.json")
    try:
        text = parts["txt"].decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: sample {key!r}: {key}.txt is not UTF-8 (byte {e.start})") from None
    return [_checked(path, key, f"{key}.txt", text)]


def _checked(path: Path | str, key: str, member: str, caption: str) -> str:
    """``caption`` if it can be trained on, else the sample's :class:`DataError`: the JSON loaders'
    :func:`caption_problem`, and the check's :func:`no_words_problem` (a caption ALBEF's cleaning
    empties would train as ``[CLS][SEP]``)."""
    problem = caption_problem(caption)
    if problem is not None:
        raise DataError(f"{path}: sample {key!r}: the caption in {member} is {problem}")
    problem = no_words_problem(caption)
    if problem is not None:
        raise DataError(f"{path}: sample {key!r}: the caption {caption[:80]!r} in {member} {problem}")
    return caption
