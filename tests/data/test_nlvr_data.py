import random

import pytest
import torch
from PIL import Image
from torchvision.transforms import functional as TF

from vlp.config import TextConfig
from vlp.data.downstream_formats import NLVRItem
from vlp.data.nlvr import NLVRCollator, NLVRDataset, swap_left_right
from vlp.errors import DataError
from vlp.preprocess.transforms import load_tokenizer


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The left image has two dogs.", "The right image has two dogs."),
        ("Left: one bird, right: none", "Right: one bird, left: none"),
        ("LEFT and RIGHT", "RIGHT and LEFT"),
        (
            "the dog on the right's bowl is left, of the left-most cup",
            "the dog on the left's bowl is right, of the right-most cup",
        ),
        ("leftover food in a bright copyright box", "leftover food in a bright copyright box"),
        ("rightmost lefty Wright", "rightmost lefty Wright"),
        ("(left)", "(right)"),
        ("no sides here", "no sides here"),
    ],
)
def test_swap_left_right(text, expected):
    assert swap_left_right(text) == expected
    assert swap_left_right(swap_left_right(text)) == text


def write(tmp_path, name, colour):
    path = tmp_path / name
    Image.new("RGB", (8, 8), colour).save(path)
    return str(path)


def test_flip_swaps_images_iff_sentence_and_keeps_label(tmp_path):
    red, blue = write(tmp_path, "r.png", (255, 0, 0)), write(tmp_path, "b.png", (0, 0, 255))
    item = NLVRItem((red, blue), "The left image is red.", 1, "test entry 0")
    flipped = NLVRDataset([item], TF.to_tensor, flip=True, rng=random.Random(0))
    seen = {True: 0, False: 0}
    for _ in range(40):
        it = flipped[0]
        swapped = bool(it["image0"][2].mean() > 0.5)  # image 0 is the blue one
        assert it["sentence"] == ("The right image is red." if swapped else item.sentence)
        assert bool(it["image1"][0].mean() > 0.5) == swapped
        assert it["label"] == 1
        seen[swapped] += 1
    assert 8 <= seen[True] <= 32 and seen[True] + seen[False] == 40
    plain = NLVRDataset([item], TF.to_tensor)
    assert all(plain[0]["sentence"] == item.sentence and plain[0]["image0"][0].mean() > 0.5 for _ in range(10))
    assert len(plain) == 1


def test_missing_image_names_the_item(tmp_path):
    item = NLVRItem((str(tmp_path / "a.png"), str(tmp_path / "b.png")), "x", 0, "nlvr.json entry 3")
    with pytest.raises(DataError, match="nlvr.json entry 3"):
        NLVRDataset([item], TF.to_tensor)[0]


def test_collator():
    tok = load_tokenizer(TextConfig())
    img = torch.zeros(3, 4, 4)
    items = [
        {"image0": img, "image1": img + 1, "sentence": "The left image has two dogs.", "label": 1},
        {"image0": img + 2, "image1": img + 3, "sentence": " ".join(["dog"] * 50), "label": 0},
    ]
    batch = NLVRCollator(tok, max_len=8)(items)
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 0]
    assert batch["images0"].shape == (2, 3, 4, 4) and batch["images1"][1].max() == 3
    assert batch["input_ids"].shape == (2, 8) and batch["attention_mask"][0].tolist() == [1] * 8
    words = tok.convert_ids_to_tokens(batch["input_ids"][0].tolist())
    assert words == ["[CLS]", "the", "left", "image", "has", "two", "dogs", "[SEP]"]
