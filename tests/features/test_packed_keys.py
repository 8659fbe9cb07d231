"""64-bit keys computed by numpy over packed strings (vlp/features/packed_keys.py), and the helper
cache's coverage check built on them: the same key one string at a time, chunk-independent,
well spread, and a check that counts exactly what is missing."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from vlp.data.formats import load_pairs
from vlp.data.sample_table import PackedStrings, SampleTable
from vlp.errors import DataError
from vlp.features import packed_keys
from vlp.features.helper_cache import HelperCache, cache_rows, write_cache
from vlp.features.packed_keys import chunks, key_of, prefixed, string_words

EDGES = ["", "a", "abcdefg", "abcdefgh", "abcdefghi", "abcdefgh\x00", "\x00", "\x00\x00", "héllo wörld", "\ud800 x"]


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


def test_packed_keys_equal_the_key_of_each_string_in_any_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(0)
    texts = EDGES + ["".join(chr(rng.randint(1, 0x3000)) for _ in range(rng.randint(0, 30))) for _ in range(2000)]
    packed = PackedStrings.of(texts)
    keys = packed_keys.packed_keys(packed)
    assert keys.dtype == np.int64 and keys.tolist() == [key_of(_utf8(t)) for t in texts]
    assert packed_keys.packed_keys(PackedStrings.of(["abc", ""])).tolist() == [key_of(b"abc"), key_of(b"")]  # < 8 bytes
    monkeypatch.setattr(packed_keys, "CHUNK", 7)  # chunks end inside the strings' list
    assert packed_keys.packed_keys(packed).tolist() == keys.tolist()
    # a trailing NUL byte, a longer run of NULs, one more word: all told apart from their neighbours
    assert len(set(keys[: len(EDGES)].tolist())) == len(EDGES)


def test_packed_keys_are_spread_over_similar_strings() -> None:
    """203k strings differing in a number, in one word or only in their length: no two share a key
    (at 2**-64 per pair a collision among them would be a defect, ~1e-9 by chance)."""
    texts = [f"a photo of thing number {i} on a table" for i in range(100_000)]
    texts += [f"{'x' * (i % 90)}{i:08d}" for i in range(100_000)]
    texts += ["z" * i for i in range(1, 3001)]
    keys = packed_keys.packed_keys(PackedStrings.of(texts))
    assert len(np.unique(keys)) == len(texts)
    low = keys.view(np.uint64) & np.uint64(0xFFFF)  # the low 16 bits alone are spread too
    assert np.bincount(low.astype(np.int64), minlength=1 << 16).max() < 30  # ~3.1 per value on average


def test_chunks_prefixed_and_string_words() -> None:
    packed = PackedStrings.of(EDGES)
    assert [s for c in chunks(packed, 3) for s in c] == EDGES
    out = prefixed([b"P:", b"", "ü/".encode()], np.array([0, 1, 2] * 3 + [0]), packed)
    assert list(out) == [("P:", "", "ü/")[i % 3] + s for i, s in enumerate(EDGES)]
    data = np.frombuffer(b"abcdefghijk", dtype=np.uint8)  # words at the buffer's end are read from before it
    counts, words = string_words(data, np.array([0, 9, 3, 11]), np.array([11, 2, 8, 0]))
    want = [b"abcdefgh", b"ijk", b"jk", b"defghijk", b""]
    assert counts.tolist() == [2, 1, 1, 1] and words.tolist() == [int.from_bytes(w, "little") for w in want]


def _two_files(folder: Path) -> list[Path]:
    """Two annotation files whose images share their names (so their keys differ by the file prefix)."""
    files = []
    for name, caps in (("a", ["red circle", "one circle"]), ("b", ["blue square", "red circle"])):
        entries = [{"image": f"{i}.jpg", "caption": c} for i, c in enumerate(caps)] + [
            {"image": "0.jpg", "caption": "é repeated"}
        ]
        path = folder / f"{name}.json"
        path.write_text(json.dumps(entries))
        files.append(path)
    return files


def test_check_covers_of_a_table_counts_exactly_what_the_cache_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vectorised check (keys with their files' prefixes, in chunks that split the table)
    passes a cache of the same data and names the count of images and captions another lacks."""
    monkeypatch.setattr(packed_keys, "CHUNK", 2)
    table = SampleTable.of(load_pairs(_two_files(tmp_path)))
    assert isinstance(table, SampleTable) and table.num_images == 4 and len(table.sources) == 2
    _, keys, texts = cache_rows(table)
    meta = {"kind": "learned"}
    full = write_cache(tmp_path / "full", keys, torch.zeros(len(keys), 2), texts, torch.zeros(len(texts), 2), meta)
    HelperCache.load(full).check_covers(table)
    keys = [k for k in keys if not k.endswith("a.json:1.jpg")]  # one sample's image
    texts = [t for t in texts if t != "blue square"]  # one sample's caption
    part = write_cache(tmp_path / "part", keys, torch.zeros(3, 2), texts, torch.zeros(len(texts), 2), meta)
    with pytest.raises(DataError, match=r"lacks 1 images and 1 captions of the training data.*a.json:1.jpg"):
        HelperCache.load(part).check_covers(table)
