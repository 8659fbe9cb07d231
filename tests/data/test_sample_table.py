"""SampleTable (vlp.data.sample_table): annotation entries packed in numpy arrays are the same
samples as the list of Sample objects they replace, pickle as their arrays, and number images as
ImageTextDataset always did."""

from __future__ import annotations

import gc
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from vlp.data.datasets import ImageTextDataset
from vlp.data.formats import Sample, load_pairs, load_pairs_checked
from vlp.data.sample_table import PackedStrings, SampleTable

CAPTIONS = ["a dog", "ein Hund über der Brücke", "犬と猫 🐕", "lone \ud800 surrogate", ""]


def _write(path: Path, entries: list) -> Path:
    path.write_text(json.dumps(entries))
    return path


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    a = _write(
        tmp_path / "a.json",
        [
            {"image": "x/1.jpg", "caption": "a dog on the grass"},
            {"image": "/abs/é.jpg", "caption": ["ein Hund über der Brücke", "犬と猫 🐕", "third"]},
            {"image": "x/1.jpg", "caption": "the same image again"},
        ],
    )
    b = _write(
        tmp_path / "b.json",
        [
            {"image": "y/2.jpg", "caption": "with an id", "image_id": 7},
            {"image": "y/3.jpg", "caption": "another id", "image_id": "seven"},
            {"image": "y/4.jpg", "caption": "the same id again", "image_id": 7},
        ],
    )
    return [a, b]


def expected(files: list[Path]) -> list[Sample]:
    """The samples as the list-of-Sample loader built them (image keys ``file:key``, origins ``file entry i``)."""
    out = []
    for f in files:
        for i, e in enumerate(json.loads(f.read_text())):
            caps = tuple(e["caption"]) if isinstance(e["caption"], list) else (e["caption"],)
            image = e["image"] if e["image"].startswith("/") else str(f.parent / e["image"])
            out.append(Sample(image, caps, f"{f}:{e.get('image_id', e['image'])}", f"{f} entry {i}"))
    return out


def test_load_pairs_table_round_trips_to_the_samples(files: list[Path]) -> None:
    table = load_pairs(files)
    want = expected(files)
    assert isinstance(table, SampleTable) and len(table) == len(want) == 6
    assert list(table) == want and table == want and want == table  # both ways, against a list
    assert [table[i] for i in range(-6, 0)] == want and table[1:3] == want[1:3]
    assert table[1].captions == ("ein Hund über der Brücke", "犬と猫 🐕", "third")
    assert table[3].origin == f"{files[1]} entry 0" and table[5].image_key == f"{files[1]}:7"
    with pytest.raises(IndexError):
        table[6]
    keys = sorted({s.image_key for s in want})  # the numbering ImageTextDataset always used
    assert [table.key_to_id[s.image_key] for s in want] == [keys.index(s.image_key) for s in want]
    assert table.image_ids.tolist() == [keys.index(s.image_key) for s in want]
    assert [k.decode("utf-8") for k in table.encoded_keys()] == keys  # two sources, non-ASCII paths
    assert dict(table.key_to_id) == {k: i for i, k in enumerate(keys)} and table.num_images == 4
    assert f"{files[0]}:nothing" not in table.key_to_id


def test_skipped_entries_keep_their_entry_numbers(tmp_path: Path) -> None:
    f = _write(tmp_path / "c.json", [{"image": "a.jpg"}, {"image": "b.jpg", "caption": ["  ", "ok"]}])
    table, dropped = load_pairs_checked([f], on_bad="skip")
    assert (dropped.entries, dropped.captions) == (1, 1)
    assert list(table) == [Sample(str(tmp_path / "b.jpg"), ("ok",), f"{f}:b.jpg", f"{f} entry 1")]


def test_any_samples_pack_and_unpack_exactly() -> None:
    samples = [
        Sample(f"/img/{i % 3}.jpg", tuple(CAPTIONS[: 1 + i % 4]), f"key-{i % 3}", f"somewhere {i}") for i in range(9)
    ]
    samples.append(Sample("", (CAPTIONS[3], CAPTIONS[4]), "ü-key", "shard.tar sample 000123"))
    table = SampleTable.of(samples)
    assert list(table) == samples and SampleTable.of(table) is table
    assert dict(table.key_to_id) == {k: i for i, k in enumerate(sorted({s.image_key for s in samples}))}
    empty = SampleTable.of([])
    assert len(empty) == 0 and list(empty) == [] and dict(empty.key_to_id) == {}
    assert PackedStrings.of(CAPTIONS)[:] == CAPTIONS


def test_storage_is_numpy_arrays_that_pickle_small(files: list[Path]) -> None:
    many = [
        Sample(f"/data/cc3m/train/{i:09d}.jpg", (f"caption number {i}",), f"k{i}", f"f entry {i}") for i in range(5000)
    ]
    table = SampleTable.of(many)
    arrays = table.arrays()
    assert all(isinstance(a, np.ndarray) and a.dtype.kind in "iu" and not a.flags.writeable for a in arrays.values())
    assert table.nbytes == sum(a.nbytes for a in arrays.values())
    objects, todo = set(), [table]  # the Python objects the table holds: a few, not some per sample
    while todo:
        o = todo.pop()
        if id(o) not in objects and not isinstance(o, (type, np.dtype)):
            objects.add(id(o))
            todo.extend(gc.get_referents(o))
    assert len(objects) < 60
    blob = pickle.dumps(table)
    assert len(blob) < table.nbytes + 4096  # it pickles as its arrays
    assert pickle.loads(blob) == many
    assert len(pickle.dumps(load_pairs(files))) < 4096


def test_dataset_packs_a_list_and_keeps_its_image_ids(files: list[Path]) -> None:
    want = expected(files)
    for samples in (want, load_pairs(files)):
        ds = ImageTextDataset(samples, transform=lambda im: im.size)
        assert isinstance(ds.samples, SampleTable) and ds.samples == want
        keys = sorted({s.image_key for s in want})
        assert len(ds.key_to_id) == 4 and all(ds.key_to_id[k] == i for i, k in enumerate(keys))
