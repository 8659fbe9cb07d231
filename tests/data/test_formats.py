import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vlp.data.datasets import ImageTextDataset
from vlp.data.formats import load_graded_relevance, load_pairs, load_relevance, load_retrieval_split, resolve_image
from vlp.errors import DataError
from vlp.preprocess.transforms import pre_caption


def write(path, obj):
    path.write_text(json.dumps(obj))
    return path


def test_pre_caption_albef_rules():
    assert pre_caption("A Man's  hat, (red)!  on-the/left <person>\n") == "a mans hat red on the left person"
    assert pre_caption(" ".join(str(i) for i in range(40))) == " ".join(str(i) for i in range(30))


def test_pretrain_and_retrieval_train_formats_load_through_one_path(tmp_path):
    a = write(
        tmp_path / "coco.json",
        [{"image": "/abs/x.jpg", "caption": "a cat"}, {"image": "y.jpg", "caption": ["one", "two"]}],
    )
    b = write(
        tmp_path / "coco_train.json",
        [{"image": "z.jpg", "caption": "c1", "image_id": 7}, {"image": "z.jpg", "caption": "c2", "image_id": 7}],
    )
    s = load_pairs([a, b])
    assert [x.image for x in s] == [
        "/abs/x.jpg",
        str(tmp_path / "y.jpg"),
        str(tmp_path / "z.jpg"),
        str(tmp_path / "z.jpg"),
    ]
    assert s[1].captions == ("one", "two")
    assert s[2].image_key == s[3].image_key != s[0].image_key
    s2 = load_pairs([a], image_root="/data")
    assert s2[1].image == "/data/y.jpg"


def test_image_paths_resolve_as_pathlib_does():
    """``resolve_image`` joins plain paths as strings (fast at millions of entries) and must give
    exactly ``pathlib``'s result for every path, normalised or not."""
    parts = ["/", "//", ".", "..", "a", "b.jpg", "./", "x/", "é"]
    roots = [Path(r) for r in (".", "/", "//", "/data", "rel/dir", "a//b/./", "..")]
    for image in ("".join(p) for k in (1, 2, 3) for p in itertools.product(parts, repeat=k)):
        for root in roots:
            want = str(Path(image) if Path(image).is_absolute() else root / image)
            assert resolve_image(image, root) == want, (image, root)


def test_retrieval_split_maps(tmp_path):
    f = write(tmp_path / "test.json", [{"image": "a.jpg", "caption": ["x", "y"]}, {"image": "b.jpg", "caption": ["z"]}])
    sp = load_retrieval_split(f)
    assert sp.texts == ["x", "y", "z"] and sp.txt2img == [0, 0, 1] and sp.img2txt == [[0, 1], [2]]


@pytest.mark.parametrize(
    "content, message",
    [
        (
            '[{"image": "a.jpg", "caption": "x"},\n {"image": "b.jpg" "caption": "y"}]',
            r"line 2 column \d+: invalid JSON",
        ),
        ('{"image": "a.jpg"}', "expected a JSON list"),
        ('[{"image": "a.jpg", "caption": "x"}, {"caption": "y"}]', r"entry 1: missing key 'image'"),
        ('[{"image": "a.jpg", "caption": 3}]', r"entry 0: key 'caption' is int"),
        ('[{"image": "a.jpg", "caption": []}]', r"entry 0: key 'caption' must be"),
        ('[{"image": "a.jpg", "caption": "x", "image_id": [1]}]', r"entry 0: key 'image_id'"),
    ],
)
def test_malformed_annotation_names_file_and_entry(tmp_path, content, message):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(DataError, match=message) as e:
        load_pairs([f])
    assert "bad.json" in str(e.value)


def test_missing_image_names_annotation_entry_and_path(tmp_path):
    Image.new("RGB", (20, 16)).save(tmp_path / "ok.png")
    f = write(tmp_path / "ann.json", [{"image": "ok.png", "caption": "a"}, {"image": "gone.png", "caption": "b"}])
    ds = ImageTextDataset(load_pairs([f]), transform=lambda im: im.size)
    assert ds[0]["image"] == (20, 16)
    with pytest.raises(DataError, match=r"ann\.json entry 1: image file not found: .*gone\.png"):
        ds[1]


def test_relevance_validation(tmp_path):
    split_file = write(tmp_path / "t.json", [{"image": "a", "caption": ["x", "y"]}, {"image": "b", "caption": ["z"]}])
    sp = load_retrieval_split(split_file)
    good = {"format": "vlp-relevance-v1", "texts": ["x", "y", "z"], "relevant_images": [[0, 1], [0], [1]]}
    assert load_relevance(write(tmp_path / "r.json", good), sp) == [[0, 1], [0], [1]]
    bad = dict(good, relevant_images=[[1], [0], [1]])
    with pytest.raises(DataError, match=r"relevant_images\[0\] does not contain the text's own image 0"):
        load_relevance(write(tmp_path / "r2.json", bad), sp)
    with pytest.raises(DataError, match="has 2 entries, expected 3"):
        load_relevance(write(tmp_path / "r3.json", dict(good, relevant_images=[[0], [0]])), sp)
    with pytest.raises(DataError, match="does not match the captions"):
        load_relevance(write(tmp_path / "r4.json", dict(good, texts=["x", "q", "z"])), sp)


def test_relevance_v2_lists_per_direction_and_non_queries(tmp_path):
    from vlp.data.relevance import Relevance, load_relevance_file, relevance_record

    split_file = write(tmp_path / "t.json", [{"image": "a", "caption": ["x", "y"]}, {"image": "b", "caption": ["z"]}])
    sp = load_retrieval_split(split_file)
    # text 1 is no query (empty list) and text 2's list lacks its own image 1: both fine in v2
    good = relevance_record("t.json", ["x", "y", "z"], 2, [[1, 0], [], [0]], [[2], []], "eccv-caption")
    assert good["format"] == "vlp-relevance-v2" and good["relevant_images"] == [[0, 1], [], [0]]
    got = load_relevance_file(write(tmp_path / "r.json", good), sp)
    assert got == Relevance([[0, 1], [], [0]], [[2], []], "eccv-caption")
    assert load_relevance(tmp_path / "r.json", sp) == [[0, 1], [], [0]]
    no_texts = {k: v for k, v in good.items() if k != "relevant_texts"}
    assert load_relevance_file(write(tmp_path / "n.json", no_texts), sp).texts is None  # the transpose
    for bad, message in (
        (dict(good, relevant_texts=[[2]]), r"key 'relevant_texts' has 1 entries, expected 2 \(images in "),
        (dict(good, relevant_texts=[[3], []]), r"relevant_texts\[0\]: expected a list of text indices in \[0, 3\)"),
        (dict(good, relevant_images=[[0], [], [2]]), r"relevant_images\[2\]: expected a list of image indices"),
        (dict(good, format="vlp-relevance-v3"), "one of vlp-relevance-v1, vlp-relevance-v2"),
        (dict(good, format="vlp-relevance-v1", relevant_images=[[0], [0], [1]]), "'relevant_texts' needs"),
    ):
        with pytest.raises(DataError, match=message):
            load_relevance_file(write(tmp_path / "bad.json", bad), sp)


@pytest.fixture()
def split3x2(tmp_path):
    # 2 images, 3 texts: graded files must be [3, 2]
    return load_retrieval_split(
        write(tmp_path / "t.json", [{"image": "a", "caption": ["x", "y"]}, {"image": "b", "caption": ["z"]}])
    )


def test_graded_relevance_loads(tmp_path, split3x2):
    arr = np.array([[1.0, 0.5], [1.0, 0.0], [0.25, 1.0]], dtype=np.float64)
    np.save(tmp_path / "g.npy", arr)
    g = load_graded_relevance(tmp_path / "g.npy", split3x2)
    assert g.dtype == torch.float32 and g.shape == (3, 2)
    assert torch.equal(g, torch.tensor(arr, dtype=torch.float32))
    np.save(tmp_path / "i.npy", np.array([[3, 0], [2, 1], [0, 3]], dtype=np.int64))  # integer grades are fine
    assert load_graded_relevance(tmp_path / "i.npy", split3x2)[0, 0] == 3.0


@pytest.mark.parametrize(
    "content, message",
    [
        (np.ones((2, 3), np.float32), r"shape \(2, 3\) does not match .*t\.json: expected \(3, 2\)"),
        (
            np.ones(6, np.float32),
            r"expected a 2-D array \[texts, images\] of shape \(3, 2\), got a 1-D array of shape \(6,\)",
        ),
        (np.ones((3, 2, 1), np.float32), r"got a 3-D array"),
        (
            np.array([[1, 0], [0, -0.5], [1, -1]], np.float32),
            r"negative value -0\.5 at row 1 \(text\), column 1 \(image\)",
        ),
        (np.array([[1, 0], [0, 1], [np.nan, 1]], np.float32), r"non-finite value nan at row 2 \(text\), column 0"),
        (np.array([["a", "b"], ["c", "d"], ["e", "f"]]), r"expected numbers, got dtype <U1"),
        (b"not numpy at all", r"cannot read a \.npy array"),
        (None, r"graded relevance file not found"),
    ],
)
def test_graded_relevance_errors_name_the_file(tmp_path, split3x2, content, message):
    f = tmp_path / "graded_bad.npy"
    if isinstance(content, bytes):
        f.write_bytes(content)
    elif content is not None:
        np.save(f, content)
    with pytest.raises(DataError, match=message) as e:
        load_graded_relevance(f, split3x2)
    assert "graded_bad.npy" in str(e.value)


def test_graded_relevance_npz_is_refused(tmp_path, split3x2):
    np.savez(tmp_path / "g.npz", g=np.ones((3, 2)))
    with pytest.raises(DataError, match=r"g\.npz: expected a \.npy array"):
        load_graded_relevance(tmp_path / "g.npz", split3x2)


@pytest.mark.parametrize("bad", ["...", "?!", "\x00\x00", "\u200b", "- / -"])
def test_a_caption_cleaning_empties_is_left_out_of_training_by_the_checks_rule(tmp_path, bad):
    """The JSON loader (training, make-shards) applies the rule the check and the shard reader
    apply: a caption ALBEF's cleaning leaves no words of would train as [CLS][SEP]."""
    from vlp.data.formats import load_pairs_checked, no_words_problem

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    ann = [{"image": "a.png", "caption": ["a red circle", bad]}, {"image": "a.png", "caption": bad}]
    (tmp_path / "p.json").write_text(json.dumps(ann))
    assert no_words_problem(bad) is not None
    table, dropped = load_pairs_checked([tmp_path / "p.json"], on_bad="skip")
    assert [s.captions for s in table] == [("a red circle",)]
    assert (dropped.entries, dropped.captions) == (1, 1)
    assert "has no words left after ALBEF cleaning" in str(dropped.problems[0])
    with pytest.raises(DataError, match=r"p\.json: entry 0: key 'caption' item 1 .* has no words left"):
        load_pairs([tmp_path / "p.json"])


@pytest.mark.parametrize(
    "text", ["a", "A-b", "...x", "<person>", "@", "é", "\ta\n", "x" * 5, " ".join(["..."] * 40) + " a", "a\x00"]
)
def test_the_fast_no_words_path_agrees_with_the_cleaning(text):
    from vlp.data.formats import _is_word_char, no_words_problem

    slow = any(map(_is_word_char, pre_caption(text)))
    assert (no_words_problem(text) is None) == slow
