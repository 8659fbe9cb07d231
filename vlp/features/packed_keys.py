"""64-bit keys of packed strings, computed by numpy over their byte buffer (no Python step per string).

The row index of a helper cache (:class:`~vlp.features.row_index.StringRows`) finds a string's
candidate rows by a 64-bit key and then compares the stored bytes, so the key need not be
cryptographic, only well spread and fast: at ALBEF 4M scale start-up keys 9.2M cached strings and
checks 9.2M training strings. :func:`packed_keys` keys a :class:`PackedStrings` (UTF-8 ``data``
[bytes], ``offsets`` [M + 1]) in chunks of :data:`CHUNK` strings:

- each string's bytes are cut into 8-byte little-endian words (the last one zero-padded; an
  empty string is one zero word);
- word ``j`` of a string is XORed with ``j`` times an odd constant and mixed by SplitMix64's
  finaliser (a bijection of 64-bit integers), so two strings that differ in one word differ in
  their sums;
- the sum (mod 2**64) of a string's mixed words, XORed with its length times another odd
  constant, is mixed again: the key, as int64.

The keys are computed when a cache is loaded and never stored, so this function can change
without a format change. LTD targets files store BLAKE2b keys
(:func:`~vlp.features.row_index.string_key`) instead: they hold no strings to compare.
"""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

import numpy as np

from vlp.data.sample_table import PackedStrings

#: strings per vectorised step (bounds the temporaries to a few times the chunk's bytes)
CHUNK = 1 << 16
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)  # SplitMix64's multipliers
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MASK = 2**64 - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser of uint64 ``x`` [N] (in place; returned)."""
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


def _mix_int(x: int) -> int:
    """:func:`_mix` of one uint64 as a Python int."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def key_of(data: bytes) -> int:
    """The key of one string's UTF-8 ``data``, as :func:`packed_keys` computes it, in plain Python
    (a lookup's single key without numpy's per-call overhead)."""
    total = 0
    for j in range(max(1, (len(data) + 7) // 8)):
        word = int.from_bytes(data[8 * j : 8 * j + 8], "little")
        total += _mix_int(word ^ ((j * 0x9E3779B97F4A7C15) & _MASK))
    key = _mix_int((total & _MASK) ^ ((len(data) * 0x94D049BB133111EB) & _MASK))
    return key - (1 << 64) if key >= 1 << 63 else key


def chunks(strings: PackedStrings, n: Optional[int] = None) -> Iterator[PackedStrings]:
    """``strings`` in consecutive slices of ``n`` (default :data:`CHUNK`) strings (views of its
    buffer, offsets rebased)."""
    o, n = strings.offsets, n or CHUNK
    for a in range(0, len(strings), n):
        b = min(a + n, len(strings))
        base = int(o[a])
        yield PackedStrings(strings.data[base : int(o[b])], (o[a : b + 1] - o[a]).astype(np.int64))


def prefixed(prefixes: Sequence[bytes], sources: np.ndarray, strings: PackedStrings) -> PackedStrings:
    """The strings ``prefixes[sources[i]] + strings[i]`` [M], packed: the strings' bytes moved in
    one scatter, each source's prefix written into its strings' heads in another."""
    sources = np.asarray(sources, dtype=np.int64)
    plen = np.array([len(p) for p in prefixes], dtype=np.int64)
    o = strings.offsets.astype(np.int64)
    cut, slen = plen[sources], np.diff(o)  # [M] each string's prefix and own length
    offsets = np.zeros(len(cut) + 1, dtype=np.int64)
    np.cumsum(cut + slen, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    out[np.arange(len(strings.data), dtype=np.int64) + np.repeat(np.cumsum(cut), slen)] = strings.data
    for src in np.unique(sources).tolist():
        head = np.frombuffer(prefixes[src], dtype=np.uint8)
        if len(head):
            at = offsets[:-1][sources == src]
            out[(at[:, None] + np.arange(len(head))).ravel()] = np.tile(head, len(at))
    return PackedStrings(out, offsets)


def packed_keys(strings: PackedStrings) -> np.ndarray:
    """[M] int64: the key (module doc) of each of ``strings``."""
    out = np.empty(len(strings), dtype=np.int64)
    done = 0
    for part in chunks(strings):
        out[done : done + len(part)] = _chunk_keys(part)
        done += len(part)
    return out


def _chunk_keys(strings: PackedStrings) -> np.ndarray:
    """[M] int64 keys of a chunk (offsets starting at 0)."""
    o = strings.offsets.astype(np.int64)
    lengths = np.diff(o)
    counts, words = string_words(strings.data, o[:-1], lengths)
    firsts = np.cumsum(counts) - counts
    j = np.arange(len(words), dtype=np.uint64) - np.repeat(firsts, counts).astype(np.uint64)  # [W] word number
    sums = np.add.reduceat(_mix(words ^ (j * _GOLDEN)), firsts)
    return _mix(sums ^ (lengths.astype(np.uint64) * _M2)).view(np.int64)


#: ``_MASKS[k]``: the low k bytes of a word
_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [_MASK], dtype=np.uint64)


def string_words(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8-byte little-endian words of the M strings ``data[starts[i]:starts[i] + lengths[i]]``
    (uint8 ``data``), the last word of each zero-padded, an empty string one zero word:
    ``counts`` [M] words per string and ``words`` [W] uint64, string by string."""
    starts, lengths = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    counts = np.maximum(1, (lengths + 7) // 8)
    firsts = np.cumsum(counts) - counts
    at = 8 * np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(starts - 8 * firsts, counts)  # [W] first bytes
    if len(data) < 8:
        data = np.concatenate([data, np.zeros(8 - len(data), np.uint8)])
    unaligned = np.ndarray((len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))  # a word at every byte
    last = firsts + counts - 1
    late = last[at[last] > len(data) - 8]  # last words running past the buffer: read from 8 bytes before its end
    shift = (np.uint64(8) * (at[late] - (len(data) - 8)).astype(np.uint64)) % np.uint64(64)
    at[late] = len(data) - 8
    words = unaligned[at]
    words[late] >>= shift
    words[last] &= _MASKS[lengths - 8 * (counts - 1)]  # only the string's bytes of its last word
    return counts, words
