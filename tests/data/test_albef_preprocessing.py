"""``model.text.albef_compat``: text cleaning and token ids as ALBEF's own pipeline produces them.

ALBEF (dataset/utils.py, docs reference albef.md §9): ``pre_caption`` lower-cases, deletes
``, . ' ! ? " ( ) * # : ; ~``, turns ``-`` and ``/`` into spaces, ``<person>`` into ``person`` (one
pass), collapses runs of 2+ whitespace characters, strips, keeps 30 ``' '``-separated words.
``pre_question`` does the same deletions and ``-``/``/`` replacement, no ``<person>`` rule, no
collapsing, strips trailing spaces only (leading ones stay and count as empty words), keeps 30 words in
training and 50 at test. Token ids: ALBEF's tokenizer gives ``[CLS] pieces`` (no [SEP]); VQA
training questions are truncated at 25 tokens, test questions and NLVR2 sentences never.

Every expected string below is worked out by hand from those rules; the expected ids are
``[CLS]`` + the bert-base-uncased word pieces of that string (cut where ALBEF cuts).
"""

import pytest
import torch

from vlp.config import TextConfig
from vlp.data.downstream_formats import VQAQuestion
from vlp.data.nlvr import NLVRCollator
from vlp.data.vqa import VQACollator, VQADataset, pre_question
from vlp.preprocess.transforms import load_tokenizer, pre_caption, tokenize


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TextConfig(albef_compat=True))


def albef_ids(tok, text: str, max_len=None) -> list[int]:
    """ALBEF's forked BERT tokenizer: [CLS] + word pieces, truncated to max_len tokens, no [SEP]."""
    pieces = tok(text, add_special_tokens=False)["input_ids"]
    return [tok.cls_token_id, *pieces][:max_len]


def words(n: int) -> list[str]:
    """dog0 red1 cat2 car3 sky4 dog5 ...: two word pieces each (dog ##0)."""
    return [f"{w}{i}" for i, w in zip(range(n), ["dog", "red", "cat", "car", "sky"] * n)]


# ---------------------------------------------------------------------------------- strings


def test_pre_question_strings_in_albef_compat_mode():
    assert pre_question("A t-shirt/dress?", albef_compat=True) == "a t shirt dress"
    assert pre_question("Is the T-Shirt red / blue?  ", albef_compat=True) == "is the t shirt red   blue"
    # leading spaces stay (trailing ones go), and count as empty words before the word cut
    assert pre_question("  Why, here?", albef_compat=True) == "  why here"
    long = "  " + " ".join(words(60))  # 62 ' '-items: '', '', dog0 .. cat59
    assert pre_question(long, 50, albef_compat=True) == "  " + " ".join(words(48))
    assert pre_question(long, 30, albef_compat=True) == "  " + " ".join(words(28))
    # whitespace is not collapsed: each extra space is an empty word
    assert pre_question("what  color is it", 3, albef_compat=True) == "what  color"
    assert pre_question("<person> is here?", albef_compat=True) == "<person> is here"  # no <person> rule
    # vlp's own cleaning (albef_compat off) is unchanged
    assert pre_question("A t-shirt/dress?") == "a t-shirt/dress"
    assert pre_question("  Why, here?") == "why here"


def test_pre_caption_strings_in_albef_compat_mode():
    assert pre_caption("A t-shirt/dress?", albef_compat=True) == "a t shirt dress"
    assert pre_caption("<person> is here", albef_compat=True) == "person is here"
    assert pre_caption("<<person>> is here", albef_compat=True) == "<person> is here"  # one replacement pass
    assert pre_caption("  A  dog \t and   a\tcat.\n", albef_compat=True) == "a dog and a\tcat"  # lone tab kept
    # a lone tab joins two words into one ' '-separated word: 31 words survive the 30-word cut
    caption = "dog0\t" + " ".join(words(35)[1:])
    assert pre_caption(caption, albef_compat=True) == "dog0\t" + " ".join(words(31)[1:])
    # vlp's own cleaning (albef_compat off) is unchanged
    assert pre_caption("<<person>> is here") == "person is here"
    assert pre_caption(caption) == " ".join(words(30))


# ---------------------------------------------------------------------------------- token ids


def test_caption_ids_through_tokenize(tok):
    captions = ["A t-shirt/dress?", "<<person>> in a  T-shirt", "dog0\t" + " ".join(words(35)[1:])]
    albef = ["a t shirt dress", "<person> in a t shirt", "dog0\t" + " ".join(words(31)[1:])]
    got = tokenize(tok, captions, None)
    for row, mask, text in zip(got["input_ids"].tolist(), got["attention_mask"].tolist(), albef):
        want = albef_ids(tok, text)
        assert row[: sum(mask)] == want
    pretrain = tokenize(tok, captions, 25)  # ALBEF pretraining truncates at 25 tokens
    assert pretrain["input_ids"][2].tolist() == albef_ids(tok, albef[2], 25)


def vqa_question(text: str, qid: int, answers=("red",)) -> VQAQuestion:
    return VQAQuestion(
        text, "unused.png", tuple(answers), tuple(1.0 for _ in answers), (), qid, None, "vqa", f"q {qid}"
    )


class NoImage(VQADataset):
    def image(self, path, origin):
        return None


QUESTIONS = ["A t-shirt/dress?", "  " + " ".join(words(60)) + "?", "What  color is the (car)?"]


@pytest.mark.parametrize("train", [True, False])
def test_vqa_question_ids_train_and_test(tok, train):
    ds = NoImage([vqa_question(q, i) for i, q in enumerate(QUESTIONS)], lambda _im: torch.zeros(3, 2, 2), train=train)
    batch = VQACollator(tok, question_max_len=25, answer_max_len=10)([ds[0], ds[1], ds[2]])
    n = 28 if train else 48  # the two leading spaces take two of the 30 / 50 words
    albef = ["a t shirt dress", "  " + " ".join(words(n)), "what  color is the car"]
    cut = 25 if train else None  # ALBEF: training questions truncated at 25 tokens, test ones never
    for row, mask, text in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist(), albef):
        assert row[: sum(mask)] == albef_ids(tok, text, cut)
    assert len(albef_ids(tok, albef[1], cut)) == (25 if train else 1 + 2 * 48)  # "dog0" -> dog, ##0


def test_vqa_questions_of_the_api_path_are_test_questions(tok):
    """Items built outside :class:`VQADataset` (``VLPModel.answer``) carry raw questions: ALBEF's test path."""
    items = [
        {"image": torch.zeros(3, 2, 2), "question": q, "answers": [], "weights": [], "index": 0} for q in QUESTIONS
    ]
    batch = VQACollator(tok, 25, 10)(items)
    assert batch["input_ids"][1][: int(batch["attention_mask"][1].sum())].tolist() == albef_ids(
        tok, "  " + " ".join(words(48))
    )
    assert batch["input_ids"][0][: int(batch["attention_mask"][0].sum())].tolist() == albef_ids(tok, "a t shirt dress")


def test_nlvr_sentence_ids_cut_at_30_words_not_30_tokens(tok):
    sentence = "The left image has a T-shirt/dress and " + " ".join(words(35))  # 44 words once cleaned
    albef = "the left image has a t shirt dress and " + " ".join(words(21))  # 9 + 21 = 30 words
    items = [
        {"image0": torch.zeros(3, 2, 2), "image1": torch.zeros(3, 2, 2), "sentence": s, "label": 0}
        for s in (sentence, "Two dogs.")
    ]
    batch = NLVRCollator(tok, max_len=30)(items)  # the converted NLVR2 checkpoint's max_len
    want = albef_ids(tok, albef)
    assert len(want) == 1 + 9 + 2 * 21 and batch["input_ids"].shape == (2, len(want))
    assert batch["input_ids"][0].tolist() == want
    assert batch["input_ids"][1][: int(batch["attention_mask"][1].sum())].tolist() == albef_ids(tok, "two dogs")
    # vlp's own mode keeps its token limit
    plain = NLVRCollator(load_tokenizer(TextConfig()), max_len=30)(items)
    assert plain["input_ids"].shape == (2, 30)
