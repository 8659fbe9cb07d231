"""Tests for the grounding file format (vlp.data.grounding): train and eval entries, errors that
name the file, entry and key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vlp.data.grounding import read_grounding_file
from vlp.errors import DataError, EntryError

EVAL = {
    "image": "train2014/a.jpg",
    "text": "the man on the left",
    "ref_id": 12,
    "bbox": [10, 20, 30.5, 40],
    "candidates": [[0, 0, 5, 5], [10, 20, 30.5, 40]],
    "image_size": [640, 480],
}


def _write(tmp_path: Path, entries: Any) -> Path:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(entries))
    return path


def test_eval_entries(tmp_path: Path) -> None:
    detected = {**EVAL, "ref_id": "r2", "candidates": [[9, 19, 30, 41]]}  # detections: target not among them
    (e, d) = read_grounding_file(_write(tmp_path, [EVAL, detected]), image_root="/coco", split_kind="eval")
    assert e.image == "/coco/train2014/a.jpg" and e.text == "the man on the left" and e.ref_id == 12
    assert e.bbox == (10.0, 20.0, 30.5, 40.0)
    assert e.candidates == ((0.0, 0.0, 5.0, 5.0), (10.0, 20.0, 30.5, 40.0))
    assert e.target_index == 1 and e.image_size == (640, 480)
    assert d.ref_id == "r2" and d.target_index is None
    assert e.origin.endswith("g.json entry 0")


def test_train_entries_need_only_image_and_text(tmp_path: Path) -> None:
    entries = [{"image": "a.jpg", "text": "a dog"}, EVAL]
    plain, full = read_grounding_file(_write(tmp_path, entries))
    assert plain.image == str(tmp_path / "a.jpg")  # relative to the file's folder by default
    assert (plain.ref_id, plain.bbox, plain.candidates, plain.target_index, plain.image_size) == (
        None,
        None,
        (),
        None,
        None,
    )
    assert full.target_index == 1  # eval keys of a train entry are read (and checked) too
    with pytest.raises(EntryError, match="entry 0: missing key 'ref_id'"):
        read_grounding_file(_write(tmp_path, entries), split_kind="eval")


@pytest.mark.parametrize(
    "change, key, message",
    [
        ({"text": "  "}, "text", "empty string"),
        ({"text": 3}, "text", "is int, expected a non-empty referring expression"),
        ({"image": None}, "image", "expected an image path"),
        ({"bbox": [1, 2, 0, 4]}, "bbox", "width and height must be > 0"),
        ({"bbox": [1, 2, 3]}, "bbox", "list of 3 items"),
        ({"bbox": [1, 2, "3", 4]}, "bbox", "not 4 finite numbers"),
        ({"bbox": [1, 2, True, 4]}, "bbox", "not 4 finite numbers"),
        ({"candidates": []}, "candidates", "empty list"),
        ({"candidates": [[0, 0, 1, 1], [0, 0, -1, 1]]}, "candidates[1]", "width and height"),
        ({"ref_id": 1.5}, "ref_id", "expected an int or string ref id"),
        ({"image_size": [640]}, "image_size", "expected [width, height]"),
        ({"image_size": [640, 0]}, "image_size", "expected [width, height]"),
    ],
)
def test_bad_keys_name_file_entry_and_key(tmp_path: Path, change: dict, key: str, message: str) -> None:
    path = _write(tmp_path, [EVAL, {**EVAL, **change}])
    with pytest.raises(EntryError) as err:
        read_grounding_file(path, split_kind="eval")
    assert (err.value.entry, err.value.key) == (1, key)
    assert str(path) in str(err.value) and message in str(err.value)


def test_missing_eval_keys_and_bad_files(tmp_path: Path) -> None:
    for key in ("ref_id", "bbox", "candidates"):
        entry = {k: v for k, v in EVAL.items() if k != key}
        with pytest.raises(EntryError, match=f"missing key '{key}'"):
            read_grounding_file(_write(tmp_path, [entry]), split_kind="eval")
    with pytest.raises(EntryError, match="expected an object"):
        read_grounding_file(_write(tmp_path, ["a.jpg"]))
    with pytest.raises(DataError, match="no entries"):
        read_grounding_file(_write(tmp_path, []))
    with pytest.raises(DataError, match="expected a JSON list"):
        read_grounding_file(_write(tmp_path, {"image": "a.jpg"}))
    with pytest.raises(DataError, match="unknown grounding split kind"):
        read_grounding_file(_write(tmp_path, [EVAL]), split_kind="test")
