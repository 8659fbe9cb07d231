"""Tests for ``vlp prepare refcoco+`` (vlp.prepare.refcoco) on small refs / instances files
pickled like the official release (protocol 2)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from vlp.cli import main
from vlp.data.grounding import read_grounding_file
from vlp.errors import DataError
from vlp.prepare.refcoco import prepare_refcoco

INSTANCES = {
    "images": [
        {"id": 1, "file_name": "COCO_train2014_000000000001.jpg", "width": 640, "height": 480},
        {"id": 2, "file_name": "COCO_train2014_000000000002.jpg", "width": 500, "height": 375},
    ],
    "annotations": [
        {"id": 12, "image_id": 1, "bbox": [300, 40, 100, 200], "category_id": 1},
        {"id": 11, "image_id": 1, "bbox": [10, 20, 50.5, 60], "category_id": 1},
        {"id": 21, "image_id": 2, "bbox": [0, 0, 30, 30], "category_id": 3},
        {"id": 22, "image_id": 2, "bbox": [100, 100, 40, 20], "category_id": 3},
    ],
    "categories": [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}],
}


def _ref(ref_id: int, ann_id: int, image_id: int, split: str, sents: list[str]) -> dict[str, Any]:
    return {
        "ref_id": ref_id,
        "ann_id": ann_id,
        "image_id": image_id,
        "split": split,
        "sentences": [
            {"sent": s, "raw": s.capitalize() + ".", "tokens": s.split(), "sent_id": k} for k, s in enumerate(sents)
        ],
        "file_name": f"COCO_train2014_{image_id:012d}_{ann_id}.jpg",
        "category_id": 1,
        "sent_ids": list(range(len(sents))),
    }


REFS = [
    _ref(100, 11, 1, "train", ["man on left", "guy in red"]),
    _ref(101, 12, 1, "train", ["man right"]),
    _ref(200, 21, 2, "val", ["car top left"]),
    _ref(300, 22, 2, "testA", ["small car", "car middle"]),
    _ref(400, 12, 1, "testB", ["right person"]),
]


@pytest.fixture
def release(tmp_path: Path) -> tuple[Path, Path]:
    refs, inst = tmp_path / "refs(unc).p", tmp_path / "instances.json"
    refs.write_bytes(pickle.dumps(REFS, protocol=2))
    inst.write_text(json.dumps(INSTANCES))
    return refs, inst


def test_writes_train_and_eval_files(release: tuple[Path, Path], tmp_path: Path) -> None:
    paths = prepare_refcoco(*release, tmp_path / "out")
    assert {k: p.name for k, p in paths.items()} == {
        "train": "refcoco+_train.json",
        "val": "refcoco+_val.json",
        "testA": "refcoco+_testA.json",
        "testB": "refcoco+_testB.json",
    }
    train = json.loads(paths["train"].read_text())
    assert [(e["text"], e["ref_id"]) for e in train] == [("man on left", 100), ("guy in red", 100), ("man right", 101)]
    assert train[0]["image"] == "COCO_train2014_000000000001.jpg"  # the COCO file name, not the ref's
    assert train[0]["bbox"] == [10, 20, 50.5, 60] and train[0]["image_size"] == [640, 480]
    # gold candidates: every annotation of the image, by ascending annotation id
    assert train[0]["candidates"] == [[10, 20, 50.5, 60], [300, 40, 100, 200]]
    test_a = read_grounding_file(paths["testA"], image_root="/coco", split_kind="eval")
    assert [(e.text, e.ref_id, e.target_index) for e in test_a] == [("small car", 300, 1), ("car middle", 300, 1)]
    assert test_a[0].bbox == (100.0, 100.0, 40.0, 20.0) and test_a[0].image_size == (500, 375)
    assert read_grounding_file(paths["testB"], split_kind="eval")[0].target_index == 1
    assert len(read_grounding_file(paths["train"])) == 3


def test_detections_replace_the_candidates(release: tuple[Path, Path], tmp_path: Path) -> None:
    dets = tmp_path / "dets.json"
    dets.write_text(json.dumps({"1": [[11, 21, 50, 60, 0.9]], "2": [[1, 1, 29, 29, 0.8], [99, 99, 41, 21, 0.7]]}))
    paths = prepare_refcoco(*release, tmp_path / "out", dataset="refcoco", dets=dets, image_prefix="train2014/")
    assert paths["val"].name == "refcoco_val.json"
    val = json.loads(paths["val"].read_text())
    assert val[0]["candidates"] == [[1, 1, 29, 29], [99, 99, 41, 21]]  # the first four numbers of each row
    assert val[0]["image"] == "train2014/COCO_train2014_000000000002.jpg"
    assert read_grounding_file(paths["val"], split_kind="eval")[0].target_index is None
    by_ref = tmp_path / "dets_by_ref.json"
    by_ref.write_text(json.dumps({str(r["ref_id"]): [[0, 0, 5, 5]] for r in REFS}))
    paths = prepare_refcoco(*release, tmp_path / "out2", dets=by_ref, dets_by="ref_id")
    assert json.loads(paths["testB"].read_text())[0]["candidates"] == [[0, 0, 5, 5]]
    dets.write_text(json.dumps({"1": [[11, 21, 50, 60]]}))
    with pytest.raises(DataError, match=r"refs\[2\]: no detections for image_id 2"):
        prepare_refcoco(*release, tmp_path / "out3", dets=dets)


def test_a_malicious_refs_file_is_refused_and_nothing_written(release: tuple[Path, Path], tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'pwned'}",)

    refs, inst = release
    refs.write_bytes(pickle.dumps([REFS[0], Evil()], protocol=2))
    with pytest.raises(DataError, match=r"refs\(unc\)\.p: refused to unpickle the global"):
        prepare_refcoco(refs, inst, tmp_path / "out")
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"split": "test2"}, r"refs\[1\]: key 'split' is 'test2'"),
        ({"ann_id": 99}, r"refs\[1\]: ann_id 99 is not an annotation"),
        ({"image_id": 7}, r"refs\[1\]: image_id 7 is not an image"),
        ({"sentences": []}, r"refs\[1\]: key 'sentences' is an empty list"),
        ({"sentences": [{"raw": "x"}]}, r"refs\[1\]\.sentences\[0\]: missing key 'sent'"),
        ({"ref_id": "101"}, r"refs\[1\]: key 'ref_id' is str"),
    ],
)
def test_bad_refs_name_the_ref_and_key(release: tuple[Path, Path], tmp_path: Path, change: dict, message: str) -> None:
    refs, inst = release
    refs.write_bytes(pickle.dumps([REFS[0], {**REFS[1], **change}], protocol=2))
    with pytest.raises(DataError, match=message):
        prepare_refcoco(refs, inst, tmp_path / "out")


def test_bad_instances_and_options(release: tuple[Path, Path], tmp_path: Path) -> None:
    refs, inst = release
    bad = {**INSTANCES, "annotations": [{**INSTANCES["annotations"][0], "bbox": [0, 0, 0, 5]}]}
    inst.write_text(json.dumps(bad))
    with pytest.raises(DataError, match=r"annotations\[0\]\.bbox: box is .*width and height must be > 0"):
        prepare_refcoco(refs, inst, tmp_path / "out")
    inst.write_text(json.dumps(INSTANCES))
    with pytest.raises(DataError, match="unknown detections key"):
        prepare_refcoco(refs, inst, tmp_path / "out", dets_by="ann_id")
    with pytest.raises(DataError, match="plain file-name prefix"):
        prepare_refcoco(refs, inst, tmp_path / "out", dataset="../x")
    with pytest.raises(DataError, match="2 of 2 images not found under"):
        prepare_refcoco(refs, inst, tmp_path / "out", image_root=tmp_path / "coco")
    refs.write_bytes(pickle.dumps([{**REFS[2]}], protocol=2))
    with pytest.raises(DataError, match="no refs of split 'train'"):
        prepare_refcoco(refs, inst, tmp_path / "out")


def test_cli_prepare_refcoco_prints_counts_and_writes_the_library_files(release, tmp_path, capsys) -> None:
    out = tmp_path / "cli"
    assert main(["prepare", "refcoco+", *map(str, release), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "refcoco+ (entries): train=3" in printed and f"wrote {out / 'refcoco+_testA.json'}" in printed
    lib = prepare_refcoco(*release, tmp_path / "lib")
    for split, path in lib.items():
        assert (out / path.name).read_bytes() == path.read_bytes(), split


def test_cli_prepare_refcoco_with_another_dataset_prefix(release, tmp_path, capsys) -> None:
    # --dataset shares its name with the command's own choice (args.dataset): refcoco, not refcoco+, here
    out = tmp_path / "cli"
    assert main(["prepare", "refcoco+", *map(str, release), "--out", str(out), "--dataset", "refcoco"]) == 0
    assert "refcoco (entries): train=3" in capsys.readouterr().out
    assert (out / "refcoco_train.json").is_file() and not list(out.glob("refcoco+_*"))
