"""Tests for the VQA / NLVR2 annotation loaders and the VQA predictions writer (vlp.data.downstream_formats)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vlp.data.downstream_formats import load_answer_list, load_nlvr, load_vqa, write_vqa_predictions
from vlp.errors import DataError

RAW = ["red"] * 7 + ["orange"] * 2 + ["blue"]


def write(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj))
    return path


def vqa_entry(**kw: Any) -> dict:
    return {"question_id": 5, "question": "what color is it", "answer": RAW, "image": "a.png", "dataset": "vqa", **kw}


WORLD = dict(seed=1, n_train=30, n_val=10, n_test=12, image_size=32)


# ---------------------------------------------------------------- VQA


def test_vqa_weights_in_order_of_first_appearance(tmp_path: Path) -> None:
    shuffled = ["orange", "red", "red", "blue", "red", "orange", "red", "red", "red", "red"]
    f = write(tmp_path / "vqa.json", [vqa_entry(answer=shuffled, question_type="color")])
    (q,) = load_vqa([f])
    assert q.answers == ("orange", "red", "blue") and q.weights == (0.2, 0.7, 0.1)
    assert q.raw_answers == tuple(shuffled) and q.question_type == "color"
    (q,) = load_vqa([write(tmp_path / "v2.json", [vqa_entry()])])
    assert q.answers == ("red", "orange", "blue") and q.weights == (0.7, 0.2, 0.1)
    assert q.raw_answers == tuple(RAW) and q.question_id == 5 and q.question_type is None
    assert q.dataset == "vqa" and q.image == str(tmp_path / "a.png") and q.origin == f"{tmp_path / 'v2.json'} entry 0"
    (q,) = load_vqa([write(tmp_path / "v3.json", [vqa_entry(answer=["yes", "no"])])])
    assert q.weights == (0.5, 0.5)


def test_vg_entries_and_image_roots(tmp_path: Path) -> None:
    f = write(
        tmp_path / "mix.json",
        [
            {"question": "what is on the table", "answer": "cup", "image": "vg/1.jpg", "dataset": "vg"},
            {
                "question_id": "q7",
                "question": "is it red",
                "answer": ["yes"] * 10,
                "image": "coco/2.jpg",
            },  # dataset defaults to vqa
        ],
    )
    vg, vqa = load_vqa([f])
    assert vg.answers == ("cup",) and vg.weights == (0.5,) and vg.raw_answers == ("cup",)
    assert vg.question_id is None and vg.dataset == "vg"
    assert vqa.dataset == "vqa" and vqa.question_id == "q7" and vqa.weights == (1.0,)
    assert (vg.image, vqa.image) == (str(tmp_path / "vg/1.jpg"), str(tmp_path / "coco/2.jpg"))
    vg, vqa = load_vqa([f], image_root="/data/coco")
    assert (vg.image, vqa.image) == ("/data/coco/vg/1.jpg", "/data/coco/coco/2.jpg")
    vg, vqa = load_vqa([f], image_root="/data/coco", vg_root="/data/vg")
    assert (vg.image, vqa.image) == ("/data/vg/vg/1.jpg", "/data/coco/coco/2.jpg")


def test_vqa_test_file_needs_require_answers_false(tmp_path: Path) -> None:
    entry = vqa_entry()
    del entry["answer"]
    f = write(tmp_path / "test.json", [entry])
    with pytest.raises(DataError, match=r"test\.json: entry 0: missing key 'answer'"):
        load_vqa([f])
    (q,) = load_vqa([f], require_answers=False)
    assert q.answers == q.weights == q.raw_answers == () and q.question_id == 5


def test_world_files_round_trip(world: dict[str, Path]) -> None:
    for key in ("vqa_train", "vqa_val", "vqa_test_annotations"):
        records = json.loads(world[key].read_text())
        questions = load_vqa([world[key]])
        assert len(questions) == len(records) == 3 * {"vqa_train": 30, "vqa_val": 10}.get(key, 12)
        for q, r in zip(questions, records):
            assert (q.question, q.question_id, q.question_type) == (r["question"], r["question_id"], r["question_type"])
            assert q.raw_answers == tuple(r["answer"]) and abs(sum(q.weights) - 1.0) < 1e-9
            assert Path(q.image).is_file()
    test = load_vqa([world["vqa_test"]], require_answers=False)
    assert [q.question_id for q in test] == [q.question_id for q in load_vqa([world["vqa_test_annotations"]])]
    assert all(q.answers == () and q.question_type is None for q in test)
    with pytest.raises(DataError, match=r"vqa_test\.json: entry 0: missing key 'answer'"):
        load_vqa([world["vqa_test"]])
    assert load_answer_list(world["answer_list"]) == json.loads(world["answer_list"].read_text())
    for key in ("nlvr_train", "nlvr_dev", "nlvr_test"):
        records = json.loads(world[key].read_text())
        items = load_nlvr(world[key])
        assert [i.label for i in items] == [int(r["label"] == "True") for r in records]
        assert [i.sentence for i in items] == [r["sentence"] for r in records]
        assert all(Path(p).is_file() for i in items for p in i.images)


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            {"question_id": 1, "answer": RAW, "image": "a.png"},
            r"entry 1: missing key 'question' \(expected a non-empty question string\)",
        ),
        (
            {"question_id": 1, "question": "  ", "answer": RAW, "image": "a.png"},
            r"entry 1: key 'question' is an empty string",
        ),
        (
            {"question_id": 1, "question": 3, "answer": RAW, "image": "a.png"},
            r"entry 1: key 'question' is int, expected a non-empty question string",
        ),
        (
            {"question": "q", "answer": RAW, "image": "a.png"},
            r"entry 1: missing key 'question_id' \(expected an int or string question id\)",
        ),
        (
            {"question_id": 1.5, "question": "q", "answer": RAW, "image": "a.png"},
            r"entry 1: key 'question_id' is float",
        ),
        (
            {"question_id": 1, "question": "q", "answer": "red", "image": "a.png"},
            r"entry 1: key 'answer' is str, expected a non-empty list of annotator answer strings",
        ),
        (
            {"question_id": 1, "question": "q", "answer": [], "image": "a.png"},
            r"entry 1: key 'answer' must be a non-empty list of annotator answer strings",
        ),
        (
            {"question_id": 1, "question": "q", "answer": ["red", 2], "image": "a.png"},
            r"entry 1: key 'answer' must be a non-empty list",
        ),
        (
            {"question": "q", "answer": ["cup"], "image": "a.png", "dataset": "vg"},
            r"entry 1: key 'answer' is list, expected an answer string \(VG-QA\)",
        ),
        (
            {"question_id": 1, "question": "q", "answer": RAW},
            r"entry 1: missing key 'image' \(expected an image path string\)",
        ),
        (
            {"question_id": 1, "question": "q", "answer": RAW, "image": "a.png", "dataset": "gqa"},
            r"entry 1: key 'dataset' is 'gqa', expected \"vqa\" or \"vg\"",
        ),
        (
            {"question_id": 1, "question": "q", "answer": RAW, "image": "a.png", "question_type": 4},
            r"entry 1: key 'question_type' is int, expected a string",
        ),
    ],
)
def test_bad_vqa_entries(tmp_path: Path, entry: dict, message: str) -> None:
    f = write(tmp_path / "bad_vqa.json", [vqa_entry(), entry])
    with pytest.raises(DataError, match=r"bad_vqa\.json: " + message):
        load_vqa([f])


def test_bad_vqa_files(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('[{"question": "q",}]')
    with pytest.raises(DataError, match=r"broken\.json: line 1 column 19: invalid JSON"):
        load_vqa([bad])
    with pytest.raises(DataError, match=r"obj\.json: expected a JSON list of entries, got dict"):
        load_vqa([write(tmp_path / "obj.json", {"questions": []})])
    with pytest.raises(DataError, match=r"no VQA questions in .*empty\.json"):
        load_vqa([write(tmp_path / "empty.json", [])])
    with pytest.raises(DataError, match=r"annotation file not found: .*missing\.json"):
        load_vqa([tmp_path / "missing.json"])


# ---------------------------------------------------------------- answer list


def test_answer_list(tmp_path: Path) -> None:
    assert load_answer_list(write(tmp_path / "answers.json", ["yes", "no", "2"])) == ["yes", "no", "2"]
    with pytest.raises(DataError, match=r"answers\.json: entry 3: duplicate answer 'no' \(first at entry 1\)"):
        load_answer_list(write(tmp_path / "answers.json", ["yes", "no", "2", "no", "yes"]))
    with pytest.raises(DataError, match=r"answers\.json: entry 1: 3 is not an answer \(expected a non-empty string\)"):
        load_answer_list(write(tmp_path / "answers.json", ["yes", 3]))
    with pytest.raises(DataError, match=r"answers\.json: entry 0: '' is not an answer"):
        load_answer_list(write(tmp_path / "answers.json", [""]))
    with pytest.raises(DataError, match=r"answers\.json: expected a non-empty JSON list of answer strings"):
        load_answer_list(write(tmp_path / "answers.json", {"yes": 0}))


# ---------------------------------------------------------------- NLVR2


def nlvr_entry(**kw: Any) -> dict:
    return {"images": ["l.png", "r.png"], "sentence": "both images contain a dog", "label": "True", **kw}


def test_nlvr_labels_and_paths(tmp_path: Path) -> None:
    f = write(
        tmp_path / "nlvr.json",
        [
            nlvr_entry(),
            nlvr_entry(label="False", identifier="dev-1-0"),
            nlvr_entry(label=True),
            nlvr_entry(label=False, images=["/abs/a.png", "b.png"]),
        ],
    )
    items = load_nlvr(f)
    assert [i.label for i in items] == [1, 0, 1, 0]
    assert items[0].images == (str(tmp_path / "l.png"), str(tmp_path / "r.png"))
    assert items[3].images == ("/abs/a.png", str(tmp_path / "b.png"))
    assert items[1].origin == f"{f} entry 1" and items[1].sentence == "both images contain a dog"
    assert load_nlvr(f, image_root="/data/nlvr2")[0].images == ("/data/nlvr2/l.png", "/data/nlvr2/r.png")


@pytest.mark.parametrize(
    "entry, message",
    [
        (nlvr_entry(label="true"), r"entry 1: key 'label' is 'true', expected \"True\", \"False\", true or false"),
        (nlvr_entry(label=1), r"entry 1: key 'label' is 1, expected"),
        ({"images": ["l.png", "r.png"], "sentence": "s"}, r"entry 1: missing key 'label'"),
        (
            nlvr_entry(images=["a.png", "b.png", "c.png"]),
            r"entry 1: key 'images' must be a list of exactly 2 image path strings, got 3 items",
        ),
        (nlvr_entry(images="a.png"), r"entry 1: key 'images' is str, expected a list of exactly 2 image path strings"),
        (nlvr_entry(images=["a.png", 2]), r"entry 1: key 'images' must be a list of exactly 2 image path strings"),
        (
            {"images": ["l.png", "r.png"], "label": "True"},
            r"entry 1: missing key 'sentence' \(expected a non-empty sentence string\)",
        ),
        (nlvr_entry(sentence=""), r"entry 1: key 'sentence' is an empty string"),
    ],
)
def test_bad_nlvr_entries(tmp_path: Path, entry: dict, message: str) -> None:
    f = write(tmp_path / "bad_nlvr.json", [nlvr_entry(), entry])
    with pytest.raises(DataError, match=r"bad_nlvr\.json: " + message):
        load_nlvr(f)


def test_bad_nlvr_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"empty\.json: no entries"):
        load_nlvr(write(tmp_path / "empty.json", []))
    bad = tmp_path / "broken.json"
    bad.write_text('[{"images": ["a", "b"]')
    with pytest.raises(DataError, match=r"broken\.json: line 1 column 23: invalid JSON"):
        load_nlvr(bad)


# ---------------------------------------------------------------- predictions


def test_write_vqa_predictions(tmp_path: Path) -> None:
    out = tmp_path / "results" / "vqa_result.json"
    assert write_vqa_predictions(out, [3, "q4", 5], ["red", "2", "yes"]) == out
    assert json.loads(out.read_text()) == [
        {"question_id": 3, "answer": "red"},
        {"question_id": "q4", "answer": "2"},
        {"question_id": 5, "answer": "yes"},
    ]
    assert [p.name for p in out.parent.iterdir()] == ["vqa_result.json"]  # no temporary file left
    with pytest.raises(DataError, match=r"vqa_result\.json: refusing to overwrite an existing predictions file"):
        write_vqa_predictions(out, [1], ["no"])
    assert json.loads(out.read_text())[0]["answer"] == "red"
    with pytest.raises(DataError, match=r"other\.json: 2 question ids but 1 answers"):
        write_vqa_predictions(tmp_path / "other.json", [1, 2], ["no"])
    with pytest.raises(DataError, match=r"other\.json: prediction 1: answer is int, expected a string"):
        write_vqa_predictions(tmp_path / "other.json", [1, 2], ["no", 3])
    with pytest.raises(DataError, match=r"prediction 0: question id True is bool"):
        write_vqa_predictions(tmp_path / "other.json", [True], ["no"])
    assert not (tmp_path / "other.json").exists()


def test_predictions_round_trip_with_world(world: dict[str, Path], tmp_path: Path) -> None:
    test = load_vqa([world["vqa_test"]], require_answers=False)
    scored = {q.question_id: q for q in load_vqa([world["vqa_test_annotations"]])}
    best = [max(zip(scored[q.question_id].weights, scored[q.question_id].answers))[1] for q in test]
    out = write_vqa_predictions(tmp_path / "pred.json", [q.question_id for q in test], best)
    preds = json.loads(out.read_text())
    assert len(preds) == 36 and [p["question_id"] for p in preds] == [q.question_id for q in test]
    # the official VQA accuracy min(1, #annotators agreeing / 3) of the majority answers
    acc = sum(min(1.0, scored[p["question_id"]].raw_answers.count(p["answer"]) / 3) for p in preds) / len(preds)
    assert acc == 1.0
