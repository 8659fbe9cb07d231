"""Annotation entries packed into numpy arrays, so that forked loader workers share them.

A Python list of 5.1M :class:`Sample` objects (ALBEF's 4M pretraining files) took 4.5 GB in the
training process, and every forked loader worker copied most of it over an epoch (3.9 GB each with
2 workers): reading an object writes its reference count, so the pages holding the objects are
copied on write, worker by worker (``gc.freeze()`` does not prevent that). :class:`SampleTable`
holds the same entries in a dozen numpy arrays of plain dtypes instead. Nothing in a worker ever
writes to their pages, so the workers share them with the training process (2 MB of growth per
worker at 5.1M entries: ``docs/performance.md``, "Annotation entries in memory"). Items are built
on the fly: ``table[i]`` is a :class:`Sample`.

Layout (N samples, C captions, K distinct image keys):

- strings are UTF-8 (``surrogatepass``: any Python string round-trips) in :class:`PackedStrings`,
  a uint8 buffer [bytes] and offsets [M + 1];
- ``images`` [N]: the resolved image paths;
- ``captions`` [C] with ``caption_offsets`` [N + 1]: sample i's captions are
  ``captions[caption_offsets[i]:caption_offsets[i + 1]]``;
- ``image_ids`` [N]: the contiguous id of each sample's image key, its rank among the
  distinct keys sorted as strings (the numbering vlp's shards and the loaders share);
- ``sources``: per annotation file (or shard, or list) its key prefix and origin prefix
  (``("file.json:", "file.json entry ")``), stored once; ``sample_sources`` int32 [N];
- ``keys`` [K] and ``key_sources`` int32 [K]: the distinct keys in that order, key k being
  ``sources[key_sources[k]][0] + keys[k]``;
- ``origins`` [N]: sample i's origin is ``sources[sample_sources[i]][1] + origins[i]``
  (``"file.json entry " + "12"``).

Offsets and ids are int32 where their values fit (below 2**31), else int64.
"""

from __future__ import annotations

import bisect
import operator
from array import array
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence, SupportsIndex, overload

import numpy as np

#: strings are stored as UTF-8; lone surrogates (which JSON escapes can carry) round-trip
ENCODING, ERRORS = "utf-8", "surrogatepass"


@dataclass(frozen=True)
class Sample:
    """One training item: an image, its caption(s), and a key identifying the image."""

    image: str  # resolved path
    captions: tuple[str, ...]
    image_key: str  # image_id when given, else the image path
    origin: str  # "file.json entry 12", for error messages


def _frozen(values: array | bytearray | np.ndarray, dtype: type) -> np.ndarray:
    """A read-only numpy array of a builder's buffer (a view, no copy); int64 values that fit in
    int32 are narrowed to an int32 copy (offsets and ids: half the memory)."""
    out = values if isinstance(values, np.ndarray) else np.frombuffer(values, dtype=dtype)
    if out.dtype == np.int64 and (not len(out) or (out.min() >= 0 and out.max() < 2**31)):
        out = out.astype(np.int32)
    out.flags.writeable = False
    return out


class PackedStrings(Sequence[str]):
    """M strings in one buffer: ``data`` uint8 [total UTF-8 bytes] and ``offsets`` int32 or int64 [M + 1];
    string ``i`` is ``data[offsets[i]:offsets[i + 1]]`` decoded."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray) -> None:
        if data.dtype != np.uint8 or offsets.dtype not in (np.int32, np.int64) or offsets.ndim != 1 or len(offsets) < 1:
            raise ValueError(f"expected uint8 data and integer offsets [M + 1], got {data.dtype} and {offsets.dtype}")
        self.data, self.offsets = data, offsets

    @classmethod
    def of(cls, strings: Iterable[str]) -> PackedStrings:
        """Pack ``strings`` (one pass, no list of them kept)."""
        b = PackedBuilder()
        for s in strings:
            b.add(s)
        return b.build()

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: SupportsIndex) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: SupportsIndex | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        j = _index(i, len(self))
        return self.data[self.offsets[j] : self.offsets[j + 1]].tobytes().decode(ENCODING, ERRORS)

    def encoded(self, chunk: int = 1 << 16) -> Iterator[bytes]:
        """Each string's UTF-8 bytes in order, without decoding (``chunk`` strings per copy out of the buffer)."""
        o = self.offsets
        for a in range(0, len(self), chunk):
            b = min(a + chunk, len(self))
            base, ends = int(o[a]), o[a : b + 1].tolist()
            buf = self.data[base : ends[-1]].tobytes()
            yield from (buf[x - base : y - base] for x, y in zip(ends, ends[1:]))

    @property
    def nbytes(self) -> int:
        """Bytes held by ``data`` and ``offsets`` together."""
        return self.data.nbytes + self.offsets.nbytes


class PackedBuilder:
    """Appends strings to a growing byte buffer and end offsets; :meth:`build` freezes them."""

    def __init__(self) -> None:
        self.data, self.offsets = bytearray(), array("q", [0])

    def add(self, s: str) -> None:
        """Append ``s`` (UTF-8 encoded) and its end offset."""
        self.data += s.encode(ENCODING, ERRORS)
        self.offsets.append(len(self.data))

    def build(self) -> PackedStrings:
        """The strings added so far as a :class:`PackedStrings` of read-only views of the buffers (no copy;
        offsets that fit are narrowed to int32)."""
        return PackedStrings(_frozen(self.data, np.uint8), _frozen(self.offsets, np.int64))


def _index(i: SupportsIndex, n: int) -> int:
    """``i`` as a position in ``range(n)`` (negative counts from the end); IndexError outside."""
    j = operator.index(i)
    j = j + n if j < 0 else j
    if not 0 <= j < n:
        raise IndexError(f"index {operator.index(i)} out of range for {n} samples")
    return j


class SampleTable(Sequence[Sample]):
    """The samples of annotation files or shards, packed in numpy arrays (module doc); a
    ``Sequence[Sample]`` equal to the list of its samples. Build one with :class:`TableBuilder`
    or :meth:`of`."""

    def __init__(
        self,
        images: PackedStrings,
        captions: PackedStrings,
        caption_offsets: np.ndarray,
        image_ids: np.ndarray,
        keys: PackedStrings,
        key_sources: np.ndarray,
        sample_sources: np.ndarray,
        origins: PackedStrings,
        sources: tuple[tuple[str, str], ...],
    ) -> None:
        n = len(images)
        shapes = (len(caption_offsets) - 1, len(image_ids), len(sample_sources), len(origins))
        if shapes != (n,) * 4 or len(key_sources) != len(keys):
            raise ValueError(f"columns of {n} samples do not match: {shapes}, {len(keys)} keys")
        self.images, self.captions, self.caption_offsets = images, captions, caption_offsets
        self.image_ids, self.keys, self.key_sources = image_ids, keys, key_sources
        self.sample_sources, self.origins, self.sources = sample_sources, origins, sources

    @classmethod
    def of(cls, samples: Iterable[Sample]) -> SampleTable:
        """``samples`` as a table (a table is returned as it is)."""
        if isinstance(samples, SampleTable):
            return samples
        b = TableBuilder()
        source = b.source("", "")
        for s in samples:
            b.add(source, s.image, s.captions, s.image_key, s.origin)
        return b.build()

    def __len__(self) -> int:
        return len(self.images)

    @overload
    def __getitem__(self, i: SupportsIndex) -> Sample: ...

    @overload
    def __getitem__(self, i: slice) -> list[Sample]: ...

    def __getitem__(self, i: SupportsIndex | slice) -> Sample | list[Sample]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        j = _index(i, len(self))
        c0, c1 = self.caption_offsets[j], self.caption_offsets[j + 1]
        return Sample(
            self.images[j],
            tuple(self.captions[c] for c in range(c0, c1)),
            self.key(int(self.image_ids[j])),
            self.sources[self.sample_sources[j]][1] + self.origins[j],
        )

    def __iter__(self) -> Iterator[Sample]:
        return (self[j] for j in range(len(self)))

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence (a list, a table) of the same samples in the same order."""
        if not isinstance(other, (SampleTable, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # compared by value, like a list

    def __repr__(self) -> str:
        return f"SampleTable({len(self)} samples, {self.num_images} images, {self.nbytes / 2**20:.1f} MiB)"

    def key(self, image_id: int) -> str:
        """The image key of ``image_id`` (0 <= image_id < :attr:`num_images`)."""
        return self.sources[self.key_sources[image_id]][0] + self.keys[image_id]

    def encoded_keys(self) -> Iterator[bytes]:
        """The distinct image keys' UTF-8 in id order (:meth:`key` of each, encoded), from the buffers."""
        prefixes = [p.encode(ENCODING, ERRORS) for p, _ in self.sources]
        return (prefixes[s] + b for s, b in zip(self.key_sources.tolist(), self.keys.encoded()))

    @property
    def num_images(self) -> int:
        """Distinct image keys K."""
        return len(self.keys)

    @property
    def key_to_id(self) -> Mapping[str, int]:
        """The image id of each distinct image key, as a read-only mapping (binary search over the
        sorted keys; no dict of K entries)."""
        return ImageIds(self)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array the table holds, by name (what forked workers share)."""
        packed = {"images": self.images, "captions": self.captions, "keys": self.keys, "origins": self.origins}
        out = {f"{name}.{part}": getattr(p, part) for name, p in packed.items() for part in ("data", "offsets")}
        return {
            **out,
            "caption_offsets": self.caption_offsets,
            "image_ids": self.image_ids,
            "key_sources": self.key_sources,
            "sample_sources": self.sample_sources,
        }

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays."""
        return sum(a.nbytes for a in self.arrays().values())


class ImageIds(Mapping[str, int]):
    """``key -> image id`` of a :class:`SampleTable` (its ``key_to_id``): ids are positions in the
    sorted distinct keys, so a lookup is a binary search."""

    def __init__(self, table: SampleTable) -> None:
        self.sorted = _Keys(table)

    def __getitem__(self, key: str) -> int:
        k = bisect.bisect_left(self.sorted, key)
        if k == len(self.sorted) or self.sorted[k] != key:
            raise KeyError(key)
        return k

    def __len__(self) -> int:
        return len(self.sorted)

    def __iter__(self) -> Iterator[str]:
        return iter(self.sorted)


class _Keys(Sequence[str]):
    """The sorted distinct image keys of a table, as full strings."""

    def __init__(self, table: SampleTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return self.table.num_images

    def __getitem__(self, k: Any) -> Any:
        return self.table.key(_index(k, len(self)))


class TableBuilder:
    """Builds a :class:`SampleTable` one sample at a time, streaming into byte buffers and int
    arrays. Each sample names its source (:meth:`source`: the key prefix and origin prefix its
    annotation file shares, stored once). While building, a dict maps each distinct key to its
    first-seen number; :meth:`build` sorts the distinct keys once and drops the dict."""

    def __init__(self) -> None:
        self.images, self.captions, self.origins = PackedBuilder(), PackedBuilder(), PackedBuilder()
        self.caption_offsets = array("q", [0])
        self.first_ids = array("q")  # [N] first-seen number of each sample's key
        self.sample_sources = array("i")  # [N]
        self.sources: dict[tuple[str, str], int] = {}
        self.key_prefixes: list[str] = []  # per source
        self.seen: dict[str, int] = {}  # full key -> its first-seen number
        self.seen_sources = array("i")  # [K] the source of each key, in first-seen order
        self.n_captions = 0

    def source(self, key_prefix: str, origin_prefix: str) -> int:
        """The id of the source whose samples' image keys start with ``key_prefix`` and origins
        with ``origin_prefix`` (``"file.json:"``, ``"file.json entry "``)."""
        if (key_prefix, origin_prefix) not in self.sources:
            self.sources[key_prefix, origin_prefix] = len(self.sources)
            self.key_prefixes.append(key_prefix)
        return self.sources[key_prefix, origin_prefix]

    def add(self, source: int, image: str, captions: Sequence[str], key: str, origin: str) -> None:
        """One sample of ``source``: its resolved image path, captions, and the rest of its image
        key and origin after the source's prefixes."""
        self.images.add(image)
        for c in captions:
            self.captions.add(c)
        self.n_captions += len(captions)
        self.caption_offsets.append(self.n_captions)
        full = self.key_prefixes[source] + key
        first = self.seen.get(full)
        if first is None:
            first = self.seen[full] = len(self.seen)
            self.seen_sources.append(source)
        self.first_ids.append(first)
        self.sample_sources.append(source)
        self.origins.add(origin)

    def __len__(self) -> int:
        return len(self.first_ids)

    def build(self) -> SampleTable:
        """The table; the builder is spent (its buffers now back the table's arrays)."""
        full = list(self.seen)
        self.seen.clear()
        order = np.array(sorted(range(len(full)), key=full.__getitem__), dtype=np.int64)  # [K] first-seen numbers
        rank = np.empty(len(full), dtype=np.int64)
        rank[order] = np.arange(len(full), dtype=np.int64)
        key_sources = np.frombuffer(self.seen_sources, dtype=np.int32)[order]
        cut = [len(p) for p in self.key_prefixes]
        keys = PackedStrings.of(full[k][cut[s] :] for k, s in zip(order.tolist(), key_sources.tolist()))
        del full
        image_ids = _frozen(rank[np.frombuffer(self.first_ids, dtype=np.int64)], np.int64)
        key_sources.flags.writeable = False
        return SampleTable(
            self.images.build(),
            self.captions.build(),
            _frozen(self.caption_offsets, np.int64),
            image_ids,
            keys,
            key_sources,
            _frozen(self.sample_sources, np.int32),
            self.origins.build(),
            tuple(self.sources),
        )
