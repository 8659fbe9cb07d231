"""Tests for the restricted unpickler (vlp.safe_pickle): code-running pickles are refused
before anything runs, plain data of every protocol and Python 2 pickles are read."""

from __future__ import annotations

import json
import os
import pickle
import resource
import struct
import tracemalloc
from pathlib import Path

import pytest

from vlp import safe_pickle
from vlp.cli import main
from vlp.errors import DataError
from vlp.safe_pickle import restricted_load, restricted_loads


class _System:
    """Unpickling this runs ``os.system(command)``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class _WriteFile:
    """Unpickling this opens ``path`` for writing (creating it)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


class _Record:
    """A plain class instance: pickled as a reference to this class."""

    def __init__(self) -> None:
        self.x = 1


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_os_system_pickle_is_refused_and_does_not_run(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "refs.p"
    evil.write_bytes(pickle.dumps([{"ref_id": 1}, _System(f"touch {marker}")], protocol=protocol))
    with pytest.raises(DataError, match=r"refs\.p: refused to unpickle the global '(posix|os)\.system'"):
        restricted_load(evil)
    assert not marker.exists()
    pickle.loads(evil.read_bytes())  # the pickle is really malicious: the plain unpickler runs it
    assert marker.exists()


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_file_writing_and_class_pickles_are_refused(tmp_path: Path, protocol: int) -> None:
    target = tmp_path / "written.txt"
    with pytest.raises(DataError, match=r"refused to unpickle the global '(builtins|__builtin__|io)\.open'"):
        restricted_loads(pickle.dumps(_WriteFile(target), protocol=protocol), "x.p")
    assert not target.exists()
    with pytest.raises(DataError, match=r"refused to unpickle the global '(copy_reg|copyreg|tests\.|builtins\.object)"):
        restricted_loads(pickle.dumps(_Record(), protocol=protocol), "x.p")


def test_persistent_ids_are_refused() -> None:
    import io

    class WithIds(pickle.Pickler):
        def persistent_id(self, obj):
            return "ext-1" if obj == "secret" else None

    buf = io.BytesIO()
    WithIds(buf, protocol=2).dump(["plain", "secret"])
    with pytest.raises(DataError, match=r"y\.p: refused to unpickle a persistent id \('ext-1'\)"):
        restricted_loads(buf.getvalue(), "y.p")


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_plain_data_round_trips(protocol: int) -> None:
    data = [
        {"ref_id": 7, "split": "testA", "sentences": [{"sent": "the man on the left", "sent_id": 3}]},
        (1, 2.5, -3, 2**70, None, True, False),
        {"nested": {"deep": [[], {}, ()]}, 5: "int key", "unicode": "café ☃"},
        {1, 2, 3},
        frozenset({"a", "b"}),
    ]
    assert restricted_loads(pickle.dumps(data, protocol=protocol)) == data


def test_python2_pickle_with_byte_strings_longs_and_a_set() -> None:
    # Python 2: pickle.dumps([{'sent': 'caf\xe9', 'ref_id': 5L, 'ids': set([1, 2])}], 2)
    data = (
        b"\x80\x02]q\x00}q\x01(U\x04sentq\x02U\x04caf\xe9q\x03U\x06ref_idq\x04\x8a\x01\x05"
        b"U\x03idsq\x05c__builtin__\nset\nq\x06]q\x07(K\x01K\x02e\x85q\x08Rq\tua."
    )
    assert restricted_loads(data) == [{"sent": "café", "ref_id": 5, "ids": {1, 2}}]


def test_python2_global_of_a_harmful_builtin_is_refused() -> None:
    data = b"c__builtin__\neval\n(S'1+1'\ntR."  # protocol 0: __builtin__.eval('1+1')
    with pytest.raises(DataError, match=r"'__builtin__\.eval'"):
        restricted_loads(data, "old.p")


def test_broken_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a readable pickle"):
        restricted_loads(pickle.dumps({"a": [1, 2, 3]}, protocol=2)[:-5], "cut.p")
    with pytest.raises(DataError, match="not a readable pickle"):
        restricted_loads(b"not a pickle at all", "junk.p")
    with pytest.raises(DataError, match="pickle file not found"):
        restricted_load(tmp_path / "absent.p")


# --------------------------------------------------------------------------- memory bounds


def _int_list(n: int) -> bytes:
    """Protocol-2 opcodes that push a list of ``n`` 4-byte ints (APPENDS)."""
    return b"](" + b"".join(b"J" + struct.pack("<i", i) for i in range(n)) + b"e"


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x02Nr\xff\xff\xff\x7f.",  # 9 bytes: LONG_BINPUT 2**31-1 sizes the memo to gigabytes
        b"\x80\x02Nr\x00\x00\x00\x12.",  # 9 bytes: ~4.9 GB of memo table on CPython 3.11
        b"(lp123456789\n.",  # protocol 0: PUT with a large decimal index
    ],
)
def test_a_memo_index_beyond_the_file_is_refused_before_loading(data: bytes) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(DataError, match=r"bomb\.p: .*memo index \d+ .*a file of \d+ bytes"):
        restricted_loads(data, "bomb.p")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: nothing was allocated


def test_a_length_beyond_the_file_is_refused_before_allocating() -> None:
    data = b"\x80\x03B\xff\xff\xff\x7f" + b"x" * 10 + b"."  # BINBYTES declaring 2 GiB
    with pytest.raises(DataError, match=r"len\.p: not a readable pickle \(.*2147483647 bytes.*only 11 remain"):
        restricted_loads(data, "len.p")


def test_set_calls_copying_a_shared_list_are_bounded() -> None:
    # set(L) 2,000 times on one memoized list of 2,000 ints: a 20 KB file that copies 4M elements
    n = k = 2_000
    data = b"\x80\x02" + _int_list(n) + b"q\x000" + b"c__builtin__\nset\nq\x010"
    data += b"](" + b"h\x01h\x00\x85R" * k + b"e."
    assert len(data) < 25_000
    with pytest.raises(DataError, match=r"sets\.p: .*set/frozenset calls copy more than \d+ elements"):
        restricted_loads(data, "sets.p")
    small = b"\x80\x02" + _int_list(50) + b"q\x000" + b"c__builtin__\nset\nq\x010](" + b"h\x01h\x00\x85R" * 3 + b"e."
    assert restricted_loads(small) == [set(range(50))] * 3  # what real files do stays readable


def test_shared_references_that_expand_past_the_bound_are_refused() -> None:
    x: list = [0]
    for _ in range(40):  # 2**40 elements when followed as a tree, ~300 bytes pickled
        x = [x, x]
    with pytest.raises(DataError, match=r"dag\.p: .*expands to more than \d+ elements.*shared references"):
        restricted_loads(pickle.dumps(x, protocol=2), "dag.p")
    big = list(range(10_000))
    wide = pickle.dumps([big] * 10_000, protocol=2)  # 80 KB holding 10**8 elements when followed
    assert len(wide) < 100_000
    with pytest.raises(DataError, match="expands to more than"):
        restricted_loads(wide, "wide.p")
    shared = {"cat": "person"}
    ok = [{"ref": i, "meta": shared, "sent": [f"s{i}"]} for i in range(1000)]
    assert restricted_loads(pickle.dumps(ok, protocol=2)) == ok  # ordinary sharing passes


def test_a_container_that_holds_itself_is_refused() -> None:
    loop: list = [1]
    loop.append(loop)
    with pytest.raises(DataError, match=r"cycle\.p: .*holds itself"):
        restricted_loads(pickle.dumps(loop, protocol=2), "cycle.p")


# --------------------------------------------------------------------------- the byte budget (issue 41, item 7a)


def _shared_sentence_refs(chars: int, sentences: int, refs: int, **ref: object) -> bytes:
    """A refs file whose one sentence of ``chars`` characters is referenced ``sentences * refs``
    times (one sentences list shared by one ref, itself referenced ``refs`` times); memo references
    keep the file small."""
    sent = {"sent": "a" * chars}
    return pickle.dumps([{**ref, "sentences": [sent] * sentences}] * refs, protocol=2)


def test_the_53_kb_refs_shape_is_refused_by_the_default_budget_without_allocating() -> None:
    """The attack: one 50 KB sentence shared 500,000 times, 25 GB of text for whoever writes it
    out; its element count (about 1.5M) is under the element bound."""
    data = _shared_sentence_refs(50_000, 500, 1000, split="train")
    assert 50_000 < len(data) < 56_000
    assert 1000 * (4 + 500 * 3) + 1 < safe_pickle.BOUND_FLOOR + safe_pickle.BOUND_PER_BYTE * len(data)
    budget = safe_pickle.BYTES_FLOOR + safe_pickle.BYTES_PER_BYTE * len(data)
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as e:
            restricted_loads(data, "refs.p")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value).startswith(f"refs.p: refused: a file of {len(data)} bytes holds more than {budget} bytes")
    assert "one string referenced many times" in str(e.value)
    assert peak < 16 * 2**20, peak  # the walk measures, it copies nothing


def test_each_reference_counts_against_the_byte_budget(monkeypatch) -> None:
    monkeypatch.setattr(safe_pickle, "BYTES_FLOOR", 100_000)
    monkeypatch.setattr(safe_pickle, "BYTES_PER_BYTE", 1)
    text = "b" * 1000
    fits = pickle.dumps({"k": [text] * 90}, protocol=2)  # 90,000 + 1 characters, ~1.2 KB of file
    assert restricted_loads(fits) == {"k": [text] * 90}
    with pytest.raises(DataError, match=r"x\.p: refused: a file of \d+ bytes holds more than 10\d{4} bytes of text"):
        restricted_loads(pickle.dumps({"k": [text] * 110}, protocol=2), "x.p")
    with pytest.raises(DataError, match="bytes of text"):  # bytes objects and the digits of integers count too
        restricted_loads(pickle.dumps([b"c" * 1000] * 110, protocol=3), "x.p")
    with pytest.raises(DataError, match="bytes of text"):
        restricted_loads(pickle.dumps([10**3000] * 110, protocol=2), "x.p")  # 3,001 digits each


def test_prepare_refcoco_refuses_a_shared_sentence_bomb_and_writes_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    """`vlp prepare refcoco+` on a refs file whose 20 KB sentence is referenced 500 times (10 MB of
    JSON from a 21 KB file), under a budget scaled down to 1 MB + 16 per byte."""
    monkeypatch.setattr(safe_pickle, "BYTES_FLOOR", 1_000_000)
    refs, inst, out = tmp_path / "refs(unc).p", tmp_path / "instances.json", tmp_path / "out"
    refs.write_bytes(_shared_sentence_refs(20_000, 50, 10, ref_id=1, ann_id=11, image_id=1, split="train"))
    inst.write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
                "annotations": [{"id": 11, "image_id": 1, "bbox": [1, 2, 30, 20], "category_id": 1}],
            }
        )
    )
    assert refs.stat().st_size < 22_000
    assert main(["prepare", "refcoco+", str(refs), str(inst), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"vlp: error: {refs}: refused: a file of "), err
    assert "bytes of text" in err
    assert not out.exists() or not list(out.glob("*.json"))  # nothing written
    small = tmp_path / "small.p"  # the same shape with a short sentence still prepares
    small.write_bytes(_shared_sentence_refs(20, 50, 10, ref_id=1, ann_id=11, image_id=1, split="train"))
    assert main(["prepare", "refcoco+", str(small), str(inst), "--out", str(out)]) == 0
    assert len(json.loads((out / "refcoco+_train.json").read_text())) == 500
