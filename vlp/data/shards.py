"""Webdataset tar shards streamed as fixed-size batches: vlp's own (written once from ALBEF JSON by
``vlp make-shards``) or img2dataset's, as downloaded.

**Format** (``docs/data.md``, "Streaming shards"; the two layouts and their indexes:
:mod:`vlp.data.shard_format`). In vlp's, ``{key}.json`` = ``{"captions": [...], "image_key": ...,
"image_id": ..., "source": ...}``; ``image_id`` is the image's index in the sorted image keys of
the whole folder (as :class:`ImageTextDataset` numbers them) and ``image_key`` is the key of
:func:`vlp.data.formats.load_pairs` (helper caches are indexed by it). Shards are read with the
standard :mod:`tarfile` module (no webdataset pipeline at read time: the splitting, shuffling and
resume rules below are ours and fit in this file).

**Stream.** :class:`ShardLoader` yields collated batches; collation runs in the loader workers.
An epoch has ``N = floor(units / (batch_size * world_size))`` full batches on every rank, where a
unit is a pair (``caption_mode="expand"``) or an image (``"sample"``). Per epoch the shard list
is shuffled with (seed, epoch) and dealt to the ``world_size * workers`` readers; reader
(rank, worker) reads its shards through a shuffle buffer of raw bytes seeded with (seed, epoch,
rank, worker) and yields its quota of batches (batch ``i`` of a rank comes from worker
``i % workers``, the DataLoader's round-robin); a reader whose shards run out reads them again.
The batches of an epoch are a function of (seed, epoch, rank, world_size, workers) only, and
:meth:`ShardLoader.set_position` restarts an epoch at any batch without decoding the skipped ones.

**Bad samples.** A sample whose image does not decode, or a malformed member, follows
``data.on_bad_sample``: ``raise`` names the shard and the sample key; ``skip`` names it on stderr,
counts it once in ``batch["bad_samples"]`` and takes the reader's next unit in its place (a corrupt
shard costs its bad samples, not its batches). The units each reader took are tracked per batch
(:meth:`ShardLoader.position`, checkpointed per rank), so a resume after bad samples seeks to
the exact unit without decoding the skipped ones; so are the bad samples each reader met in the
epoch, which a reader that reads its shards again passes over uncounted, before and after a resume.
"""

from __future__ import annotations

import functools
import logging
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from vlp.config import DataConfig
from vlp.data.datasets import (
    BAD_SAMPLE_HINT,
    MAX_REPLACEMENTS,
    CaptionTargets,
    HelperFeatures,
    make_item,
    pick_captions,
    seed_of,
    seeded_rng,
    stop_proof_workers,
)
from vlp.data.json_entries import plural
from vlp.data.shard_format import ShardFault, ShardInfo, iter_shard, read_sizes
from vlp.data.shard_samples import check_coverage
from vlp.errors import DataError
from vlp.preprocess.draft import Decoder
from vlp.preprocess.images import MAX_PIXELS, MIN_SIDE, MemberFile
from vlp.remote.url_credentials import redacted
from vlp.remote.url_deadlines import UrlTimeouts

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- reading


def warn_skipped(what: str, e: BaseException) -> None:
    """``vlp data: skipped WHAT: REASON`` on stderr, credentials redacted (a backend's text may hold a URL)."""
    logger.warning(redacted(f"vlp data: skipped {what}: {e}"))


def shuffle_buffer(items: Iterable[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """Approximate shuffle with a buffer of ``size`` items: yields every item once."""
    buf: list[Any] = []
    for x in items:
        if len(buf) < size:
            buf.append(x)
            continue
        i = rng.randrange(size)
        yield buf[i]
        buf[i] = x
    rng.shuffle(buf)
    yield from buf


def _has(lookup: Callable[[], Any]) -> bool:
    """Whether a feature lookup finds its entry."""
    try:
        lookup()
    except KeyError:
        return False
    return True


def batches_per_rank(units: int, batch_size: int, world_size: int) -> int:
    """Full batches every rank yields per epoch: floor(units / (batch_size * world_size))."""
    return units // (batch_size * world_size)


def worker_batches(n_batches: int, workers: int, worker: int) -> int:
    """Batches of an epoch that come from ``worker`` (batch i from worker i % workers)."""
    return len(range(worker, n_batches, workers))


@dataclass(frozen=True)
class _Unit:
    """A shuffle-buffer entry: one pair (expand) or one image with its drawn caption(s) (sample)."""

    image_id: int
    image_key: str
    captions: tuple[str, ...]
    image: bytes  # encoded
    where: str  # "shard.tar sample KEY", for errors
    member: str  # "KEY.jpg" (or .png, ...), the image's name in the tar
    error: Optional[str] = None  # a malformed sample: its DataError, raised when it is decoded
    cost: int = 1  # the bad samples it stands for (a broken shard's: those it lost)
    fault: bool = False  # a broken shard (a ShardFault), not one bad sample


class _BadSeen(set):
    """The bad samples (their ``where``) a reader met in the epoch, each counted once; ``fresh``: those
    added since the last batch went out (the batch carries them into the loader's position)."""

    def __init__(self, already: Iterable[str] = ()) -> None:
        super().__init__(already)
        self.fresh: list[str] = []

    def add(self, where: str) -> None:
        if where not in self:
            self.fresh.append(where)
        super().add(where)


class ShardStream(IterableDataset):
    """Collated batches of one rank; the worker that runs it picks its shards (see the module doc).

    The epoch and the first batch to yield (``start``) are set by :class:`ShardLoader` before each
    pass; with W workers, DataLoader worker d plays reader ``(d + start) % W`` so the loader's
    round-robin continues the uninterrupted order from batch ``start``."""

    def __init__(
        self,
        shards: Sequence[ShardInfo],
        transform: Callable[[Image.Image], torch.Tensor],
        collator: Callable[[list[dict]], Any],
        batch_size: int,
        rank: int,
        world_size: int,
        workers: int,
        seed: int,
        buffer: int,
        caption_mode: str,
        captions_per_image: int,
        helper_cache: Optional[HelperFeatures],
        targets: Optional[CaptionTargets],
        on_bad: str = "raise",
        max_pixels: int = MAX_PIXELS,
        min_side: int = MIN_SIDE,
        decode: str = "full",
        timeouts: Optional[UrlTimeouts] = None,
    ) -> None:
        self.shards = list(shards)
        self.timeouts = timeouts  # URL shards' deadlines (data.url_read_timeout_s, data.url_shard_timeout_s)
        self.on_bad, self.max_pixels, self.min_side = on_bad, max_pixels, min_side
        self.decoder = Decoder(transform, decode)  # data.image.decode (vlp.preprocess.draft)
        self.transform, self.collator = self.decoder.transform, collator
        self.batch_size, self.rank, self.world_size, self.workers = batch_size, rank, world_size, workers
        self.seed, self.buffer, self.caption_mode, self.k = seed, buffer, caption_mode, captions_per_image
        self.helper_cache, self.targets = helper_cache, targets
        units = sum(s.pairs if caption_mode == "expand" else s.images for s in self.shards)
        self.n_batches = batches_per_rank(units, batch_size, world_size)
        self.epoch, self.start = 0, 0
        self.units_done: dict[int, int] = {}  # reader -> units taken before ``start`` (a resume's)
        self.bad_done: dict[int, list[str]] = {}  # reader -> bad samples met before ``start`` (a resume's)

    # -- plan (cheap, no I/O)

    def reader_shards(self, epoch: int, worker: int) -> list[ShardInfo]:
        """The shards reader (rank, worker) reads in ``epoch``, in order."""
        order = list(self.shards)
        random.Random(seed_of("shards", self.seed, epoch)).shuffle(order)
        readers = self.world_size * self.workers
        return order[self.rank * self.workers + worker :: readers]

    # -- the stream of one reader

    def units(self, epoch: int, worker: int) -> Iterator[_Unit]:
        """Endless shuffled units of reader (rank, worker) in ``epoch``: passes over its shards,
        each through the shuffle buffer (a pass after the first is the documented cycling fill)."""
        shards = self.reader_shards(epoch, worker)
        rng = random.Random(seed_of("reader", self.seed, epoch, self.rank, worker))
        while True:
            n = 0
            for u in shuffle_buffer(self._expand(shards, rng), self.buffer, rng):
                n += u.error is None
                yield u
            if n == 0:
                raise DataError(f"shards {[str(s.path) for s in shards]} hold no readable samples")

    def _expand(self, shards: Sequence[ShardInfo], rng: random.Random) -> Iterator[_Unit]:
        for info in shards:
            errors: list[DataError] = []
            for raw in iter_shard(info, check_count=True, errors=errors, timeouts=self.timeouts):
                yield from self._malformed(info, errors)
                caps, iid, key = raw.meta["captions"], raw.meta["image_id"] + info.id_offset, raw.meta["image_key"]
                where, member = f"{info.path} sample {raw.key}", raw.member
                if self.caption_mode == "expand":
                    for c in caps:
                        yield _Unit(iid, key, (c,), raw.image, where, member)
                else:
                    yield _Unit(iid, key, tuple(pick_captions(caps, self.k, rng)), raw.image, where, member)
            yield from self._malformed(info, errors)

    @staticmethod
    def _malformed(info: ShardInfo, errors: list[DataError]) -> Iterator[_Unit]:
        """A malformed sample (its DataError) as a unit that fails to decode: the bad-sample policy
        handles it like an image that does not decode. A broken shard (:class:`ShardFault`) is one
        such unit that costs the samples it lost, known by its shard (a reader that reads the shard
        again in the epoch passes over its fault uncounted, wherever a timeout broke it this time)."""
        while errors:
            e = errors.pop(0)
            if isinstance(e, ShardFault):
                yield _Unit(-1, "", ("",), b"", f"{info.path} (shard)", "", str(e), e.lost, True)
            else:
                yield _Unit(-1, "", ("",), b"", str(e), "", str(e))

    def reader_batches(
        self,
        epoch: int,
        worker: int,
        start: int = 0,
        units_done: Optional[int] = None,
        bad_done: Iterable[str] = (),
    ) -> Iterator[tuple[int, Any]]:
        """(batch index in the rank's epoch, collated batch) of reader ``worker`` from global batch
        ``start`` on. The skipped units are read but not decoded: ``units_done`` of them (the
        reader's position a checkpoint recorded, which counts the units its bad samples took), else
        B per skipped batch (exact when no bad sample came before); ``bad_done``: the bad samples it
        met before ``start`` (counted already). Each batch carries ``stream_position`` = (worker,
        units taken so far) and ``stream_bad``: the bad samples met while filling it."""
        W, B = self.workers, self.batch_size
        skip, quota = worker_batches(start, W, worker), worker_batches(self.n_batches, W, worker)
        units = self.units(epoch, worker)
        taken = skip * B if units_done is None else units_done
        for _ in range(taken):
            next(units)
        known_bad = _BadSeen(bad_done)
        for j in range(skip, quota):
            index = j * W + worker
            batch, taken = self.fill(epoch, index, units, taken, known_bad)
            if isinstance(batch, dict):
                batch["stream_position"] = torch.tensor([worker, taken])
                batch["stream_bad"], known_bad.fresh = known_bad.fresh, []
            yield index, batch

    def fill(self, epoch: int, index: int, units: Iterator[_Unit], taken: int, known_bad: set[str]) -> tuple[Any, int]:
        """Decode, transform and collate batch ``index`` from the reader's ``units``; returns it and
        the units taken so far. The global ``random`` and torch CPU RNGs are seeded with (seed,
        epoch, rank, batch index) for the transforms and restored afterwards, so augmentations too
        are the same after a resume (and the caller's random streams untouched). A unit that does
        not decode follows the bad-sample policy: ``raise`` stops; ``skip`` names it on stderr,
        counts it once (``known_bad``: its other captions' units are passed over) and takes the
        next unit of the stream in its place."""
        items: list[dict] = []
        bad, replaced = 0, 0  # bad samples since the last good unit (carried by the next item), bad units
        with seeded_rng(seed_of("augment", self.seed, epoch, self.rank, index)):
            while len(items) < self.batch_size:
                u = next(units)
                taken += 1
                if u.where in known_bad:
                    continue
                try:
                    image = self._image(u)
                except DataError as e:
                    if self.on_bad != "skip":
                        raise DataError(f"{e}; {BAD_SAMPLE_HINT}") from None
                    known_bad.add(u.where)
                    bad, replaced = bad + u.cost, replaced + 1
                    what = f"a bad shard ({plural(u.cost, 'bad sample')})" if u.fault else "a bad sample"
                    warn_skipped(what, e)
                    if replaced > MAX_REPLACEMENTS:
                        raise DataError(
                            f"{e}; and the {MAX_REPLACEMENTS} samples before it in this reader's stream were bad "
                            "too (data.on_bad_sample=skip): check the shards with `vlp data check`"
                        ) from None
                    continue
                item = self._item(u, image)  # a lookup miss raises: a stale feature file is no bad sample
                item["bad_samples"], bad, replaced = bad, 0, 0  # the bad samples it replaced
                items.append(item)
        return self.collator(items), taken

    def _image(self, u: _Unit) -> Any:
        """The unit's image, decoded and transformed; a bad sample raises :class:`DataError`."""
        if u.error is not None:
            raise DataError(u.error)
        return self.transform(self.decoder.open(MemberFile(u.image, u.member), u.where, self.max_pixels, self.min_side))

    def _item(self, u: _Unit, image: Any) -> dict:
        """The training item of a decoded unit, with its helper features and LTD targets; a unit a
        feature file lacks is one :class:`DataError` naming the shard, the sample key and the file."""
        try:
            return make_item(image, u.image_id, u.image_key, u.captions, self.k > 1, self.helper_cache, self.targets)
        except KeyError:
            raise DataError(f"{u.where}: {self._lacking(u)}") from None

    def _lacking(self, u: _Unit) -> str:
        """Which feature file lacks unit ``u``, and what: for the lookup-miss error."""
        cache, targets, caption = self.helper_cache, self.targets, u.captions[0]
        what, path = "latent targets", getattr(targets, "path", None)
        if cache is not None and not _has(lambda: cache.lookup(u.image_key, caption)):
            what, path = "helper feature cache", cache.path
        elif targets is not None:
            caption = next((c for c in u.captions if not _has(functools.partial(targets.lookup, c))), caption)
        return (
            f"{what} {path} has no entry for this sample (image key {u.image_key!r}, caption {caption!r}): it "
            "was built from other data; build it again from the training data (`vlp cache-helper-features` / "
            "`vlp make-targets --data ...`)"
        )

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        d, n = (info.id, info.num_workers) if info is not None else (0, 1)
        if n != self.workers:
            raise RuntimeError(f"ShardStream planned for {self.workers} workers but runs in {n}")
        worker = (d + self.start) % self.workers
        done = self.units_done.get(worker), self.bad_done.get(worker, ())
        for _, batch in self.reader_batches(self.epoch, worker, self.start, *done):
            yield batch


def _check_stream(data: DataConfig, rank: int, world_size: int) -> None:
    """What :class:`~vlp.config.DataConfig` checks only under ``data.format=webdataset``, and the rank
    within its world: each problem one :class:`DataError`."""
    if data.captions_per_image > 1 and data.caption_mode != "sample":
        raise DataError(
            f"data.captions_per_image={data.captions_per_image} needs data.caption_mode=sample (image-level items)"
        )
    if not 0 <= rank < world_size:
        raise DataError(f"expected 0 <= rank < world_size, got rank {rank} of {world_size}")


class ShardLoader:
    """Batches of one rank streamed from shard folders (vlp's or img2dataset's, or brace patterns of
    tars: :mod:`vlp.data.shard_format`; ``caption_key``: img2dataset's caption key in ``{key}.json``);
    see the module doc.

    ``len(loader)`` is the number of full batches per epoch, the same on every rank. Iterating
    yields the batches of the current epoch from the current position; :meth:`set_epoch` moves
    to another epoch (from its first batch), :meth:`set_position` to any batch of any epoch.
    Because every epoch has ``len(loader)`` batches, the position after ``b`` consumed batches is
    ``divmod(b, len(loader))``. Not to be passed to ``accelerate.prepare`` (``splits_by_rank``):
    it splits the data by rank itself and yields CPU tensors. ``data``: the run's ``data`` section,
    of which it reads ``train`` (the shard entries), ``batch_size``, ``num_workers``, ``shuffle_buffer``,
    ``caption_mode``, ``captions_per_image``, ``caption_key``, ``image.decode``
    (:class:`vlp.preprocess.draft.Decoder`), ``train_num_samples`` (the estimated counts of URL shard
    sets: :func:`vlp.data.shard_format.estimated`), ``url_read_timeout_s`` / ``url_shard_timeout_s``
    (:class:`vlp.remote.url_deadlines.UrlTimeouts`) and the bad-sample keys (``on_bad_sample``,
    ``max_image_pixels``, ``min_image_side``: module doc, "Bad samples"); ``seed``: ``train.seed``.
    ``helper_cache`` and ``targets`` are checked against the shards before the first step by the
    coverage rule of :func:`vlp.data.shard_samples.check_coverage` (a URL shard set: by the shards
    they record).
    """

    splits_by_rank = True

    def __init__(
        self,
        data: DataConfig,
        transform: Callable[[Image.Image], torch.Tensor],
        collator: Callable[[list[dict]], Any],
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        helper_cache: Optional[HelperFeatures] = None,
        targets: Optional[CaptionTargets] = None,
        verbose: bool = True,
    ) -> None:
        _check_stream(data, rank, world_size)
        d = data
        self.dirs = [str(e) for e in d.train]
        timeouts = UrlTimeouts(d.url_read_timeout_s, d.url_shard_timeout_s)
        shards = read_sizes(d.train, d.caption_key, d.on_bad_sample, d.train_num_samples, timeouts)
        self.images = sum(s.images for s in shards)
        self.pairs = sum(s.pairs for s in shards)
        self.num_workers = d.num_workers
        workers = max(1, d.num_workers)
        readers = world_size * workers
        if len(shards) < readers:
            per = -(-self.images // readers)
            raise DataError(
                f"{len(shards)} shards in {self.dirs} for world_size {world_size} x {workers} loader "
                f"workers = {readers} readers: every reader needs a shard of its own. Rewrite with "
                f"`vlp make-shards --max-per-shard {per}` or smaller, or use fewer data.num_workers"
            )
        check_coverage(shards, helper_cache, targets)  # URL shards: by the shards the files record, no request
        self.stream = ShardStream(
            shards,
            transform,
            collator,
            d.batch_size,
            rank,
            world_size,
            workers,
            seed,
            d.shuffle_buffer,
            d.caption_mode,
            d.captions_per_image,
            helper_cache,
            targets,
            d.on_bad_sample,
            d.max_image_pixels,
            d.min_image_side,
            d.image.decode,
            timeouts,
        )
        self.units = self.pairs if d.caption_mode == "expand" else self.images
        n = self.stream.n_batches
        if n == 0:
            raise DataError(
                f"{self.dirs}: {self.units} {'pairs' if d.caption_mode == 'expand' else 'images'} make no "
                f"full batch of {d.batch_size} per rank x {world_size} ranks"
            )
        self.epoch, self.batches_done = 0, 0
        self.reader_units: dict[int, int] = {}  # reader -> units it took this epoch (bad samples included)
        self.reader_bad: dict[int, list[str]] = {}  # reader -> the bad samples it met this epoch
        if verbose and rank == 0:
            self._announce(len(shards), d.caption_mode, d.captions_per_image, d.batch_size, world_size)

    def _announce(self, shards: int, caption_mode: str, captions_per_image: int, batch_size: int, world: int) -> None:
        """The one line that says what the loader reads and how much of it an epoch leaves out."""
        what = (
            "expand: one pair per caption"
            if caption_mode == "expand"
            else f"sample: {captions_per_image} random caption(s) per image and epoch"
        )
        n = self.stream.n_batches
        logger.info(
            f"vlp data: webdataset, {shards} shards, {self.images} images, {self.pairs} pairs; caption "
            f"mode {what}; {n} batches of {batch_size} per rank per epoch x {world} ranks "
            f"({self.units - n * batch_size * world} of {self.units} units left out per epoch)"
        )

    def __len__(self) -> int:
        return self.stream.n_batches

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch``; a different epoch starts at its first batch, the current one keeps its position
        (so ``set_position(e, n)`` then ``set_epoch(e)`` resumes at batch n)."""
        if epoch != self.epoch:
            self.epoch, self.batches_done, self.reader_units, self.reader_bad = epoch, 0, {}, {}

    def set_position(
        self,
        epoch: int,
        batches_done: int,
        reader_units: Optional[dict[int, int]] = None,
        reader_bad: Optional[dict[int, list[str]]] = None,
    ) -> None:
        """The next iteration yields batches ``batches_done``, ``batches_done + 1``, ... of ``epoch``.
        ``reader_units`` and ``reader_bad``: :meth:`position`'s readers of a checkpoint at that batch
        (the units each reader took, bad samples included, and the bad samples it met), which make
        the resume exact after bad samples too: the same batches, each bad sample counted once."""
        if not 0 <= batches_done <= len(self):
            raise DataError(f"resume position: batch {batches_done} of epoch {epoch}, expected 0..{len(self)}")
        self.epoch, self.batches_done = epoch, batches_done
        self.reader_units = {int(k): int(v) for k, v in (reader_units or {}).items()}
        self.reader_bad = {int(k): [str(w) for w in v] for k, v in (reader_bad or {}).items()}

    def position(self) -> dict[str, Any]:
        """Where this rank's stream is: epoch, batches done, the units each reader took and the bad
        samples it met (the part of a checkpoint that only this rank knows)."""
        return {
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "reader_units": dict(self.reader_units),
            "reader_bad": {k: list(v) for k, v in self.reader_bad.items()},
        }

    def state_dict(self) -> dict[str, Any]:
        """:meth:`position` plus the plan a resume must match (batches per epoch, seed, world size, loader
        workers, batch size), as :meth:`load_state_dict` reads it back."""
        s = self.stream
        return {
            **self.position(),
            "batches_per_epoch": len(self),
            "seed": s.seed,
            "world_size": s.world_size,
            "num_workers": s.workers,
            "batch_size": s.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position; the plan (seed, world size, workers, batch size, data) must match."""
        mine = self.state_dict()
        keys = ("batches_per_epoch", "seed", "world_size", "num_workers", "batch_size")
        diff = [k for k in keys if state.get(k) != mine[k]]
        if diff:
            raise DataError(
                "cannot resume the shard stream exactly: "
                + ", ".join(f"{k} was {state.get(k)} and is {mine[k]}" for k in diff)
            )
        self.set_position(state["epoch"], state["batches_done"], state.get("reader_units"), state.get("reader_bad"))

    def __iter__(self) -> Iterator[Any]:
        self.stream.epoch, self.stream.start = self.epoch, self.batches_done
        self.stream.units_done = dict(self.reader_units) if self.batches_done else {}
        self.stream.bad_done = {k: list(v) for k, v in self.reader_bad.items()} if self.batches_done else {}
        nw = self.num_workers
        # A private generator for the workers' base seed: the caller's torch RNG is not drawn from.
        gen = torch.Generator().manual_seed(seed_of("loader", self.stream.seed, self.epoch) % 2**63)
        loader = DataLoader(
            self.stream,
            batch_size=None,
            num_workers=nw,
            pin_memory=torch.cuda.is_available(),
            prefetch_factor=2 if nw else None,
            persistent_workers=False,
            generator=gen,
            worker_init_fn=stop_proof_workers(),
        )
        for batch in loader:
            self.batches_done += 1
            if isinstance(batch, dict) and "stream_position" in batch:
                reader, taken = batch.pop("stream_position").tolist()
                self.reader_units[int(reader)] = int(taken)
                self.reader_bad.setdefault(int(reader), []).extend(batch.pop("stream_bad", ()))
            yield batch
        if self.batches_done != len(self):
            raise RuntimeError(f"shard stream ended after {self.batches_done} of {len(self)} batches")
        self.batches_done, self.reader_units, self.reader_bad = 0, {}, {}
