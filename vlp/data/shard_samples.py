"""Shard sets as the data of the feature files (the SRCL helper cache, ``vlp cache-helper-features``,
and the LTD targets, ``vlp make-targets``), and the one rule that says whether such a file covers
the shards a run trains on.

**Rows.** A shard sample is looked up by what it carries (:class:`~vlp.data.shard_format.RawSample`
``meta``): its ``image_key`` (a vlp shard: its annotation entry's ``FILE:KEY``; an img2dataset
shard: its member key) and its caption texts, exactly what :class:`vlp.data.shards.ShardStream`
passes to ``lookup``. The feature commands read those from the tar members, streamed
(:func:`~vlp.data.shard_format.iter_shard`; a URL shard is never whole on disk), and record the
shards they read (:func:`shard_name` of each) as ``shards`` beside ``data``.

**Coverage** (:func:`check_coverage`, called by :class:`~vlp.data.shards.ShardLoader` before the
first step). Local tars: every sample's image key and captions are looked up in the file (the
tars' JSON members are read, :func:`scan_samples`). URL shards: nothing is requested; every
training shard must be among the shards the file records, else one :class:`DataError` naming the
first missing shard. A sample the file lacks although it records its shard (the shard changed
after the file was built) fails at the first batch that meets it (``ShardStream``: one
:class:`DataError` naming the shard, the sample key and the file, whatever ``data.on_bad_sample``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch.utils.data import IterableDataset, get_worker_info

from vlp.data.check import is_shard_entry
from vlp.data.datasets import CaptionTargets, HelperFeatures
from vlp.data.sample_table import SampleTable, TableBuilder
from vlp.data.shard_format import RawSample, ShardFault, ShardInfo, iter_shard
from vlp.errors import DataError
from vlp.preprocess.images import MAX_PIXELS, MIN_SIDE, MemberFile, open_image
from vlp.remote.shard_urls import is_url
from vlp.remote.url_credentials import redacted

logger = logging.getLogger(__name__)


def is_shard_data(entry: str) -> bool:
    """Whether a ``--data`` entry names shards (a folder, a brace pattern of tars, a URL entry)
    rather than an annotation file."""
    return is_url(entry) or is_shard_entry(entry)


def split_data(data: Sequence[str | Path]) -> tuple[list[str], list[str]]:
    """``--data`` as (annotation files, shard entries), each in the given order."""
    entries = [str(d) for d in data]
    shards = [e for e in entries if is_shard_data(e)]
    return [e for e in entries if e not in shards], shards


def shard_name(info: ShardInfo) -> str:
    """How a feature file records a shard: a URL as listed, a local tar by its resolved path."""
    return info.path if isinstance(info.path, str) else str(Path(info.path).resolve())


def iter_samples(shards: Sequence[ShardInfo], images: bool = True) -> Iterator[RawSample]:
    """Every readable sample of ``shards``, streamed in shard order. A malformed sample is left out
    with a note on stderr (training skips it as a bad sample, so it is never looked up); a shard
    that cannot be read to its end, or holds another count than its index, raises (a file built
    from it would record samples it lacks)."""
    for info in shards:
        errors: list[DataError] = []
        for raw in iter_shard(info, images, check_count=True, errors=errors):
            yield raw
            _note(errors)
        _note(errors)


def _note(errors: list[DataError]) -> None:
    while errors:
        e = errors.pop(0)
        if isinstance(e, ShardFault):
            raise DataError(f"{e}; a feature file is built from whole shards only")
        logger.warning(redacted(f"vlp data: left out a malformed sample: {e}"))


class ShardImages(IterableDataset):
    """``(image_key, captions as a JSON list, preprocess(image))`` of every readable sample of
    ``shards``; with loader workers, worker w of n reads shards w, w + n, ... An image that does not
    decode (:func:`~vlp.preprocess.images.open_image`'s limits) is left out with a note on stderr,
    as training skips it."""

    def __init__(
        self,
        shards: Sequence[ShardInfo],
        preprocess: Callable[..., torch.Tensor],
        max_pixels: int = MAX_PIXELS,
        min_side: int = MIN_SIDE,
    ) -> None:
        self.shards, self.preprocess = list(shards), preprocess
        self.max_pixels, self.min_side = max_pixels, min_side

    def __iter__(self) -> Iterator[tuple[str, str, torch.Tensor]]:
        info = get_worker_info()
        w, n = (info.id, info.num_workers) if info is not None else (0, 1)
        for raw in iter_samples(self.shards[w::n]):
            where = f"{raw.shard} sample {raw.key}"
            member: Any = MemberFile(raw.image, raw.member)
            try:
                image = open_image(
                    member, where, self.max_pixels, self.min_side
                )  # read as a file (its name in messages)
            except DataError as e:
                logger.warning(redacted(f"vlp data: left out a bad image: {e}"))
                continue
            yield raw.meta["image_key"], json.dumps(raw.meta["captions"]), self.preprocess(image)


def scan_samples(shards: Sequence[ShardInfo]) -> SampleTable:
    """Every shard sample as a :class:`Sample` (no image path) of a :class:`SampleTable`, reading
    only the JSON members."""
    table = TableBuilder()
    for info in shards:
        source = table.source("", f"{info.path} sample ")
        for raw in iter_shard(info, images=False, check_count=True, errors=[]):  # the unreadable need no entry
            table.add(source, "", raw.meta["captions"], raw.meta["image_key"], raw.key)
    return table.build()


def check_coverage(
    shards: Sequence[ShardInfo], helper_cache: Optional[HelperFeatures], targets: Optional[CaptionTargets]
) -> None:
    """The coverage rule (module doc): local tars checked sample by sample, URL shards by the list
    of shards each file records; one :class:`DataError` for the first file that falls short."""
    local = [s for s in shards if not isinstance(s.path, str)]
    remote = [s for s in shards if isinstance(s.path, str)]
    for what, store, command in (
        ("helper feature cache", helper_cache, "cache-helper-features"),
        ("latent targets", targets, "make-targets"),
    ):
        if store is None:
            continue
        if local:
            store.check_covers(scan_samples(local))
        if remote:
            _check_recorded(f"{what} {store.path}", store.shards, remote, command)


def _check_recorded(what: str, recorded: Optional[list[str]], remote: Sequence[ShardInfo], command: str) -> None:
    """Every URL shard of ``remote`` among the ``recorded`` shards a feature file was built from."""
    how = f"build it from the training shards: `vlp {command} --data 'URL_ENTRY' ...`"
    if recorded is None:
        raise DataError(
            f"{what} was built from annotation files, which cannot be checked against the URL shard "
            f"{remote[0].path} without reading the whole shard set; {how}"
        )
    known = set(recorded)
    missing = [s.path for s in remote if s.path not in known]
    if missing:
        raise DataError(
            f"{what} was not built from shard {missing[0]} ({len(missing)} of the {len(remote)} URL shards "
            f"trained on are not among the {len(known)} shards it records); {how}"
        )
