"""Property-based tests (hypothesis) of annotation parsing (``load_pairs``, ``read_json``) and of
ALBEF caption cleaning and tokenization (``pre_caption``, ``tokenize``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from vlp.config import TextConfig
from vlp.data.formats import load_pairs, load_pairs_checked
from vlp.errors import DataError
from vlp.preprocess.transforms import DELETE_CHARS, load_tokenizer, pre_caption, tokenize

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for all examples (hypothesis runs many examples per test, files are overwritten)."""
    return tmp_path_factory.mktemp("props")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TextConfig())


# ---------------------------------------------------------------- load_pairs on arbitrary JSON

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
texts = st.text(alphabet=st.sampled_from(" \t\n\u3000.,?!-/abcXYZé猫<person>"), max_size=8) | st.text(max_size=8)
good_text = st.text(alphabet="ab c.\té猫", min_size=1, max_size=8).filter(str.strip)
good_entry = st.fixed_dictionaries(
    {
        "image": st.text(alphabet="ab/.", min_size=1, max_size=5),
        "caption": good_text | st.lists(good_text, min_size=1, max_size=3),
    },
    optional={"image_id": st.integers() | st.text(max_size=3)},
)
captions = texts | st.lists(texts | good_text | json_values, max_size=3) | json_values
near_valid = st.fixed_dictionaries(
    {"image": st.text(alphabet="ab/. ", max_size=5) | json_values, "caption": captions},
    optional={"image_id": st.integers() | st.text(max_size=3) | json_values, "extra": json_values},
)
files = st.lists(good_entry | near_valid | json_values, max_size=5) | json_values


def _load(path: Path, on_bad: str = "raise") -> list | DataError:
    """The samples, or the DataError; any other exception fails the test."""
    try:
        return load_pairs([path], on_bad=on_bad)
    except DataError as e:
        return e


def _valid_samples(samples: list) -> None:
    for s in samples:
        assert isinstance(s.image, str) and isinstance(s.image_key, str) and s.captions
        assert all(isinstance(c, str) and c.strip() for c in s.captions)


@FAST
@given(value=files)
def test_load_pairs_on_arbitrary_json_returns_good_samples_or_raises_data_error(folder: Path, value: Any) -> None:
    f = folder / "ann.json"
    f.write_text(json.dumps(value))
    strict, skipped = _load(f), _load(f, on_bad="skip")
    event(f"raise: {type(strict).__name__}, skip: {type(skipped).__name__}")  # --hypothesis-show-statistics
    for result in (strict, skipped):
        if isinstance(result, list):
            _valid_samples(result)
    if not isinstance(value, list):
        assert isinstance(strict, DataError) and isinstance(skipped, DataError)
        return
    # an entry that loads on its own is never dropped by on_bad="skip", and comes out the same
    single = folder / "one.json"
    kept = {s.origin: s for s in skipped} if isinstance(skipped, list) else {}
    for i, entry in enumerate(value):
        single.write_text(json.dumps([entry]))
        alone = _load(single)
        if isinstance(alone, list):
            s = kept[f"{f} entry {i}"]
            assert (s.image, s.captions) == (alone[0].image, alone[0].captions)
    if isinstance(strict, list):  # nothing bad: skipping changes nothing
        assert skipped == strict and load_pairs_checked([f], on_bad="skip")[1].problems == ()


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(
        alphabet=st.sampled_from('[]{}",:01.e-+ \n\ttrue fals nul\\') | st.characters(codec="utf-8"), max_size=40
    )
)
@example(text="[" * 100_000)  # nested too deeply for the parser
@example(text="1" * 5000)  # an integer over Python's 4300-digit limit
@example(text="\ufeff[]")
def test_arbitrary_text_is_loaded_or_refused_with_a_data_error(folder: Path, text: str) -> None:
    f = folder / "text.json"
    f.write_text(text, encoding="utf-8")
    result = _load(f)
    try:
        json.loads(text)
    except json.JSONDecodeError:
        assert isinstance(result, DataError)
        assert re.match(rf"{re.escape(str(f))}: line \d+ column \d+: invalid JSON \(.+\)$", str(result))
    except (ValueError, RecursionError):
        assert isinstance(result, DataError) and str(result).startswith(f"{f}: invalid JSON (")
    else:
        if isinstance(result, list):
            _valid_samples(result)


# ---------------------------------------------------------------- pre_caption

letters = st.characters(min_codepoint=128, categories=("Ll", "Lu", "Lo"))
caption_text = st.text(
    alphabet=st.sampled_from(",.'!?\"()*#:;~-/<>person \t\n\r\x0b\x0c\u00a0\u2003\u3000\u2028AbZ9") | st.characters(),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(caption=caption_text, max_words=st.integers(0, 40))
@example(caption="a\tman\nholding a  kite ", max_words=30)  # ALBEF kept a lone tab/newline inside a "word"
@example(caption="\u3000a\u00a0b\x1c", max_words=30)  # Unicode spaces
@example(caption="<<person>>", max_words=30)  # ALBEF's single replacement left "<person>"
def test_pre_caption_properties(caption: str, max_words: int) -> None:
    out = pre_caption(caption, max_words)
    assert pre_caption(out, max_words) == out  # idempotent
    assert out == " ".join(out.split())  # single spaces only, none at either end
    assert len(out.split()) <= max_words
    assert not DELETE_CHARS.search(out) and "-" not in out and "/" not in out and "<person>" not in out
    assert out == out.lower()


@settings(max_examples=100, deadline=None)
@given(
    words=st.lists(st.text(letters, min_size=1, max_size=6), min_size=1, max_size=45),
    sep=st.sampled_from([" ", "  ", "\t", " - ", ", "]),
)
def test_pre_caption_keeps_non_ascii_words(words: list[str], sep: str) -> None:
    out = pre_caption(sep.join(words) + "!")
    assert out.split() == [w.lower() for w in words[:30]]


def albef_pre_caption(caption: str, max_words: int = 30) -> str:
    """ALBEF's original ``pre_caption`` (ALBEF/dataset/utils.py), for comparison."""
    caption = re.sub(r"([,.'!?\"()*#:;~])", "", caption.lower())
    caption = caption.replace("-", " ").replace("/", " ").replace("<person>", "person")
    caption = re.sub(r"\s{2,}", " ", caption).rstrip("\n").strip(" ")
    words = caption.split(" ")
    return " ".join(words[:max_words]) if len(words) > max_words else caption


ALBEF_CAPTIONS = [
    "A man with a red helmet on a small moped on a dirt road. ",
    "Man riding a motor bike on a dirt road on the countryside.",
    "A woman wearing a net on her head cutting a cake. \n",
    "<person> is standing in front of a  large, two-story house; (circa 1920)",
    "Two dogs play-fighting over a frisbee/ball on the beach!!",
    "\"It's a Bird? It's a plane!\" #sky ~ :) *",
    " ".join(f"word{i}" for i in range(45)),
]


@pytest.mark.parametrize("caption", ALBEF_CAPTIONS)
def test_pre_caption_matches_albef_on_ordinary_captions(tokenizer, caption: str) -> None:
    assert pre_caption(caption) == albef_pre_caption(caption)
    ids = tokenizer(pre_caption(caption))["input_ids"]
    assert ids == tokenizer(albef_pre_caption(caption))["input_ids"]


def test_lone_tabs_and_newlines_give_albef_tokens(tokenizer) -> None:
    caption = "A man\tholding a kite\non the beach"
    assert albef_pre_caption(caption) == "a man\tholding a kite\non the beach"  # ALBEF keeps them
    assert pre_caption(caption) == "a man holding a kite on the beach"
    assert tokenizer(pre_caption(caption))["input_ids"] == tokenizer(albef_pre_caption(caption))["input_ids"]


# ---------------------------------------------------------------- tokenize

ascii_words = st.sampled_from(["a", "dog", "running", "on", "the", "beach", "photograph", "x2"])
mixed_words = st.text(letters, min_size=1, max_size=5) | ascii_words


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(words=st.lists(mixed_words, min_size=100, max_size=300), max_len=st.integers(4, 32))
def test_overlong_caption_tokenizes_to_exactly_max_len(tokenizer, words: list[str], max_len: int) -> None:
    batch = tokenize(tokenizer, [" ".join(words), "short"], max_len)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.shape == (2, max_len) and int(mask[0].sum()) == max_len
    assert ids[0, 0] == tokenizer.cls_token_id and ids[0, -1] == tokenizer.sep_token_id
