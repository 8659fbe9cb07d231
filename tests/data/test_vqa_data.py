import pytest
import torch
from PIL import Image
from torchvision.transforms import functional as TF

from vlp.config import TextConfig
from vlp.data.downstream_formats import VQAQuestion
from vlp.data.vqa import VQACollator, VQADataset, pre_question, tokenize_answers
from vlp.errors import DataError
from vlp.preprocess.transforms import load_tokenizer

CLS, SEP = 101, 102
RED, TWO, DOGS, YES = 2417, 2048, 6077, 2748  # bert-base-uncased ids


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TextConfig())


def test_pre_question_deletes_albef_characters():
    assert pre_question('What  "color" is the (car)?') == "what  color is the car"  # whitespace kept
    assert pre_question("Is it raining?!  ") == "is it raining"
    assert pre_question("a b c d", max_words=2) == "a b"
    assert pre_question(pre_question("Why? #1: no;~")) == pre_question("Why? #1: no;~") == "why 1 no"


def test_tokenize_answers_adds_cls_and_sep(tok):
    ids, mask = tokenize_answers(tok, ["red", "two dogs"], max_len=10)
    assert ids.tolist() == [[CLS, RED, SEP, 0], [CLS, TWO, DOGS, SEP]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    ids, _ = tokenize_answers(tok, ["two dogs"], max_len=3)  # truncation keeps [SEP] (the eos)
    assert ids.tolist() == [[CLS, TWO, SEP]]


def question(text, answers, weights, image, qid, raw=()) -> VQAQuestion:
    return VQAQuestion(text, str(image), tuple(answers), tuple(weights), tuple(raw), qid, None, "vqa", f"test {qid}")


def make_questions(tmp_path) -> list[VQAQuestion]:
    for i, c in enumerate(["red", "blue"]):
        Image.new("RGB", (20, 10), c).save(tmp_path / f"{i}.png")
    return [
        question("What color is the car?", ["red", "two dogs"], [0.6, 0.2], tmp_path / "0.png", 7),
        question("Is it raining?", ["yes"], [0.5], tmp_path / "1.png", 8),
        question("What color is the sky?", ["red", "yes", "two dogs"], [0.3, 0.3, 0.1], tmp_path / "1.png", 9),
    ]


def transform(im: Image.Image) -> torch.Tensor:
    return TF.to_tensor(im.resize((8, 8)))


def test_dataset_items_and_collated_batch(tmp_path, tok):
    ds = VQADataset(make_questions(tmp_path), transform, train=True)
    item = ds[2]
    assert item["question"] == "what color is the sky"
    assert item["answers"] == ["red", "yes", "two dogs"] and item["weights"] == pytest.approx([0.3, 0.3, 0.1])
    assert item["question_id"] == 9 and item["index"] == 2 and item["image"].shape == (3, 8, 8)
    batch = VQACollator(tok, question_max_len=25, answer_max_len=10)([ds[2], ds[0], ds[1]])
    assert all(isinstance(v, torch.Tensor) for v in batch.values())
    assert batch["images"].shape == (3, 3, 8, 8)
    assert batch["input_ids"].shape == (3, 7) and batch["input_ids"][0].tolist()[:3] == [CLS, 2054, 3609]
    assert batch["attention_mask"].sum(1).tolist() == [7, 7, 5]
    assert batch["answer_ids"].shape == (6, 4)
    assert batch["answer_ids"][:, 1].tolist() == [RED, YES, TWO, RED, TWO, YES]
    assert batch["answer_mask"].sum(1).tolist() == [3, 3, 4, 3, 4, 3]
    assert batch["answer_question"].tolist() == [0, 0, 0, 1, 1, 2]
    assert batch["answer_question"].dtype == torch.long
    assert batch["answer_weights"].tolist() == pytest.approx([0.3, 0.3, 0.1, 0.6, 0.2, 0.5])
    assert batch["answer_weights"].dtype == torch.float32
    assert batch["question_index"].tolist() == [2, 0, 1]
    short = VQACollator(tok, question_max_len=4)([ds[0]])
    assert short["input_ids"].tolist() == [[CLS, 2054, 3609, SEP]]


def test_eval_dataset_accepts_questions_without_answers(tmp_path, tok):
    qs = make_questions(tmp_path)
    test_q = question("Is it raining?", [], [], qs[0].image, 10)
    with pytest.raises(DataError, match="needs at least one answer"):
        VQADataset([test_q], transform, train=True)
    ds = VQADataset([test_q, qs[1]], transform, train=False)
    batch = VQACollator(tok, question_max_len=None)([ds[0], ds[1]])
    assert batch["answer_question"].tolist() == [1]
    assert batch["answer_ids"].tolist() == [[CLS, YES, SEP]]
    empty = VQACollator(tok)([ds[0]])
    assert empty["answer_ids"].shape == (0, 0) and empty["answer_question"].shape == (0,)
