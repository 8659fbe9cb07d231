"""`vlp prepare folder|csv` (issue 54): your own images and captions -> one annotation file that
`vlp data check`, the pretraining loader and the retrieval-split loader read from any working
directory; what cannot be used is left out, each named in a warning and counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from vlp.cli import main
from vlp.data.check import check_annotations
from vlp.data.formats import load_pairs, load_retrieval_split
from vlp.errors import ConfigError, DataError
from vlp.prepare import csv_pairs, image_folder
from vlp.prepare.own_data import csv_separator


def photo(path: Path, caption: str | None = None, colour: str = "red") -> Path:
    """A 20 px image at ``path`` and, unless None, its caption file beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (20, 20), colour).save(path)
    if caption is not None:
        path.with_suffix(".txt").write_text(caption, encoding="utf-8")
    return path


def warnings_of(prepared) -> list[str]:
    return [str(p) for p in prepared.problems]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Four usable images (one nested two deep, one a PNG in upper case, one with two captions) and
    one of each thing left out."""
    d = tmp_path / "photos"
    photo(d / "000001.jpg", "a red square\n")
    photo(d / "000002.jpg", "a green square\n\n  a square of green  \n", "green")
    photo(d / "trip" / "day1" / "beach.JPG", "sand and sea", "yellow")
    photo(d / "b.png", "\ufeffa blue square", "blue")  # a byte-order mark, as some editors write
    photo(d / "no_caption.jpg")
    photo(d / "empty.jpg", " \n\n")
    photo(d / "dots.jpg", "...")
    (d / "fake.jpg").write_text("not an image")
    (d / "fake.txt").write_text("a caption of no image")
    (d / "orphan.txt").write_text("a caption alone")
    (d / "notes.pdf").write_bytes(b"%PDF")
    photo(d / ".thumbs" / "000001.jpg", "hidden folders are passed over")
    return d


def test_folder_pairs_each_image_with_its_caption_lines(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "ann" / "photos.json"
    prepared = image_folder(folder, out)
    entries = json.loads(out.read_text())
    assert entries == [
        {"image": str(folder.resolve() / "000001.jpg"), "caption": ["a red square"]},
        {"image": str(folder.resolve() / "000002.jpg"), "caption": ["a green square", "a square of green"]},
        {"image": str(folder.resolve() / "b.png"), "caption": ["a blue square"]},
        {"image": str(folder.resolve() / "trip/day1/beach.JPG"), "caption": ["sand and sea"]},
    ]
    assert prepared.counts == {
        "images": 8,
        "entries": 4,
        "captions": 5,
        "no_caption": 1,
        "empty_caption": 2,
        "bad_captions": 1,
        "bad_caption_files": 0,
        "bad_images": 1,
        "captions_without_image": 1,
        "other_files": 1,
    }
    assert warnings_of(prepared) == [
        f"{folder / 'dots.txt'}: warning: line 1: caption '...' has no words left after ALBEF cleaning "
        "(pre_caption), expected a text with words; line left out",
        f"{folder / 'dots.txt'}: warning: no caption in it (empty or refused lines); dots.jpg left out",
        f"{folder / 'empty.txt'}: warning: no caption in it (empty or refused lines); empty.jpg left out",
        f"{folder / 'fake.jpg'}: warning: fake.jpg is not an image Pillow can identify; left out",
        f"{folder / 'no_caption.jpg'}: warning: no caption file no_caption.txt beside it; left out",
        f"{folder / 'orphan.txt'}: warning: a caption file with no image of the same name beside it",
    ]


def test_the_file_loads_and_checks_from_another_working_directory(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(folder.parent)
    out = Path("photos.json")  # written with a relative --out, from the folder's parent, by a relative DIR
    image_folder("photos", out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    ann = folder.parent / "photos.json"
    report = check_annotations([ann])
    assert report.ok and report.images_checked == 4 and report.warnings == 0
    assert [len(s.captions) for s in load_pairs([ann], image_root="/no/such/root")] == [1, 2, 1, 1]  # absolute
    split = load_retrieval_split(ann)  # one entry per image with its caption list: an evaluation split too
    assert (len(split.images), len(split.texts), split.img2txt[1]) == (4, 5, [1, 2])


def test_vlp_prepare_folder_prints_the_warnings_and_counts(folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "photos.json"
    assert main(["prepare", "folder", str(folder), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"{folder / 'dots.txt'}: warning: line 1: caption '...'")
    assert printed[-2].startswith("folder: images=8, entries=4, captions=5, no_caption=1, empty_caption=2")
    assert printed[-1] == f"wrote {out}" and out.is_file()


def test_a_folder_with_no_usable_image_is_one_error_naming_why(tmp_path: Path, capsys) -> None:
    d = tmp_path / "photos"
    photo(d / "a.jpg")
    photo(d / "b.jpg", "")
    with pytest.raises(DataError, match=r"photos: no image with a caption found \(2 images; .*left out: .*b\.txt"):
        image_folder(d, tmp_path / "out.json")
    assert main(["prepare", "folder", str(tmp_path / "nothing"), "--out", str(tmp_path / "o.json")]) == 2
    assert "vlp: error: image folder not found:" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "o.json").exists()


def test_a_caption_file_not_utf8_leaves_its_image_out(tmp_path: Path) -> None:
    d = tmp_path / "photos"
    photo(d / "a.jpg", "fine")
    photo(d / "b.jpg").with_suffix(".txt").write_bytes(b"caf\xe9")
    prepared = image_folder(d, tmp_path / "out.json")
    assert prepared.counts["entries"] == 1 and prepared.counts["bad_caption_files"] == 1
    assert warnings_of(prepared) == [f"{d / 'b.txt'}: warning: not UTF-8 text (byte 3); its image is left out"]


# ----------------------------------------------------------------------------- open_clip's CSV


def write_csv(path: Path, rows: list[list[str]], sep: str = "\t") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(sep.join(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def images(tmp_path: Path) -> Path:
    d = tmp_path / "data" / "images"
    for name, colour in (("a.jpg", "red"), ("b.jpg", "green"), ("c.jpg", "blue")):
        photo(d / name, colour=colour)
    return d


def test_csv_with_open_clips_defaults_groups_the_rows_of_an_image(images: Path, tmp_path: Path) -> None:
    f = images.parent / "train.csv"  # the last row: an absolute path to the first row's image
    f.write_text(
        f"filepath\ttitle\nimages/a.jpg\ta red square\nimages/b.jpg\ta green square\n{images}/a.jpg\tred again\n"
    )
    prepared = csv_pairs(f, tmp_path / "out.json")
    assert json.loads((tmp_path / "out.json").read_text()) == [
        {"image": str(images.resolve() / "a.jpg"), "caption": ["a red square", "red again"]},
        {"image": str(images.resolve() / "b.jpg"), "caption": ["a green square"]},
    ]
    assert prepared.counts == dict(rows=3, entries=2, captions=3, bad_rows=0, bad_images=0, bad_captions=0)
    assert prepared.problems == []


def test_csv_with_commas_custom_keys_and_quoted_fields(images: Path, tmp_path: Path) -> None:
    f = images.parent / "pairs.csv"
    f.write_text('id,caption,path\n1,"a red square, small",images/a.jpg\n2,"blue, ""big""",images/c.jpg\n')
    csv_pairs(f, tmp_path / "out.json", img_key="path", caption_key="caption", separator=",")
    entries = json.loads((tmp_path / "out.json").read_text())
    assert [(Path(e["image"]).name, e["caption"]) for e in entries] == [
        ("a.jpg", ["a red square, small"]),
        ("c.jpg", ['blue, "big"']),
    ]


def test_csv_bad_rows_are_left_out_naming_their_lines(images: Path, tmp_path: Path) -> None:
    f = write_csv(
        images.parent / "train.csv",
        [
            ["filepath", "title"],
            ["images/a.jpg", "a red square"],
            ["images/missing.jpg", "no such file"],
            [""],
            ["images/b.jpg", "   "],
            ["images/b.jpg"],
            ["", "no image"],
            ["images/c.jpg", "?!"],
            ["images/c.jpg", "a blue square", "extra"],
        ],
    )
    prepared = csv_pairs(f, tmp_path / "out.json")
    missing = images.resolve() / "missing.jpg"
    assert warnings_of(prepared) == [
        f"{f}: warning: line 3: image {missing} does not exist; row left out",
        f"{f}: warning: line 5: caption '' is empty; row left out",
        f"{f}: warning: line 6: 1 field, expected 2 (the header's); row left out",
        f"{f}: warning: line 7: empty image path; row left out",
        f"{f}: warning: line 8: caption '?!' has no words left after ALBEF cleaning (pre_caption), expected a text "
        "with words; row left out",
        f"{f}: warning: line 9: 3 fields, expected 2 (the header's); row left out",
    ]
    assert [p.line for p in prepared.problems] == [3, 5, 6, 7, 8, 9]
    assert prepared.counts == {
        "rows": 7,
        "entries": 1,
        "captions": 1,
        "bad_rows": 3,
        "bad_images": 1,
        "bad_captions": 2,
    }


def test_a_missing_column_is_one_error_naming_the_file_and_its_columns(images: Path, tmp_path: Path, capsys) -> None:
    f = write_csv(images.parent / "train.csv", [["image", "title"], ["images/a.jpg", "red"]])
    with pytest.raises(DataError) as e:
        csv_pairs(f, tmp_path / "out.json")
    assert str(e.value) == (
        f"{f}: no column 'filepath' (--csv-img-key); its columns are ['image', 'title'] (read with separator '\\t')"
    )
    comma = write_csv(images.parent / "comma.csv", [["filepath", "title"], ["images/a.jpg", "red"]], sep=",")
    assert main(["prepare", "csv", str(comma), "--out", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vlp: error: {comma}: no columns 'filepath' (--csv-img-key), 'title' (--csv-caption-key)")
    assert "the header holds ',': is the separator --csv-separator ','?" in err
    assert not (tmp_path / "out.json").exists()


def test_vlp_prepare_csv_from_another_directory_resolves_against_the_csvs_folder(
    images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    f = write_csv(
        images.parent / "train.csv", [["filepath", "title"], ["images/a.jpg", "red"], ["images/nope.jpg", "x"]]
    )
    monkeypatch.chdir(tmp_path)
    rel = f.relative_to(tmp_path)
    assert main(["prepare", "csv", str(rel), "--out", "out.json", "--csv-separator", "\\t"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        f"{rel}: warning: line 3: image {images.resolve() / 'nope.jpg'} does not exist; row left out",
        "csv: rows=2, entries=1, captions=1, bad_rows=0, bad_images=1, bad_captions=0",
        "wrote out.json",
    ]
    assert [s.image for s in load_pairs([tmp_path / "out.json"])] == [str(images.resolve() / "a.jpg")]


def test_csv_separator_is_one_character_or_backslash_t() -> None:
    assert csv_separator("\\t") == csv_separator("\t") == "\t" and csv_separator(",") == ","
    with pytest.raises(ConfigError, match=r"--csv-separator: expected one character .*got ';;'"):
        csv_separator(";;")


def test_an_empty_or_undecodable_csv_is_one_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DataError, match="empty.csv: empty file, expected a header row"):
        csv_pairs(empty, tmp_path / "out.json")
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"filepath\ttitle\na.jpg\tcaf\xe9\n")
    with pytest.raises(DataError, match=r"latin.csv: line \d+: cannot read as CSV"):
        csv_pairs(latin, tmp_path / "out.json")
