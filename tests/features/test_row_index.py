"""Row indexes of feature files (vlp/features/row_index.py): exact lookups in numpy arrays, equal to
the dict they replace, that a forked worker reads without copying."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vlp.data.sample_table import PackedStrings, Sample, SampleTable
from vlp.errors import DataError
from vlp.features import packed_keys
from vlp.features.helper_cache import HelperCache, write_cache
from vlp.features.row_index import (
    KeyRows,
    StringRows,
    bytes_keys,
    count_missing,
    count_missing_strings,
    sample_strings,
    string_key,
)
from vlp.features.targets import caption_key

STRINGS = ["b", "a", "", "héllo wörld", "\ud800 lone surrogate", "a dog on a beach", "zz", "a"]


def test_string_rows_equal_the_dict_of_rows_and_are_exact() -> None:
    rows = StringRows.of(STRINGS)
    want = {}
    for i, s in enumerate(STRINGS):
        want.setdefault(s, i)  # a repeated string finds its first row
    assert dict(rows.items()) == want and len(rows) == len(STRINGS) and list(rows) == list(rows.keys()) == STRINGS
    assert all(rows[s] == want[s] for s in STRINGS)
    for absent in ("c", "A", "a ", "héllo", 3, b"a"):
        assert absent not in rows
        with pytest.raises(KeyError):
            rows[absent]  # type: ignore[index]
    queries = [PackedStrings.of(["a", "c", ""]), PackedStrings.of(["zz", "zz ", "\ud800 lone surrogate"])]  # 2 chunks
    assert count_missing_strings(rows, queries) == count_missing_strings(dict(want), queries) == 2
    assert caption_key("a dog on a beach") == string_key("a dog on a beach")  # LTD files keep their keys
    assert bytes_keys(PackedStrings.of(STRINGS)).tolist() == [string_key(s) for s in STRINGS]


def test_strings_sharing_a_key_are_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two strings with the same 64-bit key: each finds its own row, a third with that key none."""
    monkeypatch.setattr(packed_keys, "packed_keys", lambda p: np.diff(p.offsets).astype(np.int64))  # keys collide
    monkeypatch.setattr(packed_keys, "key_of", len)  # by length
    rows = StringRows.of(["cat", "dog", "horse", "cow"])
    assert [rows[s] for s in ("cat", "dog", "horse", "cow")] == [0, 1, 2, 3]
    assert "pig" not in rows and "mouse" not in rows and "ox" not in rows
    queries = PackedStrings.of(["dog", "pig", "cow", "cat", "horse", "mouse", "ox"])
    assert rows.count_missing(packed_keys.chunks(queries, 2)) == 3  # chunks end inside the queries
    assert rows.count_missing([PackedStrings.of(["dog", "cow", "cat"])]) == 0


def test_key_rows_equal_the_dict_and_vectorise() -> None:
    keys = np.array([5, -(2**63), 2**63 - 1, 0, 5, -7], dtype=np.int64)
    rows = KeyRows(keys)
    assert dict(rows.items()) == {5: 0, -(2**63): 1, 2**63 - 1: 2, 0: 3, -7: 5} and len(rows) == 6
    assert list(rows) == keys.tolist() and rows.rows.dtype == np.int32 and not rows.sorted.flags.writeable
    for absent in (1, 2**63, -(2**63) - 1, "5"):
        assert absent not in rows
    pos = rows.positions(np.array([0, 1, 2**63 - 1, -8], dtype=np.int64))
    assert (pos >= 0).tolist() == [True, False, True, False] and rows.sorted[pos[0]] == 0
    assert count_missing(rows, [5, 6, 0, 2**63 - 1]) == 1


def test_key_rows_of_repeated_keys_find_their_first_row() -> None:
    """Sorted by a fast unstable sort where the keys are distinct; with repeats, each key still finds
    its first row (20k rows, where an unstable sort reorders equal keys)."""
    keys = np.random.default_rng(0).integers(0, 50, 20_000)
    rows = KeyRows(keys)
    first = {}
    for i, k in enumerate(keys.tolist()):
        first.setdefault(k, i)
    assert {k: rows[k] for k in first} == first
    assert np.argsort(keys).tolist() != np.argsort(keys, kind="stable").tolist()  # the case this guards


def test_sample_strings_of_a_table_are_its_distinct_keys_and_captions() -> None:
    samples = [
        Sample("x.jpg", ("c1", "c2"), "k2", "o"),
        Sample("y.jpg", ("c3",), "k1", "o"),
        Sample("x.jpg", ("c1",), "k2", "o"),
    ]

    def flat(chunks: object) -> list[str]:
        return [s for chunk in chunks for s in chunk]  # type: ignore[attr-defined]

    keys, captions = sample_strings(SampleTable.of(samples))
    assert flat(keys) == ["k1", "k2"] and flat(captions) == ["c1", "c2", "c3", "c1"]
    keys, captions = sample_strings(samples)
    assert flat(keys) == ["k2", "k1", "k2"] and flat(captions) == ["c1", "c2", "c3", "c1"]
    packed = PackedStrings.of(STRINGS)
    assert [b.decode("utf-8", "surrogatepass") for b in packed.encoded(chunk=3)] == STRINGS


def _uss_kib() -> int:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:])
    return sum(int(fields[f].split()[0]) for f in ("Private_Clean", "Private_Dirty"))


def _text(i: int) -> str:
    return f"a photo of thing number {i} on a table"


class _NoIndex:
    """The baseline of :func:`_forked_growth_kib`: each text's number read from the text itself, so a
    worker does the same queries with nothing shared to look them up in."""

    def __getitem__(self, text: str) -> int:
        return int(text.split()[5])


def _look_all_up(index: object, n: int, out: mp.Queue) -> None:
    """Every text looked up in ``index`` (each query made here and freed: only the index is shared),
    after a full collection, as a worker's collector may run at any time."""
    before = _uss_kib()
    gc.collect()
    assert all(index[_text(i)] == i for i in range(n))  # type: ignore[index]
    out.put(_uss_kib() - before)


def _forked_growth_kib(index: object, n: int) -> int:
    """Private KiB a forked worker gains looking every text up in ``index``, less what a worker gains
    doing the same queries against nothing shared (:class:`_NoIndex`, forked from the same parent): the
    queries' own allocations land on pages of the parent's heap, which in a long test session is
    fragmented enough to copy about a MiB of them (a suite run measured 1.6 MiB for the StringRows
    where a fresh process gives 0.35); only the index's share is the index's. The parent's objects are
    frozen out of the collector around the fork: a collection in the child otherwise walks (and so
    copies) every page of the parent's tracked objects, 50 MiB at 60k lists here."""
    return _child_growth_kib(index, n) - _child_growth_kib(_NoIndex(), n)


def _child_growth_kib(index: object, n: int) -> int:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_look_all_up, args=(index, n, out))
    gc.freeze()
    try:
        p.start()
    finally:
        gc.unfreeze()
    p.join(300)
    assert p.exitcode == 0, f"the worker ended with {p.exitcode}"
    return out.get(timeout=10)


def measure_forked_growth(n: int = 200_000) -> dict[str, int]:
    """:func:`_forked_growth_kib` of a StringRows and of the dict it replaces, over ``n`` texts built here."""
    texts = [_text(i) for i in range(n)]
    packed = StringRows.of(texts)
    as_dict = {t: i for i, t in enumerate(texts)}
    del texts
    return {"string_rows": _forked_growth_kib(packed, n), "dict": _forked_growth_kib(as_dict, n)}


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux smaps_rollup")
def test_a_forked_worker_reads_the_index_without_copying_it() -> None:
    """200k captions: a forked worker looking every one up grows by under 1.5 MiB with a
    StringRows (0.35 measured); with the dict it replaces, by more than 4 MiB (6.3 measured: the
    pages of the row numbers' int objects, whose reference counts each lookup writes). Measured in a
    fresh interpreter, the index's only parent: forked from a long test session, the queries' own
    allocations copy pages of that session's fragmented heap (1.6 MiB in one suite run), which says
    nothing about the index."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import test_row_index as t; "
        "print(json.dumps(t.measure_forked_growth()))"
    )
    here = Path(__file__).resolve().parent
    run = subprocess.run([sys.executable, "-c", code, str(here)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    growth = json.loads(run.stdout.strip().splitlines()[-1])
    assert growth["string_rows"] < 1536 and growth["dict"] > 4096, growth


def test_a_cache_index_with_a_non_string_key_is_one_data_error(tmp_path: Path) -> None:
    write_cache(tmp_path / "c", ["a", 3], torch.zeros(2, 3), ["x", "y"], torch.zeros(2, 3), {"kind": "learned"})  # type: ignore[list-item]
    with pytest.raises(DataError, match=r"c/index.json: key 'image_keys' holds 3, expected strings"):
        HelperCache.load(tmp_path / "c")
