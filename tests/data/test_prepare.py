"""`vlp prepare`: miniature official releases -> vlp files, read back with vlp's loaders."""

import json

import pytest
from PIL import Image

from vlp import prepare
from vlp.cli import main
from vlp.data.downstream_formats import load_answer_list, load_nlvr, load_vqa
from vlp.data.formats import load_pairs, load_retrieval_split
from vlp.errors import DataError


def dump(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def png(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (20, 20), (200, 10, 10)).save(path)
    return path


def karpathy_coco():
    def img(split, folder, cocoid, caps):
        return {
            "filepath": folder,
            "filename": f"COCO_{folder}_{cocoid:012d}.jpg",
            "split": split,
            "cocoid": cocoid,
            "imgid": cocoid,
            "sentids": [],
            "sentences": [{"raw": c, "tokens": c.split()} for c in caps],
        }

    return {
        "dataset": "coco",
        "images": [
            img("train", "train2014", 9, ["A cat.", "a cat sits"]),
            img("restval", "val2014", 42, ["a dog runs"]),
            img("val", "val2014", 391895, ["a man riding a bike", "bike ride"]),
            img("test", "val2014", 7, ["t0", "t1", "t2"]),
            img("test", "val2014", 8, ["u0"]),
        ],
    }


def test_coco_karpathy(tmp_path):
    src = dump(tmp_path / "dataset_coco.json", karpathy_coco())
    root = tmp_path / "coco"
    for e in karpathy_coco()["images"]:
        png(root / e["filepath"] / e["filename"])
    counts = prepare.coco_karpathy(src, root, tmp_path / "out")
    assert counts == {
        "train_images": 2,
        "train_captions": 3,
        "val_images": 1,
        "val_captions": 2,
        "test_images": 2,
        "test_captions": 4,
    }
    train = load_pairs([tmp_path / "out/coco_train.json"], image_root=root)
    assert [s.captions for s in train] == [("A cat.",), ("a cat sits",), ("a dog runs",)]
    assert train[0].image == str(root / "train2014/COCO_train2014_000000000009.jpg")
    assert train[2].image == str(root / "val2014/COCO_val2014_000000000042.jpg")
    assert train[0].image_key == train[1].image_key != train[2].image_key
    raw = json.loads((tmp_path / "out/coco_train.json").read_text())
    assert [e["image_id"] for e in raw] == ["coco_9", "coco_9", "coco_42"]
    val = load_retrieval_split(tmp_path / "out/coco_val.json", root)
    assert val.images == [str(root / "val2014/COCO_val2014_000000391895.jpg")]
    assert val.texts == ["a man riding a bike", "bike ride"]
    test = load_retrieval_split(tmp_path / "out/coco_test.json", root)
    assert test.texts == ["t0", "t1", "t2", "u0"] and test.txt2img == [0, 0, 0, 1]


def test_coco_karpathy_missing_image(tmp_path):
    src = dump(tmp_path / "dataset_coco.json", karpathy_coco())
    with pytest.raises(DataError, match="5 of 5 images not found"):
        prepare.coco_karpathy(src, tmp_path / "nothing", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_coco_karpathy_malformed(tmp_path):
    data = karpathy_coco()
    del data["images"][3]["sentences"][1]["raw"]
    src = dump(tmp_path / "dataset_coco.json", data)
    with pytest.raises(DataError, match=r"dataset_coco.json: images\[3\].sentences\[1\]: missing key 'raw'"):
        prepare.coco_karpathy(src, None, tmp_path / "out")
    data = karpathy_coco()
    data["images"][0]["split"] = "dev"
    with pytest.raises(DataError, match=r"dataset_coco.json: images\[0\]: key 'split' is 'dev'"):
        prepare.coco_karpathy(dump(src, data), None, tmp_path / "out")


def karpathy_flickr():
    def img(split, name, caps):
        return {"filename": name, "split": split, "imgid": 0, "sentences": [{"raw": c} for c in caps]}

    return {
        "dataset": "flickr30k",
        "images": [
            img("train", "1000092795.jpg", ["two men", "men outside"]),
            img("val", "10002456.jpg", ["v0", "v1"]),
            img("test", "1007129816.jpg", ["w0"]),
        ],
    }


def test_flickr30k_karpathy(tmp_path):
    src = dump(tmp_path / "dataset_flickr30k.json", karpathy_flickr())
    counts = prepare.flickr30k_karpathy(src, None, tmp_path / "out")
    assert counts["train_captions"] == 2 and counts["val_images"] == 1 and counts["test_captions"] == 1
    train = load_pairs([tmp_path / "out/flickr30k_train.json"], image_root=tmp_path)
    assert [s.image for s in train] == [str(tmp_path / "flickr30k-images/1000092795.jpg")] * 2
    assert [json.loads((tmp_path / "out/flickr30k_train.json").read_text())[k]["image_id"] for k in (0, 1)] == [
        "flickr30k_1000092795"
    ] * 2
    test = load_retrieval_split(tmp_path / "out/flickr30k_test.json", tmp_path)
    assert test.images == [str(tmp_path / "flickr30k-images/1007129816.jpg")] and test.texts == ["w0"]
    data = karpathy_flickr()
    del data["images"][1]["filename"]
    with pytest.raises(DataError, match=r"dataset_flickr30k.json: images\[1\]: missing key 'filename'"):
        prepare.flickr30k_karpathy(dump(src, data), None, tmp_path / "out2")


def img2dataset(root, rows, ok):
    """img2dataset output for ``rows`` (caption, url): row k downloaded when k in ``ok``
    (shard size 2, so keys 000000000, 000000001 in 00000/, 000010000 in 00001/ ...)."""
    for k, (caption, url) in enumerate(rows):
        shard, idx = divmod(k, 2)
        key = f"{shard:05d}{idx:04d}"
        status = "success" if k in ok else "failed_to_download"
        dump(
            root / f"{shard:05d}" / f"{key}.json",
            {"url": url, "caption": caption, "key": key, "status": status, "error_message": None if k in ok else "404"},
        )
        if k in ok:
            png(root / f"{shard:05d}" / f"{key}.jpg")


def test_cc3m(tmp_path):
    rows = [("a dog on a beach", "http://x/a.jpg"), ("red car", "http://x/b.jpg"), ("blue sky", "http://x/c.jpg")]
    tsv = tmp_path / "Train_GCC-training.tsv"
    tsv.write_text("".join(f"{c}\t{u}\n" for c, u in rows))
    img2dataset(tmp_path / "cc3m", rows, ok={0, 2})
    counts = prepare.cc3m(tsv, tmp_path / "cc3m", tmp_path / "cc3m_train.json")
    assert counts == {"rows": 3, "entries": 2, "missing_images": 1}
    pairs = load_pairs([tmp_path / "cc3m_train.json"])
    assert [s.captions for s in pairs] == [("a dog on a beach",), ("blue sky",)]
    assert [s.image for s in pairs] == [
        str((tmp_path / "cc3m/00000/000000000.jpg").resolve()),
        str((tmp_path / "cc3m/00001/000010000.jpg").resolve()),
    ]
    # an img2dataset header line is skipped
    tsv.write_text("caption\turl\n" + "".join(f"{c}\t{u}\n" for c, u in rows))
    assert prepare.cc3m(tsv, tmp_path / "cc3m", tmp_path / "cc3m_2.json")["rows"] == 3


def test_cc3m_malformed(tmp_path):
    tsv = tmp_path / "Train_GCC-training.tsv"
    tsv.write_text("ok\thttp://x/a.jpg\nno url here\n")
    img2dataset(tmp_path / "cc3m", [("ok", "http://x/a.jpg")], ok={0})
    with pytest.raises(DataError, match="Train_GCC-training.tsv: line 2: expected 2 tab-separated fields"):
        prepare.cc3m(tsv, tmp_path / "cc3m", tmp_path / "out.json")
    tsv.write_text("ok\thttp://x/a.jpg\n")
    dump(tmp_path / "cc3m/00000/000000001.json", {"caption": "x", "status": "success"})
    with pytest.raises(DataError, match=r"000000001.json: sidecar: missing key 'url'"):
        prepare.cc3m(tsv, tmp_path / "cc3m", tmp_path / "out.json")


def test_sbu(tmp_path):
    caps = ["Man sits on a bench.", "Sunset over the lake", "a tree"]
    urls = ["http://s/1.jpg", "http://s/2.jpg", "http://s/3.jpg"]
    ctxt = tmp_path / "SBU_captioned_photo_dataset_captions.txt"
    utxt = tmp_path / "SBU_captioned_photo_dataset_urls.txt"
    ctxt.write_text("\n".join(caps) + "\n")
    utxt.write_text("\n".join(urls) + "\n")
    img2dataset(tmp_path / "sbu", list(zip(caps, urls)), ok={1, 2})
    counts = prepare.sbu(ctxt, utxt, tmp_path / "sbu", tmp_path / "sbu.json")
    assert counts == {"rows": 3, "entries": 2, "missing_images": 1}
    pairs = load_pairs([tmp_path / "sbu.json"])
    assert [s.captions for s in pairs] == [("Sunset over the lake",), ("a tree",)]
    assert pairs[0].image == str((tmp_path / "sbu/00000/000000001.jpg").resolve())
    utxt.write_text("\n".join(urls[:2]) + "\n")
    with pytest.raises(DataError, match="captions.txt has 3 lines but .*urls.txt has 2"):
        prepare.sbu(ctxt, utxt, tmp_path / "sbu", tmp_path / "sbu2.json")


def test_visual_genome(tmp_path):
    regions = dump(
        tmp_path / "region_descriptions.json",
        [
            {
                "id": 1,
                "regions": [
                    {"region_id": 1, "image_id": 1, "phrase": "a white clock", "x": 0, "y": 0, "width": 5, "height": 5},
                    {"region_id": 2, "image_id": 1, "phrase": "  tall tower ", "x": 0, "y": 0, "width": 5, "height": 5},
                    {"region_id": 3, "image_id": 1, "phrase": "a white clock", "x": 0, "y": 0, "width": 5, "height": 5},
                ],
            },
            {"id": 2, "regions": [{"region_id": 4, "image_id": 2, "phrase": "green grass"}]},
            {"id": 3, "regions": []},
        ],
    )
    data = dump(
        tmp_path / "image_data.json",
        [
            {
                "image_id": 1,
                "url": "https://cs.stanford.edu/people/rak248/VG_100K_2/1.jpg",
                "width": 800,
                "height": 600,
            },
            {"image_id": 2, "url": "https://cs.stanford.edu/people/rak248/VG_100K/2.jpg", "width": 800, "height": 600},
            {"image_id": 3, "url": "https://cs.stanford.edu/people/rak248/VG_100K/3.jpg"},
        ],
    )
    counts = prepare.visual_genome(regions, data, tmp_path / "vg", tmp_path / "vg.json")
    assert counts == {"images": 2, "captions": 3, "regions": 4, "dropped_phrases": 1}
    pairs = load_pairs([tmp_path / "vg.json"])
    assert [s.captions for s in pairs] == [("a white clock", "tall tower"), ("green grass",)]
    assert [s.image for s in pairs] == [
        str((tmp_path / "vg/VG_100K_2/1.jpg").resolve()),
        str((tmp_path / "vg/VG_100K/2.jpg").resolve()),
    ]
    dump(data, [{"image_id": 1, "url": "https://x/VG_100K_2/1.jpg"}, {"image_id": 2}])
    with pytest.raises(DataError, match=r"image_data.json: entry 1: missing key 'url'"):
        prepare.visual_genome(regions, data, tmp_path / "vg", tmp_path / "vg2.json")
    dump(data, [{"image_id": 1, "url": "https://x/VG_100K_2/1.jpg"}, {"image_id": 2, "url": "https://x/VG_100K/2.jpg"}])
    dump(regions, [{"regions": [{"image_id": 1}]}])
    with pytest.raises(DataError, match=r"region_descriptions.json: entry 0 regions\[0\]: missing key 'phrase'"):
        prepare.visual_genome(regions, data, tmp_path / "vg", tmp_path / "vg2.json")


def vqa_files(tmp_path):
    q = dump(
        tmp_path / "v2_OpenEnded_mscoco_train2014_questions.json",
        {
            "info": {},
            "task_type": "Open-Ended",
            "data_type": "mscoco",
            "data_subtype": "train2014",
            "questions": [
                {"image_id": 458752, "question": "What is this photo taken looking through?", "question_id": 458752000},
                {"image_id": 458752, "question": "Is it sunny?", "question_id": 458752001},
                {"image_id": 9, "question": "How many?", "question_id": 9000},
            ],
        },
    )

    def ans(*xs):
        return [{"answer": x, "answer_confidence": "yes", "answer_id": k + 1} for k, x in enumerate(xs)]

    a = dump(
        tmp_path / "v2_mscoco_train2014_annotations.json",
        {
            "annotations": [
                {
                    "question_id": 9000,
                    "image_id": 9,
                    "question_type": "how many",
                    "answer_type": "number",
                    "multiple_choice_answer": "2",
                    "answers": ans(*["2"] * 8, "3", "two"),
                },
                {
                    "question_id": 458752000,
                    "image_id": 458752,
                    "question_type": "what is this",
                    "answer_type": "other",
                    "multiple_choice_answer": "net",
                    "answers": ans(*["net"] * 7, "netting", "mesh", "net"),
                },
                {
                    "question_id": 458752001,
                    "image_id": 458752,
                    "question_type": "is it",
                    "answer_type": "yes/no",
                    "multiple_choice_answer": "yes",
                    "answers": ans(*["yes"] * 10),
                },
            ]
        },
    )
    return q, a


def test_vqa_v2(tmp_path):
    q, a = vqa_files(tmp_path)
    root = tmp_path / "coco"
    png(root / "train2014/COCO_train2014_000000458752.jpg")
    png(root / "train2014/COCO_train2014_000000000009.jpg")
    counts = prepare.vqa_v2(q, a, "train2014", root, tmp_path / "vqa_train.json")
    assert counts == {"questions": 3, "images": 2, "answered": 3}
    qs = load_vqa([tmp_path / "vqa_train.json"], image_root=root)
    assert [x.question_id for x in qs] == [458752000, 458752001, 9000]
    assert qs[0].image == str(root / "train2014/COCO_train2014_000000458752.jpg")
    assert qs[0].question == "What is this photo taken looking through?"
    assert qs[0].answers == ("net", "netting", "mesh") and qs[0].weights == pytest.approx((0.8, 0.1, 0.1))
    assert len(qs[0].raw_answers) == 10 and qs[0].dataset == "vqa"
    assert [x.question_type for x in qs] == ["other", "yes/no", "number"]
    assert qs[2].image == str(root / "train2014/COCO_train2014_000000000009.jpg")
    # answer list: one vote per question (multiple_choice_answer), most frequent first, ties by text
    counts = prepare.answer_list([a, a], 2, tmp_path / "answer_list.json")
    assert counts == {"answers": 2, "distinct": 3, "questions": 6, "covered": 4}
    assert load_answer_list(tmp_path / "answer_list.json") == ["2", "net"]


def test_vqa_v2_test_split(tmp_path):
    q = dump(
        tmp_path / "v2_OpenEnded_mscoco_test2015_questions.json",
        {"questions": [{"image_id": 262144, "question": "Is the ball flying?", "question_id": 262144000}]},
    )
    counts = prepare.vqa_v2(q, None, "test-dev2015", None, tmp_path / "vqa_test.json")
    assert counts == {"questions": 1, "images": 1, "answered": 0}
    with pytest.raises(DataError, match="missing key 'answer'"):
        load_vqa([tmp_path / "vqa_test.json"])
    (x,) = load_vqa([tmp_path / "vqa_test.json"], image_root=tmp_path, require_answers=False)
    assert x.image == str(tmp_path / "test2015/COCO_test2015_000000262144.jpg") and x.answers == ()


def test_vqa_v2_malformed(tmp_path):
    q, a = vqa_files(tmp_path)
    data = json.loads(a.read_text())
    del data["annotations"][1]["answers"][3]["answer"]
    dump(a, data)
    with pytest.raises(DataError, match=r"annotations.json: annotations\[1\].answers\[3\]: missing key 'answer'"):
        prepare.vqa_v2(q, a, "train2014", None, tmp_path / "out.json")
    data["annotations"].pop(1)
    dump(a, data)
    with pytest.raises(DataError, match=r"annotations.json: no annotation with question_id 458752000"):
        prepare.vqa_v2(q, a, "train2014", None, tmp_path / "out.json")
    dump(q, {"questions": [{"image_id": "x", "question": "q", "question_id": 1}]})
    with pytest.raises(DataError, match=r"questions.json: questions\[0\]: key 'image_id' is str"):
        prepare.vqa_v2(q, None, "val2014", None, tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()


def nlvr_lines(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_nlvr2(tmp_path):
    train = nlvr_lines(
        tmp_path / "train.json",
        [
            {
                "identifier": "train-10171-0-0",
                "sentence": "The left image has two dogs.",
                "label": "True",
                "directory": 54,
                "left_url": "http://l",
                "right_url": "http://r",
                "writer": "103",
                "synset": "dog",
            },
            {"identifier": "train-10171-0-1", "sentence": "No dogs.", "label": "False", "directory": 54},
        ],
    )
    counts = prepare.nlvr2(train, "train", tmp_path / "nlvr_train.json")
    assert counts == {"examples": 2, "true": 1, "false": 1}
    items = load_nlvr(tmp_path / "nlvr_train.json", image_root=tmp_path / "nlvr2")
    assert items[0].images == (
        str(tmp_path / "nlvr2/images/train/54/train-10171-0-img0.png"),
        str(tmp_path / "nlvr2/images/train/54/train-10171-0-img1.png"),
    )
    assert [i.label for i in items] == [1, 0] and items[1].sentence == "No dogs."
    dev = nlvr_lines(tmp_path / "dev.json", [{"identifier": "dev-850-0-3", "sentence": "s", "label": "False"}])
    root = tmp_path / "nlvr2"
    png(root / "dev/dev-850-0-img0.png")
    with pytest.raises(DataError, match="dev.json: 1 of 2 images not found"):
        prepare.nlvr2(dev, "dev", tmp_path / "nlvr_dev.json", image_root=root)
    png(root / "dev/dev-850-0-img1.png")
    prepare.nlvr2(dev, "dev", tmp_path / "nlvr_dev.json", image_root=root)
    (item,) = load_nlvr(tmp_path / "nlvr_dev.json", image_root=root)
    assert item.images == (str(root / "dev/dev-850-0-img0.png"), str(root / "dev/dev-850-0-img1.png"))
    assert item.label == 0


def test_nlvr2_malformed(tmp_path):
    bad = nlvr_lines(
        tmp_path / "test1.json",
        [
            {"identifier": "test1-0-0-0", "sentence": "s", "label": "True"},
            {"identifier": "test1-0-0-1", "sentence": "s", "label": "yes"},
        ],
    )
    with pytest.raises(DataError, match=r"test1.json: line 2: key 'label' is 'yes'"):
        prepare.nlvr2(bad, "test1", tmp_path / "out.json")
    bad = nlvr_lines(tmp_path / "train.json", [{"identifier": "train-1-0-0", "sentence": "s", "label": "True"}])
    with pytest.raises(DataError, match=r"train.json: line 1: missing key 'directory'"):
        prepare.nlvr2(bad, "train", tmp_path / "out.json")
    with pytest.raises(DataError, match=r"train.json: line 1: key 'identifier' is 'train-1-0-0', expected dev-N-N-N"):
        prepare.nlvr2(bad, "dev", tmp_path / "out.json")


def test_cli(tmp_path, capsys):
    src = dump(tmp_path / "dataset_coco.json", karpathy_coco())
    assert main(["prepare", "coco", str(src), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "coco: train_images=2, train_captions=3" in out and "coco_test.json" in out
    q, a = vqa_files(tmp_path)
    assert (
        main(
            [
                "prepare",
                "vqa",
                str(q),
                "--annotations",
                str(a),
                "--split",
                "train2014",
                "--out",
                str(tmp_path / "vqa_train.json"),
            ]
        )
        == 0
    )
    assert main(["prepare", "vqa-answers", str(a), "--top-k", "5", "--out", str(tmp_path / "answers.json")]) == 0
    assert load_answer_list(tmp_path / "answers.json") == ["2", "net", "yes"]
    train = nlvr_lines(tmp_path / "train.json", [{"identifier": "train-1-0-0", "sentence": "s", "label": "True"}])
    assert main(["prepare", "nlvr2", str(train), "--split", "train", "--out", str(tmp_path / "n.json")]) == 2
    assert "missing key 'directory'" in capsys.readouterr().err


def test_visual_genome_qa(tmp_path):
    from vlp.data.downstream_formats import load_vqa

    def qa(qid, iid, q, a):
        return {"qa_id": qid, "image_id": iid, "question": q, "answer": a, "a_objects": [], "q_objects": []}

    qas = dump(
        tmp_path / "question_answers.json",
        [
            {
                "id": 1,
                "qas": [
                    qa(10, 1, "What color is the clock? ", "White."),
                    qa(11, 1, "Where is the tower?", "Behind trees."),
                    qa(12, 1, "   ", "yes"),
                ],
            },
            {"id": 2, "qas": [qa(20, 2, "How many dogs?", "2")]},
            {"id": 3, "qas": []},
        ],
    )
    data = dump(
        tmp_path / "image_data.json",
        [
            {"image_id": 1, "url": "https://cs.stanford.edu/people/rak248/VG_100K_2/1.jpg"},
            {"image_id": 2, "url": "https://cs.stanford.edu/people/rak248/VG_100K/2.jpg"},
        ],
    )
    counts = prepare.visual_genome_qa(qas, data, tmp_path / "vg", tmp_path / "vg_qa.json")
    assert counts == {"questions": 3, "images": 2, "qas": 4, "empty": 1}
    entries = json.loads((tmp_path / "vg_qa.json").read_text())
    assert entries[0] == {
        "question": "What color is the clock?",
        "answer": "white",
        "dataset": "vg",
        "question_id": "vg_10",
        "image": str((tmp_path / "vg/VG_100K_2/1.jpg").resolve()),
    }
    questions = load_vqa([tmp_path / "vg_qa.json"])  # ALBEF's VG-QA format: one answer, weight 0.5
    assert [(q.answers, q.weights, q.dataset) for q in questions] == [
        (("white",), (0.5,), "vg"),
        (("behind trees",), (0.5,), "vg"),
        (("2",), (0.5,), "vg"),
    ]
    answers = dump(tmp_path / "answer_list.json", ["yes", "White", "2"])
    counts = prepare.visual_genome_qa(qas, data, tmp_path / "vg", tmp_path / "vg_qa2.json", answers)
    assert counts == {"questions": 2, "images": 2, "qas": 4, "empty": 1, "not_in_answer_list": 1}
    dump(qas, [{"id": 1, "qas": [{"qa_id": 1, "image_id": 1, "question": "q?"}]}])
    with pytest.raises(DataError, match=r"question_answers.json: entry 0 qas\[0\]: missing key 'answer'"):
        prepare.visual_genome_qa(qas, data, tmp_path / "vg", tmp_path / "vg_qa3.json")
    dump(qas, [{"id": 1, "qas": [qa(1, 7, "q?", "a")]}])
    with pytest.raises(DataError, match=r"image_id 7 is not in .*image_data.json"):
        prepare.visual_genome_qa(qas, data, tmp_path / "vg", tmp_path / "vg_qa3.json")
    assert not (tmp_path / "vg_qa3.json").exists()  # nothing written on bad input
    dump(qas, [{"id": 1, "qas": [qa(1, 1, "q?", "a")]}])
    assert (
        main(
            [
                "prepare",
                "vg-qa",
                str(qas),
                str(data),
                "--image-root",
                str(tmp_path / "vg"),
                "--out",
                str(tmp_path / "cli.json"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "cli.json").read_text())[0]["answer"] == "a"
