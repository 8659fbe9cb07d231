"""SNLI-VE data: the ve_*.json reader and its errors, `vlp prepare snli-ve`, dataset and collator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vlp.cli import main
from vlp.config import TextConfig
from vlp.data.downstream_formats import VE_LABELS, load_ve
from vlp.data.ve import VECollator, VEDataset
from vlp.errors import DataError
from vlp.prepare import snli_ve
from vlp.preprocess.transforms import load_tokenizer


def _write(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


def test_labels_and_image_paths(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "ve.json",
        [
            {"image": "2248487956", "sentence": "a dog runs", "label": "contradiction"},
            {"image": "imgs/a.png", "sentence": "a cat", "label": "neutral"},
            {"image": "/abs/b.jpg", "sentence": "two cats", "label": "entailment"},
        ],
    )
    items = load_ve(f, image_root="/flickr")
    assert [it.label for it in items] == [0, 1, 2] and VE_LABELS == ("contradiction", "neutral", "entailment")
    # a bare Flickr30k id gets ALBEF's ".jpg"; paths with a suffix are kept; relative against image_root
    assert [it.image for it in items] == ["/flickr/2248487956.jpg", "/flickr/imgs/a.png", "/abs/b.jpg"]
    assert load_ve(f)[0].image == str(tmp_path / "2248487956.jpg")  # default root: the file's folder
    assert items[1].origin == f"{f} entry 1" and items[2].sentence == "two cats"


@pytest.mark.parametrize(
    "entry,message",
    [
        ({"sentence": "s", "label": "neutral"}, r"entry 0: missing key 'image'"),
        ({"image": "1", "label": "neutral"}, r"entry 0: missing key 'sentence'"),
        ({"image": "1", "sentence": "  ", "label": "neutral"}, r"entry 0: key 'sentence' is an empty string"),
        ({"image": "1", "sentence": "s"}, r"entry 0: missing key 'label' \(expected \"entailment\""),
        ({"image": "1", "sentence": "s", "label": "-"}, r"entry 0: key 'label' is '-', expected \"entailment\""),
        ({"image": 5, "sentence": "s", "label": "neutral"}, r"entry 0: key 'image' is int"),
        (["1", "s"], r"entry 0: expected an object, got list"),
    ],
)
def test_bad_entries(tmp_path: Path, entry, message: str) -> None:
    with pytest.raises(DataError, match=r"bad_ve\.json: " + message):
        load_ve(_write(tmp_path / "bad_ve.json", [entry]))


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"empty\.json: no entries"):
        load_ve(_write(tmp_path / "empty.json", []))
    with pytest.raises(DataError, match=r"obj\.json: expected a JSON list of entries, got dict"):
        load_ve(_write(tmp_path / "obj.json", {"a": 1}))


def _official(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def _row(fid, hyp: str, label: str) -> dict:
    return {"Flickr30K_ID": fid, "sentence1": "premise text", "sentence2": hyp, "gold_label": label, "pairID": "x"}


def test_prepare_snli_ve_counts_skips_and_writes_albef_format(tmp_path: Path) -> None:
    src = _official(
        tmp_path / "snli_ve_dev.jsonl",
        [
            _row("100", "a dog", "entailment"),
            _row(200, "no dog", "contradiction"),
            "",
            _row("300", "maybe a dog", "neutral"),
            _row("400", "unclear", "-"),
            _row("100", "two dogs", "entailment"),
        ],
    )
    counts = snli_ve(src, tmp_path / "ve_dev.json")
    assert counts == {"examples": 4, "contradiction": 1, "neutral": 1, "entailment": 2, "skipped": 1}
    out = json.loads((tmp_path / "ve_dev.json").read_text())
    assert out[1] == {"image": "200", "sentence": "no dog", "label": "contradiction"}
    assert [e["image"] for e in out] == ["100", "200", "300", "100"]
    assert [it.label for it in load_ve(tmp_path / "ve_dev.json")] == [2, 0, 1, 2]  # readable by vlp


def test_prepare_snli_ve_errors_name_file_and_line(tmp_path: Path) -> None:
    bad = _official(tmp_path / "a.jsonl", [_row("1", "x", "neutral"), {"sentence2": "x", "gold_label": "neutral"}])
    with pytest.raises(DataError, match=r"a\.jsonl: line 2: missing key 'Flickr30K_ID'"):
        snli_ve(bad, tmp_path / "o.json")
    bad = _official(tmp_path / "b.jsonl", [_row("1", "x", "neutral"), "{not json"])
    with pytest.raises(DataError, match=r"b\.jsonl: line 2: invalid JSON"):
        snli_ve(bad, tmp_path / "o.json")
    bad = _official(tmp_path / "c.jsonl", [_row("1.jpg", "x", "neutral")])
    with pytest.raises(DataError, match=r"c\.jsonl: line 1: key 'Flickr30K_ID' is '1\.jpg'"):
        snli_ve(bad, tmp_path / "o.json")
    only_dash = _official(tmp_path / "d.jsonl", [_row("1", "x", "-")])
    with pytest.raises(DataError, match=r"d\.jsonl: no examples .*\(1 skipped\)"):
        snli_ve(only_dash, tmp_path / "o.json")
    images = tmp_path / "flickr"
    images.mkdir()
    (images / "1.jpg").write_bytes(b"")
    two = _official(tmp_path / "e.jsonl", [_row("1", "x", "neutral"), _row("2", "y", "neutral")])
    with pytest.raises(DataError, match=r"e\.jsonl: 1 of 2 images not found under .*flickr, e\.g\. 2\.jpg"):
        snli_ve(two, tmp_path / "o.json", image_root=images)
    assert not (tmp_path / "o.json").exists()


def test_prepare_snli_ve_command(tmp_path: Path, capsys) -> None:
    train = _official(tmp_path / "snli_ve_train.jsonl", [_row("1", "x", "neutral"), _row("2", "y", "entailment")])
    test = _official(tmp_path / "snli_ve_test.jsonl", [_row("3", "z", "contradiction")])
    out = tmp_path / "ann"
    assert main(["prepare", "snli-ve", str(train), str(test), "--out", str(out)]) == 0
    assert len(json.loads((out / "ve_train.json").read_text())) == 2
    assert json.loads((out / "ve_test.json").read_text())[0]["label"] == "contradiction"
    assert "skipped=0" in capsys.readouterr().out
    wrong = _official(tmp_path / "snli_ve_val.jsonl", [_row("1", "x", "neutral")])
    assert main(["prepare", "snli-ve", str(wrong), "--out", str(out)]) != 0
    assert "expected an official file named snli_ve_train.jsonl" in capsys.readouterr().err


def test_dataset_and_collator(tmp_path: Path) -> None:
    from PIL import Image

    Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "a.png")
    f = _write(
        tmp_path / "ve.json",
        [
            {"image": "a.png", "sentence": "there is a red shape", "label": "entailment"},
            {"image": "a.png", "sentence": "there is no red circle at all here", "label": "neutral"},
        ],
    )
    ds = VEDataset(load_ve(f), lambda im: torch.full((3, 4, 4), float(im.getpixel((0, 0))[0])))
    tok = load_tokenizer(TextConfig())
    batch = VECollator(tok, max_len=5)([ds[0], ds[1]])
    assert batch["images"].shape == (2, 3, 4, 4) and float(batch["images"][0, 0, 0, 0]) == 255.0
    assert batch["labels"].tolist() == [2, 1] and batch["input_ids"].shape == (2, 5)  # truncated at max_len
    assert batch["attention_mask"][0].tolist() == [1, 1, 1, 1, 1] and int(batch["bad_samples"]) == 0
