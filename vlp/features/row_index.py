"""Row indexes of feature files in sorted numpy arrays, so that forked loader workers share them.

A feature file's rows are found by key: an SRCL helper cache's by image key and caption text, LTD
targets' by a caption's 64-bit key. A Python dict of those keys (5.1M captions at ALBEF 4M scale)
is copied by every forked loader worker as it reads it: reading an object writes its reference
count (the same cause as for annotation entries, :mod:`vlp.data.sample_table`). These indexes hold
plain numpy arrays instead, which the workers read without writing:

- :class:`KeyRows` (``int -> row``): the keys [N] int64 sorted, with the row of each [N]; a lookup
  is a binary search (``np.searchsorted``);
- :class:`StringRows` (``str -> row``): the strings themselves, packed
  (:class:`~vlp.data.sample_table.PackedStrings`), and a :class:`KeyRows` of their 64-bit keys
  (:mod:`vlp.features.packed_keys`, computed by numpy over the packed bytes); a
  lookup finds the rows with the string's key and compares the stored string, so it is exact even
  where two strings share a key.

LTD targets files store :func:`string_key` (BLAKE2b) keys of their captions.

Both are read-only ``Mapping``s equal to the dict of their rows; iteration is in row order.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

from vlp.data.sample_table import ENCODING, ERRORS, PackedStrings, Sample, SampleTable
from vlp.features import packed_keys as keys64
from vlp.features.packed_keys import chunks, prefixed, string_words


def bytes_key(data: bytes) -> int:
    """Stable signed 64-bit key of a byte string (BLAKE2b)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def string_key(text: str) -> int:
    """Stable signed 64-bit key of a string's exact text: :func:`bytes_key` of its UTF-8
    (``surrogatepass``, as :class:`PackedStrings` stores it)."""
    return bytes_key(text.encode(ENCODING, ERRORS))


def bytes_keys(strings: PackedStrings) -> np.ndarray:
    """[M] int64: :func:`bytes_key` of each of ``strings`` (one BLAKE2b call each)."""
    digest, out = functools.partial(hashlib.blake2b, digest_size=8), bytearray()
    for part in chunks(strings):
        buf, ends = part.data.tobytes(), part.offsets.tolist()
        out += b"".join([digest(buf[x:y]).digest() for x, y in zip(ends, ends[1:])])
    return np.frombuffer(out, dtype="<i8").astype(np.int64)


def pack(strings: Sequence[str]) -> PackedStrings:
    """``strings`` packed (UTF-8, ``surrogatepass``), a chunk at a time: each chunk joined and
    encoded in one call, its strings' byte lengths their lengths where ASCII (only the others
    encoded one by one). Anything but a string raises TypeError."""
    data, lengths, n = bytearray(), [], keys64.CHUNK
    for a in range(0, len(strings), n):
        part = strings[a : a + n]
        data += "".join(part).encode(ENCODING, ERRORS)
        size = np.fromiter(map(len, part), dtype=np.int64, count=len(part))
        for i in np.flatnonzero(~np.fromiter(map(str.isascii, part), dtype=bool, count=len(part))).tolist():
            size[i] = len(part[i].encode(ENCODING, ERRORS))
        lengths.append(size)
    offsets = np.zeros(len(strings) + 1, dtype=np.int64)
    np.cumsum(np.concatenate([np.zeros(0, np.int64), *lengths]), out=offsets[1:])
    return PackedStrings(np.frombuffer(data, dtype=np.uint8), offsets)


def sample_strings(samples: Sequence[Sample]) -> tuple[Iterable[PackedStrings], Iterable[PackedStrings]]:
    """The image keys and the captions of ``samples``, packed in chunks
    (:data:`~vlp.features.packed_keys.CHUNK` strings); of a
    :class:`SampleTable`, its distinct keys (each with its source's prefix) and its captions, straight
    from its buffers (no string decoded)."""
    if isinstance(samples, SampleTable):
        t = samples
        prefixes = [p.encode(ENCODING, ERRORS) for p, _ in t.sources]
        n = keys64.CHUNK
        sources = (t.key_sources[a : a + n] for a in range(0, len(t.keys), n))
        table_keys = (prefixed(prefixes, s, k) for s, k in zip(sources, chunks(t.keys, n)))
        return table_keys, chunks(t.captions)
    return chunks(pack([s.image_key for s in samples])), chunks(pack([c for s in samples for c in s.captions]))


def _narrowed(rows: np.ndarray) -> np.ndarray:
    """``rows`` as int32 when they fit (half the memory), read-only."""
    out = rows.astype(np.int32) if len(rows) < 2**31 else rows
    out.flags.writeable = False
    return out


class KeyRows(Mapping[int, int]):
    """``key -> row`` of int64 keys [N] given in row order: ``sorted`` [N] int64 and ``rows`` [N]
    (int32 or int64), ``sorted[i]`` being the key of row ``rows[i]``. A key held by several rows
    finds the first of them."""

    def __init__(self, keys: np.ndarray) -> None:
        keys = np.asarray(keys, dtype=np.int64)
        if keys.ndim != 1:
            raise ValueError(f"expected keys [N], got shape {keys.shape}")
        order = np.argsort(keys)  # twice as fast as a stable sort, which equal keys need (their rows in order)
        self.sorted = keys[order]
        if bool((self.sorted[1:] == self.sorted[:-1]).any()):
            order = np.argsort(keys, kind="stable")
            self.sorted = keys[order]
        self.sorted.flags.writeable = False
        self.rows = _narrowed(order)

    def first(self, key: int) -> int:
        """The position in :attr:`sorted` of the first entry with ``key`` (len when none)."""
        if not -(2**63) <= key < 2**63:
            return len(self.sorted)
        i = int(np.searchsorted(self.sorted, np.int64(key)))
        return i if i < len(self.sorted) and self.sorted[i] == key else len(self.sorted)

    def __getitem__(self, key: int) -> int:
        i = self.first(key) if isinstance(key, (int, np.integer)) else len(self.sorted)
        if i == len(self.sorted):
            raise KeyError(key)
        return int(self.rows[i])

    def positions(self, keys: np.ndarray) -> np.ndarray:
        """[M] int64: the position in :attr:`sorted` of each of ``keys`` [M] int64, -1 where absent."""
        order = np.argsort(keys)  # sorted, the queries search the sorted keys in one cache-friendly sweep
        i = np.empty(len(keys), dtype=np.int64)
        i[order] = np.searchsorted(self.sorted, keys[order])
        found = i < len(self.sorted)
        found[found] = self.sorted[i[found]] == keys[found]
        return np.where(found, i, -1)

    def __len__(self) -> int:
        return len(self.sorted)

    def __iter__(self) -> Iterator[int]:
        by_row = np.empty_like(self.sorted)
        by_row[self.rows] = self.sorted
        return iter(by_row.tolist())


class StringRows(Mapping[str, int]):
    """``string -> row`` of the strings of a feature file (``strings[row]``), exact (module doc)."""

    def __init__(self, strings: PackedStrings, key_rows: KeyRows) -> None:
        if len(key_rows) != len(strings):
            raise ValueError(f"{len(key_rows)} keys for {len(strings)} strings")
        self.strings, self.key_rows = strings, key_rows

    @classmethod
    def of(cls, strings: Sequence[str]) -> StringRows:
        """The index of ``strings`` in row order (packed; the sequence is not kept)."""
        packed = pack(strings)
        return cls(packed, KeyRows(keys64.packed_keys(packed)))

    def _row(self, s: str, i: int) -> int:
        """The row of ``s``, its key's run starting at position ``i`` of the sorted keys (-1 or
        len: none); -1 if absent."""
        k, j = self.key_rows, i
        while 0 <= i and j < len(k.sorted) and k.sorted[j] == k.sorted[i]:
            row = int(k.rows[j])
            if self.strings[row] == s:
                return row
            j += 1
        return -1

    def __getitem__(self, s: str) -> int:
        row = self._row(s, self.key_rows.first(keys64.key_of(s.encode(ENCODING, ERRORS)))) if isinstance(s, str) else -1
        if row < 0:
            raise KeyError(s)
        return row

    def count_missing(self, strings: Iterable[PackedStrings]) -> int:
        """How many of ``strings`` (packed chunks) are not held: per chunk, one vectorised key
        search and one byte comparison with the stored strings; a string whose first row with its
        key holds another string (two strings share a key) is looked up on its own."""
        missing = 0
        for chunk in strings:
            pos = self.key_rows.positions(keys64.packed_keys(chunk))
            same = self._same_bytes(chunk, pos)
            missing += int((pos < 0).sum())
            for j in np.flatnonzero((pos >= 0) & ~same).tolist():
                missing += self._row(chunk[j], int(pos[j])) < 0
        return missing

    def _same_bytes(self, chunk: PackedStrings, pos: np.ndarray) -> np.ndarray:
        """[M] bool: whether string j of ``chunk`` equals the string of the row at position ``pos[j]``
        of the sorted keys (False where ``pos[j]`` < 0), compared 8 bytes at a time in one gather."""
        o, rows = self.strings.offsets, self.key_rows.rows[np.maximum(pos, 0)]
        start, length = o[rows].astype(np.int64), (o[rows + 1] - o[rows]).astype(np.int64)
        q = chunk.offsets.astype(np.int64)
        same = (pos >= 0) & (np.diff(q) == length)
        sel = np.flatnonzero(same)
        counts, stored = string_words(self.strings.data, start[sel], length[sel])
        query = string_words(chunk.data, q[:-1][sel], length[sel])[1]
        differ = np.searchsorted(np.cumsum(counts), np.flatnonzero(stored != query), side="right")  # -> string
        same[sel[differ]] = False
        return same

    def __len__(self) -> int:
        return len(self.strings)

    def __iter__(self) -> Iterator[str]:
        return iter(self.strings)


def count_missing_strings(index: Mapping[str, int], strings: Iterable[PackedStrings]) -> int:
    """How many of ``strings`` (packed chunks) ``index`` lacks: vectorised for a
    :class:`StringRows`, decoded and looked up one by one in another mapping (a dict)."""
    if isinstance(index, StringRows):
        return index.count_missing(strings)
    return sum(s not in index for chunk in strings for s in chunk)


def count_missing(index: Mapping[int, int], keys: Iterable[int] | np.ndarray) -> int:
    """How many of ``keys`` (or [M] int64) ``index`` lacks: vectorised for a :class:`KeyRows`, a lookup each otherwise."""
    if isinstance(index, KeyRows):
        wanted = keys if isinstance(keys, np.ndarray) else np.fromiter(keys, dtype=np.int64)
        return int((index.positions(wanted.astype(np.int64)) < 0).sum())
    return sum(k not in index for k in keys)
