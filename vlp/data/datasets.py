"""Map-style datasets, the training sampler and the batch collator (tokenisation happens here, in
loader workers).

**Per-item seeds.** A training loader (:func:`train_loader`) samples with :class:`EpochSampler`:
per epoch a permutation of the dataset that depends on (seed, epoch) only, every index tagged with
its item seed ``seed_of("item", seed, epoch, index)`` (:class:`SeededIndex`). A dataset loads a
tagged index with Python's ``random`` and torch's CPU generator seeded from it
(:func:`seeded_rng`, which restores both afterwards), so the caption drawn, RandAugment, the crop
and flip and any bad-sample replacement of an item are the same whichever worker loads it and
whatever it loaded before: epoch ``e`` replays identically after a resume, with or without loader
workers. A plain int index loads with the global random streams, as any map-style dataset.

**Bad samples.** :func:`replace_bad` is the one policy for an item that raises a
:class:`DataError` (an image that is missing, unreadable, truncated or too large:
:class:`vlp.preprocess.images.BadImage`): propagate it (evaluation), raise it with a hint
(``data.on_bad_sample=raise``) or replace the item by another one drawn with the item's seed
(``skip``). Every item says how many bad loads it replaced (``bad_samples``) and the collators sum
them into ``batch["bad_samples"]``.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import random
import signal
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Protocol, Sequence

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler

from vlp.data.formats import Sample
from vlp.data.sample_table import SampleTable
from vlp.errors import DataError
from vlp.preprocess.device_decode import DeviceImage, collate_images
from vlp.preprocess.draft import Decoder
from vlp.preprocess.images import MAX_PIXELS, MIN_SIDE, open_image
from vlp.preprocess.transforms import tokenize

#: bad-sample policies of training data (``data.on_bad_sample``); None: evaluation, every item must load
BAD_SAMPLE_POLICIES = ("skip", "raise")
#: replacements tried for one bad sample before ``skip`` gives up
MAX_REPLACEMENTS = 100
BAD_SAMPLE_HINT = "set data.on_bad_sample=skip to replace bad samples"


class HelperFeatures(Protocol):
    """The SRCL helper's precomputed features of the samples (:class:`vlp.features.helper_cache.HelperCache`)."""

    path: Path  # the cache folder, named by errors

    @property
    def shards(self) -> Optional[list[str]]:
        """The shards the features were built from (None: annotation files)."""
        ...

    def check_covers(self, samples: Sequence[Sample]) -> None:
        """Raise :class:`DataError` if an image or caption of ``samples`` has no cached feature."""
        ...

    def lookup(self, image_key: str, caption: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The helper's features of image ``image_key`` and of ``caption``, each [E]."""
        ...


class CaptionTargets(Protocol):
    """LTD's precomputed target of every caption (:class:`vlp.features.targets.LatentTargets`)."""

    path: Path  # the targets file, named by errors

    @property
    def shards(self) -> Optional[list[str]]:
        """The shards the targets were built from (None: annotation files)."""
        ...

    def check_covers(self, samples: Sequence[Sample]) -> None:
        """Raise :class:`DataError` if a caption of ``samples`` has no target."""
        ...

    def lookup(self, caption: str) -> torch.Tensor:
        """The LTD target [D] of ``caption`` (its exact text)."""
        ...


def seed_of(*parts: Any) -> int:
    """A 64-bit seed from a tuple of ints/strings, the same in every process (no ``hash()``)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


# ----------------------------------------------------------------------------- per-item seeds


class SeededIndex(NamedTuple):
    """A dataset index with the seed of its item's randomness (what :class:`EpochSampler` yields)."""

    index: int
    seed: int


@contextmanager
def seeded_rng(seed: Optional[int]) -> Iterator[None]:
    """Python's ``random`` and torch's CPU generator seeded with ``seed`` inside the block, both
    restored afterwards (the caller's streams are untouched); ``None``: the global streams as they are.
    CUDA generators are neither seeded nor touched."""
    if seed is None:
        yield
        return
    state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        random.seed(seed)
        torch.default_generator.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(state)


def attempt_seed(seed: int, attempt: int) -> int:
    """The seed of load ``attempt`` of an item (0: the item itself; k > 0: its k-th replacement)."""
    return seed if attempt == 0 else seed_of("attempt", seed, attempt)


class EpochSampler(Sampler[SeededIndex]):
    """Indices of ``range(n)`` for one epoch, each tagged with its item seed (:class:`SeededIndex`).

    ``shuffle``: a permutation drawn with (seed, epoch); else in order. Order and seeds are
    functions of (seed, epoch) alone: :meth:`set_epoch` (the training loop calls it every epoch,
    through accelerate's prepared loader too) selects the epoch, and any epoch can be replayed in
    any order of calls. The sampler runs in the main process, so it works with persistent workers."""

    def __init__(self, n: int, seed: int, shuffle: bool = True) -> None:
        self.n, self.seed, self.shuffle, self.epoch = n, seed, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order and item seeds the next iteration yields."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[SeededIndex]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(seed_of("order", self.seed, self.epoch))
            order = torch.randperm(self.n, generator=gen).tolist()
        else:
            order = range(self.n)
        for i in order:
            yield SeededIndex(i, seed_of("item", self.seed, self.epoch, i))


class EpochLoader(DataLoader):
    """A DataLoader over an :class:`EpochSampler`; :meth:`set_epoch` selects the epoch (as accelerate's
    prepared loader does, which forwards its ``set_epoch`` to the sampler)."""

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (:meth:`EpochSampler.set_epoch` of its sampler)."""
        self.sampler.set_epoch(epoch)


def ignore_stop_signals(_worker_id: int = 0) -> None:
    """``worker_init_fn`` of training loaders: a scheduler's SIGTERM / SIGUSR1 reaches every process
    of the job, loader workers included; the training process handles it (checkpoint at the next
    step boundary) and shuts its workers down itself, so they must not die first. A worker still
    exits when its parent dies. Use it through :func:`stop_proof_workers`."""
    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, signal.SIG_IGN)


@functools.cache
def _kill_workers_at_exit() -> None:
    import multiprocessing.util  # noqa: F401  (its exit handler is registered on import: ours must come later)

    def kill() -> None:
        workers = [p for p in multiprocessing.active_children() if p.daemon]
        if workers:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler raises when a worker dies
            for p in workers:
                p.kill()
            for p in workers:
                p.join(timeout=10)

    atexit.register(kill)  # exit handlers run last-registered first: before multiprocessing's


def stop_proof_workers() -> Callable[[int], None]:
    """The ``worker_init_fn`` of a training loader (:func:`ignore_stop_signals`), set up in the
    training process. Workers that ignore SIGTERM need one more thing there: when the process ends
    with an exception before its loader shut them down, multiprocessing's exit handler sends its
    daemonic children SIGTERM and waits for them, forever. An exit handler that runs first kills
    them (SIGKILL) instead, so a failing run exits with its traceback."""
    _kill_workers_at_exit()
    return ignore_stop_signals


def train_loader(
    dataset: Dataset, batch_size: int, collate: Callable[[list], Any], num_workers: int, seed: int
) -> EpochLoader:
    """The training loader of a map-style dataset: shuffled with (seed, epoch), items seeded per
    (seed, epoch, index), fixed-size batches (the last partial one dropped when there is a full one),
    persistent workers; batches in pinned memory when a GPU is there (so the copy to it is
    asynchronous: accelerate sends them with ``non_blocking``)."""
    return EpochLoader(
        dataset,
        batch_size=batch_size,
        sampler=EpochSampler(len(dataset), seed),
        drop_last=len(dataset) >= batch_size,  # fixed-size batches
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(seed),  # workers' base seed: the caller's RNG is not drawn from
        worker_init_fn=stop_proof_workers(),
        pin_memory=torch.cuda.is_available(),
    )


# ----------------------------------------------------------------------------- bad samples


def draw_other(rng: random.Random, index: int, population: int) -> int:
    """An index of ``range(population)`` other than ``index``, uniformly (needs population >= 2)."""
    j = rng.randrange(population - 1)
    return j + (j >= index)


def replace_bad(
    load: Callable[[int, int], dict], index: int, population: int, on_bad: Optional[str], seed: int
) -> dict:
    """``load(index, 0)`` under the bad-sample policy ``on_bad`` when it raises a :class:`DataError`:

    - ``None`` (evaluation): the error propagates as it is;
    - ``"raise"``: it propagates with :data:`BAD_SAMPLE_HINT` appended;
    - ``"skip"``: ``load(j, attempt)`` for attempt = 1, 2, ... with ``j`` drawn from the other
      indices of ``range(population)`` by ``random.Random(seed_of("replace", seed))`` (a function of
      ``seed`` alone, so a resumed run replaces identically), until one loads; after
      :data:`MAX_REPLACEMENTS` bad ones, a :class:`DataError`.

    The item gets ``bad_samples``: the number of bad loads it replaced (0: the first load was good)."""
    try:
        item = load(index, 0)
        item["bad_samples"] = 0
        return item
    except DataError as e:
        if on_bad is None:
            raise
        if on_bad == "raise":
            raise DataError(f"{e}; {BAD_SAMPLE_HINT}") from None
        if on_bad != "skip":
            raise ValueError(
                f"bad-sample policy {on_bad!r}: expected one of {list(BAD_SAMPLE_POLICIES)} or None"
            ) from None
        first = e
    if population < 2:
        raise DataError(f"{first}; no other sample to replace it with (data.on_bad_sample=skip)")
    rng = random.Random(seed_of("replace", seed))
    for attempt in range(1, MAX_REPLACEMENTS + 1):
        try:
            item = load(draw_other(rng, index, population), attempt)
        except DataError:
            continue
        item["bad_samples"] = attempt
        return item
    raise DataError(
        f"{first}; and the {MAX_REPLACEMENTS} replacement samples drawn for it were bad too "
        "(data.on_bad_sample=skip): check that the data's images are readable"
    )


def count_bad(items: Sequence[dict]) -> torch.Tensor:
    """``batch["bad_samples"]``: the bad loads the items replaced, a 0-d long tensor (0 when none)."""
    return torch.tensor(sum(int(it.get("bad_samples", 0)) for it in items), dtype=torch.long)


def load_image(path: str, origin: str, max_pixels: int = MAX_PIXELS, min_side: int = MIN_SIDE) -> Image.Image:
    """Open an image as RGB (:func:`vlp.preprocess.images.open_image`); problems raise one :class:`BadImage`."""
    return open_image(path, origin, max_pixels, min_side)


class ItemDataset(Dataset, ABC):
    """A map-style dataset of image items under the bad-sample policy and per-item seeds (module doc).

    Subclasses implement :meth:`load` (one item, reading images with :meth:`image`) and ``__len__``.
    ``on_bad``: None (evaluation: every item must load), ``"raise"`` or ``"skip"``
    (``data.on_bad_sample``); ``max_pixels`` / ``min_side``: :func:`vlp.preprocess.images.open_image`."""

    def __init__(self, on_bad: Optional[str] = None, max_pixels: int = MAX_PIXELS, min_side: int = MIN_SIDE) -> None:
        if on_bad is not None and on_bad not in BAD_SAMPLE_POLICIES:
            raise ValueError(f"bad-sample policy {on_bad!r}: expected one of {list(BAD_SAMPLE_POLICIES)} or None")
        self.on_bad, self.max_pixels, self.min_side = on_bad, max_pixels, min_side

    def image(self, path: str, origin: str) -> Image.Image:
        """The image at ``path`` as RGB (:func:`load_image` with the dataset's ``max_pixels`` / ``min_side``);
        a missing, unreadable or too large image raises :class:`~vlp.errors.BadImage`, its message
        starting with ``origin``."""
        return load_image(path, origin, self.max_pixels, self.min_side)

    @abstractmethod
    def load(self, i: int) -> dict:
        """Item ``i`` (images read with :meth:`image`), under the random streams the caller set."""

    def __getitem__(self, key: int | SeededIndex) -> dict:
        """The item of ``key``: a :class:`SeededIndex` loads under its seed, an int with the global
        random streams; a bad sample follows :func:`replace_bad`."""
        index, seed = (key.index, key.seed) if isinstance(key, SeededIndex) else (int(key), None)

        def load(i: int, attempt: int) -> dict:
            with seeded_rng(None if seed is None else attempt_seed(seed, attempt)):
                return self.load(i)

        return replace_bad(load, index, len(self), self.on_bad, seed_of("index", index) if seed is None else seed)


class EntryDataset(ItemDataset):
    """An :class:`ItemDataset` of parsed annotation entries (``items``: VQA questions, NLVR2 or
    SNLI-VE items, each with its ``origin``), whose images go through ``transform`` (a PIL image ->
    [3, H, W]). Subclasses implement :meth:`load`."""

    def __init__(
        self,
        items: Sequence[Any],
        transform: Callable[[Image.Image], torch.Tensor],
        on_bad: Optional[str] = None,
        max_pixels: int = MAX_PIXELS,
        min_side: int = MIN_SIDE,
    ) -> None:
        super().__init__(on_bad, max_pixels, min_side)
        self.items, self.transform = list(items), transform

    def __len__(self) -> int:
        return len(self.items)


def pick_captions(captions: Sequence[str], k: int = 1, rng: random.Random | None = None) -> list[str]:
    """The captions of one item: k = 1 draws one at random; k > 1 gives k distinct ones while the
    image has enough (random order), cycled otherwise. ``rng`` defaults to the global ``random``."""
    r = rng or random
    if k == 1:
        return [r.choice(captions) if len(captions) > 1 else captions[0]]
    order = r.sample(list(captions), len(captions))
    return [order[i % len(order)] for i in range(k)]


def make_item(
    image: torch.Tensor | DeviceImage,
    image_id: int,
    image_key: str,
    captions: Sequence[str],
    grouped: bool,
    helper_cache: Optional[HelperFeatures] = None,
    targets: Optional[CaptionTargets] = None,
) -> dict:
    """One training item: ``image`` [3, H, W] (or, ``data.image.decode=device``, what the device
    decodes: :class:`~vlp.preprocess.device_decode.DeviceImage`), ``image_id``, ``caption`` (a string, or the list of
    captions when ``grouped``), and the helper features / LTD targets of the image and caption(s)
    when a cache / targets are given (looked up by ``image_key`` and caption text)."""
    caps = list(captions)
    item = {"image": image, "image_id": image_id, "caption": caps if grouped else caps[0]}
    if helper_cache is not None:
        item["helper_image"], item["helper_text"] = helper_cache.lookup(image_key, caps[0])
    if targets is not None:
        t = torch.stack([targets.lookup(c) for c in caps])
        item["ltd_target"] = t if grouped else t[0]
    return item


class ImageTextDataset(ItemDataset):
    """(image, caption, image id) items; a list of captions yields a random one per load.

    The samples are held as a :class:`SampleTable` (a list of samples is packed into one), so
    forked loader workers share them without copy-on-write growth; image ids are the ranks of the
    image keys in sorted order (``key_to_id``).

    ``captions_per_image`` k > 1 gives image-level items with k of the image's captions (distinct
    while it has enough, cycled otherwise). With a helper cache (:class:`HelperFeatures`), items also
    carry the frozen SRCL helper's cached features of the image and of the chosen caption
    (``helper_image``/``helper_text``); with targets (:class:`CaptionTargets`), each caption's LTD target
    (``ltd_target``). Bad samples and seeds: :class:`ItemDataset`.

    ``decode`` (``data.image.decode``): ``full``; ``draft``: JPEGs decoded at reduced scale per
    crop, ``transform`` being a training transform (:class:`vlp.preprocess.draft.Decoder`; then
    :attr:`transform` holds the steps after its crop); ``device``: items carry JPEG bytes and the
    transform's draws, decoded and augmented on the training device (:mod:`vlp.preprocess.device_decode`)."""

    def __init__(
        self,
        samples: Sequence[Sample],
        transform: Callable[[Image.Image], torch.Tensor],
        helper_cache: Optional[HelperFeatures] = None,
        targets: Optional[CaptionTargets] = None,
        captions_per_image: int = 1,
        on_bad: Optional[str] = None,
        max_pixels: int = MAX_PIXELS,
        min_side: int = MIN_SIDE,
        decode: str = "full",
    ) -> None:
        super().__init__(on_bad, max_pixels, min_side)
        self.samples = SampleTable.of(samples)  # numpy arrays: forked workers share them
        self.decoder = Decoder(transform, decode)
        self.transform = self.decoder.transform
        self.helper_cache = helper_cache
        self.targets = targets
        self.captions_per_image = captions_per_image
        for store in (helper_cache, targets):
            if store is not None:
                store.check_covers(self.samples)

    @property
    def key_to_id(self) -> Mapping[str, int]:
        """The contiguous id of each image key (its rank among the sorted keys)."""
        return self.samples.key_to_id

    def __len__(self) -> int:
        return len(self.samples)

    def image(self, path: str, origin: str) -> Image.Image:
        """What :attr:`transform` takes for the image at ``path``, as ``decode`` opens it
        (:meth:`vlp.preprocess.draft.Decoder.open`: a PIL image, or a JPEG left encoded for ``device``);
        a bad image raises :class:`~vlp.errors.BadImage`, its message starting with ``origin``."""
        return self.decoder.open(path, origin, self.max_pixels, self.min_side)

    def load(self, i: int) -> dict:
        """Sample ``i`` as a training item (:func:`make_item`): its transformed image, its image id and
        its caption(s) drawn with :func:`pick_captions`, plus helper features / LTD targets when given."""
        s = self.samples[i]
        caps = pick_captions(s.captions, self.captions_per_image)
        return make_item(
            self.transform(self.image(s.image, s.origin)),
            int(self.samples.image_ids[i]),
            s.image_key,
            caps,
            self.captions_per_image > 1,
            self.helper_cache,
            self.targets,
        )


class ImageDataset(Dataset):
    """Images only (evaluation): item = (index, tensor)."""

    def __init__(self, paths: Sequence[str], transform: Callable[[Image.Image], torch.Tensor], source: str) -> None:
        self.paths, self.transform, self.source = list(paths), transform, source

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.transform(load_image(self.paths[i], f"{self.source} entry {i}"))


class Collator:
    """Stack images (or gather them as a :class:`~vlp.preprocess.device_decode.DeviceBatch`:
    :func:`~vlp.preprocess.device_decode.collate_images`), tokenize captions (truncated at ``max_len``; ``padding``: to the batch's longest
    or always to ``max_len``, see :func:`tokenize`), ids to tensors; ``bad_samples`` (0-d long): the
    bad loads the items replaced (:func:`replace_bad`), always present.

    Image-level items (a list of k captions each) give ``input_ids`` [B*k, T] in item order and
    ``text_image_ids`` [B*k], the image id of every caption."""

    def __init__(self, tokenizer, max_len: int, padding: str = "longest") -> None:
        self.tokenizer, self.max_len, self.padding = tokenizer, max_len, padding

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        grouped = isinstance(items[0]["caption"], list)
        captions = [c for it in items for c in it["caption"]] if grouped else [it["caption"] for it in items]
        batch = tokenize(self.tokenizer, captions, self.max_len, self.padding)
        batch["images"] = collate_images([it["image"] for it in items])
        batch["image_ids"] = torch.tensor([it["image_id"] for it in items], dtype=torch.long)
        batch["bad_samples"] = count_bad(items)
        if grouped:
            batch["text_image_ids"] = batch["image_ids"].repeat_interleave(len(items[0]["caption"]))
        for key in ("helper_image", "helper_text"):
            if key in items[0]:
                batch[key] = torch.stack([it[key] for it in items])
        if "ltd_target" in items[0]:
            batch["ltd_target"] = (
                torch.cat([it["ltd_target"] for it in items])
                if grouped
                else torch.stack([it["ltd_target"] for it in items])
            )
        return batch
