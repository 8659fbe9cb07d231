"""``vlp data check`` (vlp.data.check) and ``load_pairs(on_bad=...)``: every problem reported, with
file, entry, key and what was expected; images opened once, as training opens them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import vlp.data.check as check_mod
from vlp.cli import main
from vlp.data.check import CheckReport, Problem, check_annotations, detect_kind
from vlp.data.formats import load_pairs, load_pairs_checked
from vlp.errors import DataError
from vlp.world import generate_world

GOOD = {"image": "img/good.jpg", "caption": "a red circle"}


def write(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj))
    return path


def found(report: CheckReport) -> list[tuple]:
    """(entry, key, severity, message) of each problem, in report order."""
    return [(p.entry, p.key, p.severity, p.message) for p in report.problems]


@pytest.fixture()
def img(tmp_path: Path) -> Path:
    """tmp_path/img: good.jpg (64x64), trunc.jpg (its first half), empty.jpg (0 bytes), text.jpg
    (a text file), big.png (400x300), tiny.png (2x2)."""
    d = tmp_path / "img"
    d.mkdir()
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(d / "good.jpg", quality=90)
    data = (d / "good.jpg").read_bytes()
    (d / "trunc.jpg").write_bytes(data[: len(data) // 2])
    (d / "empty.jpg").write_bytes(b"")
    (d / "text.jpg").write_text("not an image\n")
    Image.new("RGB", (400, 300)).save(d / "big.png")
    Image.new("RGB", (2, 2)).save(d / "tiny.png")
    return d


# ---------------------------------------------------------------- file-level problems


def test_bad_json_reports_line_and_column_and_stops_that_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[{"image": "a.png", "caption": "x"},\n {"image": "b.png" "caption": "y"}]')
    good = write(tmp_path / "good.json", [{"image": "a.png", "caption": ""}])
    r = check_annotations([bad, good], images=False)
    assert [str(p) for p in r.problems] == [
        f"{bad}: line 2 column 20: invalid JSON (Expecting ',' delimiter)",
        f"{good} entry 0: key 'caption' is an empty string, expected a caption with words",
    ]
    assert (r.problems[0].entry, r.problems[0].line, r.problems[0].column) == (None, 2, 20)
    assert [str(f) for f in r.files] == [f"{bad}: not checked further", f"{good}: 1 entry (pairs, detected)"]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"image": "a.png", "caption": "x"}', "expected a JSON list of entries, got dict"),
        ("[]", "no entries (an empty list)"),
        (None, "annotation file not found"),
        (b'[{"caption": "caf\xe9"}]', "invalid JSON (not UTF-8 text: byte 17: invalid continuation byte)"),
    ],
)
def test_file_problems(tmp_path: Path, content: str | bytes | None, message: str) -> None:
    f = tmp_path / "ann.json"
    if isinstance(content, bytes):
        f.write_bytes(content)
    elif content is not None:
        f.write_text(content)
    r = check_annotations(f, images=False)
    assert [str(p) for p in r.problems] == [f"{f}: {message}"] and not r.ok


# ---------------------------------------------------------------- entry problems (pairs)

CAPTION = "a string or a non-empty list of strings"


@pytest.mark.parametrize(
    "entry, key, message",
    [
        ("a.png", None, "expected an object, got str"),
        ({"caption": "x"}, "image", "missing key 'image' (expected an image path string)"),
        ({"image": "a.png"}, "caption", f"missing key 'caption' (expected {CAPTION})"),
        ({"image": 7, "caption": "x"}, "image", "key 'image' is int, expected an image path string"),
        ({"image": "  ", "caption": "x"}, "image", "key 'image' is an empty string, expected an image path string"),
        ({"image": "a.png", "caption": 3}, "caption", f"key 'caption' is int, expected {CAPTION}"),
        ({"image": "a.png", "caption": []}, "caption", f"key 'caption' must be {CAPTION}, got an empty list"),
        (
            {"image": "a.png", "caption": ["ok", None]},
            "caption",
            "key 'caption' item 1 is NoneType, expected a caption string",
        ),
        (
            {"image": "a.png", "caption": ""},
            "caption",
            "key 'caption' is an empty string, expected a caption with words",
        ),
        (
            {"image": "a.png", "caption": " \t\n"},
            "caption",
            "key 'caption' is empty (whitespace only: ' \\t\\n'), expected a caption with words",
        ),
        (
            {"image": "a.png", "caption": "..."},
            "caption",
            "key 'caption' '...' has no words left after ALBEF cleaning (pre_caption), expected a text with words",
        ),
        (
            {"image": "a.png", "caption": ["ok", "?!"]},
            "caption",
            "key 'caption' item 1 '?!' has no words left after ALBEF cleaning (pre_caption), expected a text with words",
        ),
        (
            {"image": "a.png", "caption": "\x00\x00"},
            "caption",
            "key 'caption' '\\x00\\x00' has no words left after ALBEF cleaning (pre_caption), expected a text with words",
        ),
        (
            {"image": "a.png", "caption": "x", "image_id": [1]},
            "image_id",
            "key 'image_id' is list, expected a string or int",
        ),
        (
            {"image": "a.png", "caption": "x", "image_id": True},
            "image_id",
            "key 'image_id' is bool, expected a string or int",
        ),
    ],
    ids=[
        "not-object",
        "no-image",
        "no-caption",
        "image-int",
        "image-blank",
        "caption-int",
        "caption-empty-list",
        "caption-item-null",
        "caption-empty",
        "caption-whitespace",
        "caption-cleans-empty",
        "caption-item-cleans-empty",
        "caption-nul-only",
        "image_id-list",
        "image_id-bool",
    ],
)
def test_entry_problem(tmp_path: Path, entry: Any, key: str | None, message: str) -> None:
    f = write(tmp_path / "ann.json", [GOOD, entry])
    r = check_annotations(f, images=False)
    assert found(r) == [(1, key, "error", message)]
    assert str(r.problems[0]) == f"{f} entry 1: {message}"
    assert r.errors == 1 and not r.ok


def test_every_problem_of_every_entry_is_reported(tmp_path: Path) -> None:
    f = write(
        tmp_path / "ann.json",
        [
            {"caption": 3, "image_id": None},  # three problems in one entry
            GOOD,
            {"image": "a.png", "caption": ["fine", "", 4, "..."]},  # three bad captions of four
            [],
        ],
    )
    r = check_annotations(f, images=False)
    assert found(r) == [
        (0, "image", "error", "missing key 'image' (expected an image path string)"),
        (0, "caption", "error", f"key 'caption' is int, expected {CAPTION}"),
        (0, "image_id", "error", "key 'image_id' is NoneType, expected a string or int"),
        (2, "caption", "error", "key 'caption' item 1 is an empty string, expected a caption with words"),
        (2, "caption", "error", "key 'caption' item 2 is int, expected a caption string"),
        (
            2,
            "caption",
            "error",
            "key 'caption' item 3 '...' has no words left after ALBEF cleaning (pre_caption), expected a text with words",
        ),
        (3, None, "error", "expected an object, got list"),
    ]
    assert (r.entries, r.errors, r.warnings, r.images_checked) == (4, 7, 0, None)


# ---------------------------------------------------------------- images


@pytest.mark.parametrize(
    "name, severity, message",
    [
        ("missing.png", "error", "image file not found: {path}"),
        ("empty.jpg", "error", "cannot read image {path}: not an image file Pillow can identify"),
        ("text.jpg", "error", "cannot read image {path}: not an image file Pillow can identify"),
        ("trunc.jpg", "error", "cannot read image {path}: truncated or corrupt (image file is truncated"),
        (
            "big.png",
            "error",
            "image {path} is 400x300 RGB = 360000 bytes decoded, more than the limit of 300000 "
            "(an 8-bit RGB image of 100000 pixels: the decompression-bomb guard, data.max_image_pixels)",
        ),
        ("tiny.png", "warning", "image {path} is 2x2, shorter side below 16 pixels (training upscales it)"),
    ],
)
def test_image_problem(tmp_path: Path, img: Path, name: str, severity: str, message: str) -> None:
    f = write(tmp_path / "ann.json", [GOOD, {"image": f"img/{name}", "caption": "x"}])
    r = check_annotations(f, max_pixels=100_000)
    ((entry, key, sev, msg),) = found(r)
    assert (entry, key, sev) == (1, "image", severity)
    assert msg.startswith(message.format(path=img / name))
    assert r.images_checked == 2 and r.ok == (severity == "warning")


def test_each_image_is_opened_once_and_the_problem_counts_its_entries(
    tmp_path: Path, img: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real = check_mod.open_image
    monkeypatch.setattr(check_mod, "open_image", lambda path, *a, **k: opened.append(path) or real(path, *a, **k))
    a = write(tmp_path / "a.json", [{"image": "img/text.jpg", "caption": f"c{i}"} for i in range(7)] + [GOOD])
    b = write(tmp_path / "b.json", [GOOD, {"image": "img/text.jpg", "caption": "d"}])
    r = check_annotations([a, b], workers=2)
    assert sorted(opened) == [str(img / "good.jpg"), str(img / "text.jpg")] and r.images_checked == 2
    (p,) = r.problems
    assert (p.file, p.entry, p.count) == (str(a), 0, 8)
    assert p.message == (
        f"cannot read image {img / 'text.jpg'}: not an image file Pillow can identify "
        f"(used by 8 entries: entry 0, entry 1, entry 2, entry 3, entry 4, ...)"
    )


def test_image_root_and_no_images(tmp_path: Path, img: Path) -> None:
    (tmp_path / "sub").mkdir()
    f = write(
        tmp_path / "sub" / "ann.json",
        [{"image": "good.jpg", "caption": "x"}, {"image": str(img / "tiny.png"), "caption": "y"}],
    )
    # relative paths resolve against the file's folder by default, against image_root when given;
    # absolute paths stay as they are
    r = check_annotations(f)
    assert [(p.entry, p.severity) for p in r.problems] == [(0, "error"), (1, "warning")]
    assert r.problems[0].message == f"image file not found: {tmp_path / 'sub' / 'good.jpg'}"
    r = check_annotations(f, image_root=img)
    assert [(p.entry, p.severity) for p in r.problems] == [(1, "warning")]
    r = check_annotations(f, images=False)
    assert r.problems == [] and r.images_checked is None


# ---------------------------------------------------------------- kinds


def test_detect_kind_by_majority_of_entry_keys() -> None:
    pairs, vqa, nlvr = {"image": "a", "caption": "x"}, {"question": "q"}, {"images": [], "sentence": "s"}
    assert detect_kind([pairs, pairs, vqa]) == "pairs"
    assert detect_kind([vqa, vqa, pairs, 3]) == "vqa"
    assert detect_kind([nlvr, {"sentence": "s"}, pairs]) == "nlvr"
    assert detect_kind([pairs, vqa]) == "pairs" and detect_kind([vqa, nlvr]) == "vqa"  # ties
    assert detect_kind([]) == "pairs"


def test_retrieval_kind_requires_caption_lists(tmp_path: Path) -> None:
    f = write(tmp_path / "test.json", [{"image": "a.png", "caption": ["x", "y"]}, {"image": "b.png", "caption": "z"}])
    assert check_annotations(f, images=False).ok  # detected as pairs: a string caption is fine
    r = check_annotations(f, images=False, kind="retrieval")
    assert found(r) == [(1, "caption", "error", "key 'caption' is str, expected a non-empty list of strings")]
    assert str(r.files[0]) == f"{f}: 2 entries (retrieval)"


def test_vqa_entries(tmp_path: Path) -> None:
    f = write(
        tmp_path / "vqa.json",
        [
            {"question_id": 1, "question": "what color", "answer": ["red"] * 10, "image": "a.png"},
            {"question_id": 2, "question": "is it", "image": "a.png"},  # a test question: fine
            {"question": "?", "answer": "red", "image": "a.png", "dataset": "gqa"},
            {"question_id": 1.5, "question": "q", "answer": [], "image": "a.png", "question_type": 2},
        ],
    )
    r = check_annotations(f, images=False)
    assert r.files[0].kind == "vqa"
    assert found(r) == [
        (2, "dataset", "error", "key 'dataset' is 'gqa', expected \"vqa\" or \"vg\""),
        (2, "question_id", "error", "missing key 'question_id' (expected an int or string question id)"),
        (2, "answer", "error", "key 'answer' is str, expected a non-empty list of annotator answer strings (VQA)"),
        (
            2,
            "question",
            "error",
            "key 'question' '?' has no words left after ALBEF cleaning (pre_question), expected a text with words",
        ),
        (3, "question_id", "error", "key 'question_id' is float, expected an int or string question id"),
        (3, "question_type", "error", "key 'question_type' is int, expected a string"),
        (3, "answer", "error", "key 'answer' must be a non-empty list of annotator answer strings (VQA)"),
    ]


def test_nlvr_entries_and_both_images(tmp_path: Path, img: Path) -> None:
    f = write(
        tmp_path / "nlvr.json",
        [
            {"images": ["img/good.jpg", "img/tiny.png"], "sentence": "two dogs", "label": "True"},
            {"images": ["img/good.jpg"], "sentence": " ", "label": "yes"},
        ],
    )
    r = check_annotations(f)
    assert r.files[0].kind == "nlvr" and r.images_checked == 2
    assert found(r) == [
        (
            0,
            "images",
            "warning",
            f"image {img / 'tiny.png'} is 2x2, shorter side below 16 pixels (training upscales it)",
        ),
        (1, "images", "error", "key 'images' must be a list of exactly 2 image path strings, got 1 items"),
        (1, "sentence", "error", "key 'sentence' is an empty string, expected a non-empty sentence string"),
        (1, "label", "error", "key 'label' is 'yes', expected \"True\", \"False\", true or false"),
    ]


def test_kind_override_checks_by_that_loader(tmp_path: Path) -> None:
    f = write(tmp_path / "ann.json", [GOOD])
    r = check_annotations(f, images=False, kind="nlvr")
    assert [p.message for p in r.problems] == [
        "missing key 'images' (expected a list of exactly 2 image path strings)",
        "missing key 'sentence' (expected a non-empty sentence string)",
        'missing key \'label\' (expected "True", "False", true or false)',
    ]
    with pytest.raises(ValueError, match="kind must be one of"):
        check_annotations(f, kind="coco")


def test_a_generated_world_passes(tmp_path: Path) -> None:
    w = generate_world(tmp_path / "w", seed=0, n_train=6, n_val=2, n_test=3, image_size=32, progress=False)
    files = [w[k] for k in ("pretrain", "retrieval_train", "retrieval_test", "vqa_train", "vqa_test", "nlvr_dev")]
    r = check_annotations(files)
    assert r.problems == [] and r.ok
    assert [(f.kind, f.detected) for f in r.files] == [("pairs", True)] * 3 + [("vqa", True)] * 2 + [("nlvr", True)]
    assert r.images_checked == 6 + 3 + 2  # train (pretrain, retrieval_train, vqa_train), test, val (nlvr_dev)
    assert check_annotations(w["retrieval_test"], kind="retrieval").ok


# ---------------------------------------------------------------- command line


def test_cli_exit_status_and_output(tmp_path: Path, img: Path, capsys: pytest.CaptureFixture) -> None:
    good = write(tmp_path / "good.json", [GOOD, {"image": "img/tiny.png", "caption": ["x", "y"]}])
    assert main(["data", "check", str(good)]) == 0  # warnings allowed
    assert capsys.readouterr().out.splitlines() == [
        f"{good} entry 1: warning: image {img / 'tiny.png'} is 2x2, shorter side below 16 pixels (training upscales it)",
        f"{good}: 2 entries (pairs, detected)",
        "checked 1 file, 2 entries, 2 images: 0 errors, 1 warning",
    ]
    bad = write(tmp_path / "bad.json", [GOOD, {"image": "img/big.png", "caption": "  "}])
    assert main(["data", "check", str(good), str(bad), "--max-pixels", "100000"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{good} entry 1: warning: image {img / 'tiny.png'} is 2x2, shorter side below 16 pixels (training upscales it)",
        f"{bad} entry 1: key 'caption' is empty (whitespace only: '  '), expected a caption with words",
        f"{bad} entry 1: image {img / 'big.png'} is 400x300 RGB = 360000 bytes decoded, more than the limit of "
        "300000 (an 8-bit RGB image of 100000 pixels: the decompression-bomb guard, data.max_image_pixels)",
        f"{good}: 2 entries (pairs, detected)",
        f"{bad}: 2 entries (pairs, detected)",
        "checked 2 files, 4 entries, 3 images: 2 errors, 1 warning",
    ]
    assert main(["data", "check", str(bad), "--no-images", "--kind", "retrieval"]) == 1
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == "checked 1 file, 2 entries, images not checked: 2 errors, 0 warnings"
    )
    assert main(["data", "check", str(good), "--images", str(img)]) == 1  # img/img/... does not exist
    assert "checked 1 file, 2 entries, 2 images: 2 errors, 0 warnings" in capsys.readouterr().out
    assert main(["data", "check", str(good), "--max-pixels", "-1"]) == 2
    assert capsys.readouterr().err == "vlp: error: --max-pixels must be >= 0 (0: no limit), got -1\n"


def test_cli_json_report(tmp_path: Path, img: Path, capsys: pytest.CaptureFixture) -> None:
    f = write(
        tmp_path / "ann.json",
        [GOOD, {"image": "img/empty.jpg", "caption": 5}, {"image": "img/empty.jpg", "caption": "z"}],
    )
    out = tmp_path / "reports" / "check.json"
    assert main(["data", "check", str(f), "--json", str(out)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {out}"
    rep = json.loads(out.read_text())
    assert {k: rep[k] for k in ("format", "ok", "entries", "images_checked", "errors", "warnings")} == {
        "format": "vlp-data-check-v1",
        "ok": False,
        "entries": 3,
        "images_checked": 2,
        "errors": 2,
        "warnings": 0,
    }
    assert rep["files"] == [{"file": str(f), "kind": "pairs", "detected": True, "entries": 3}]
    assert rep["problems"] == [
        {
            "file": str(f),
            "entry": 1,
            "key": "caption",
            "message": f"key 'caption' is int, expected {CAPTION}",
            "severity": "error",
            "count": 1,
            "line": None,
            "column": None,
        },
        {
            "file": str(f),
            "entry": 1,
            "key": "image",
            "message": f"cannot read image {img / 'empty.jpg'}: not an image file Pillow can identify (used by 2 entries: "
            "entry 1, entry 2)",
            "severity": "error",
            "count": 2,
            "line": None,
            "column": None,
        },
    ]
    bad = tmp_path / "bad.json"
    bad.write_text('[\n  {"image": 1,,}\n]')
    assert main(["data", "check", str(bad), "--json", str(out)]) == 1
    (p,) = json.loads(out.read_text())["problems"]
    assert (p["entry"], p["line"], p["column"]) == (None, 2, 15)
    assert p["message"] == "line 2 column 15: invalid JSON (Expecting property name enclosed in double quotes)"
    assert [x.name for x in out.parent.iterdir()] == ["check.json"]  # atomic write: no temporary left


# ---------------------------------------------------------------- load_pairs(on_bad=...)


def test_load_pairs_raises_on_whitespace_only_captions(tmp_path: Path) -> None:
    f = write(tmp_path / "ann.json", [GOOD, {"image": "b.png", "caption": ["x", "\t "]}])
    with pytest.raises(
        DataError, match=r"ann\.json: entry 1: key 'caption' item 1 is empty \(whitespace only: '\\t '\)"
    ):
        load_pairs([f])


def test_load_pairs_skip_drops_bad_entries_and_captions(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    f = write(
        tmp_path / "ann.json",
        [
            GOOD,
            {"image": "b.png", "caption": ["keep", " ", 3, "also kept"]},  # two captions dropped, entry kept
            {"image": "c.png", "caption": "x", "image_id": [1]},  # dropped
            "d.png",  # dropped
            {"image": "e.png", "caption": ["", "  "]},  # no caption left: dropped
        ],
    )
    samples, dropped = load_pairs_checked([f], on_bad="skip")
    assert [(s.origin, s.captions) for s in samples] == [
        (f"{f} entry 0", ("a red circle",)),
        (f"{f} entry 1", ("keep", "also kept")),
    ]
    assert (dropped.entries, dropped.captions, len(dropped.problems)) == (3, 2, 6)
    assert capsys.readouterr().err == (
        f"vlp: warning: on_bad=skip left out 3 entries and 2 captions of kept entries with bad annotations: "
        f"{f}: entry 1: key 'caption' item 1 is empty (whitespace only: ' '), expected a caption with words; "
        f"{f}: entry 1: key 'caption' item 2 is int, expected a caption string; "
        f"{f}: entry 2: key 'image_id' is list, expected a string or int; "
        "and 3 more (`vlp data check` lists them all)\n"
    )
    assert load_pairs([f], on_bad="skip") == samples
    with pytest.raises(DataError, match=r"entry 1: key 'caption' item 1 is empty"):
        load_pairs([f])  # on_bad="raise" (the default): the first problem
    clean = write(tmp_path / "clean.json", [GOOD])
    capsys.readouterr()
    assert load_pairs_checked([clean], on_bad="skip")[1].problems == () and capsys.readouterr().err == ""
    with pytest.raises(DataError, match=r"no training entries in .*\(2 bad entries left out\)"):
        load_pairs([write(tmp_path / "none.json", [3, {"image": "a"}])], on_bad="skip")
    with pytest.raises(ValueError, match="on_bad must be one of"):
        load_pairs([clean], on_bad="ignore")


def test_problem_line_format() -> None:
    assert (
        str(Problem("a.json", None, None, "line 1 column 2: invalid JSON (x)"))
        == "a.json: line 1 column 2: invalid JSON (x)"
    )
    assert str(Problem("a.json", 4, "image", "tiny", "warning")) == "a.json entry 4: warning: tiny"
