"""Texts as token ids, open_clip's way: :class:`Tokenizer` (what :func:`vlp.get_tokenizer` returns)
cleans captions as the model was trained and returns a LongTensor ``[N, context_length]``, padded
to the model's text length as open_clip pads to its context length. ``VLPModel.encode_text``
takes that tensor (its attention mask: the ids that are not the pad id, :func:`attention_mask`)."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Optional, Sequence, Union

import torch

from vlp.api.inputs import as_list
from vlp.checkpoint import Preprocessor
from vlp.preprocess.transforms import is_albef_compat
from vlp.preprocess.transforms import tokenize as tokenize_captions


def cleaning(name: str, albef_compat: bool) -> Optional[Callable[[str], str]]:
    """The text cleaning a preprocessor names: None for ``pre_caption`` (what
    :func:`vlp.preprocess.transforms.tokenize` applies itself, ALBEF's own in ``albef_compat`` mode),
    ALBEF's ``pre_question`` (50 words, as evaluation cleans questions) for ``pre_question``."""
    if name == "pre_question":  # vlp.data only then: loading a model imports no dataset code
        from vlp.data.vqa import TEST_MAX_WORDS, albef_pre_question, pre_question

        return partial(albef_pre_question if albef_compat else pre_question, max_words=TEST_MAX_WORDS)
    return None


class Tokenizer:
    """``tokenizer(texts)`` -> token ids LongTensor ``[N, context_length]`` (one string: N = 1).

    Each text is cleaned as the model's inputs were (``preprocessor.caption_cleaning``), tokenized
    with the model's BERT WordPiece ``tokenizer``, cut at ``context_length`` tokens (the model's
    ``max_len``) and padded to it with ``pad_id``. ``context_length=`` in a call overrides the length
    (as open_clip's tokenizers take it). Attributes: ``tokenizer`` (the transformers tokenizer),
    ``context_length``, ``pad_id``, ``caption_cleaning``."""

    def __init__(self, tokenizer: Any, preprocessor: Preprocessor) -> None:
        self.tokenizer, self.context_length = tokenizer, preprocessor.max_len
        self.caption_cleaning = preprocessor.caption_cleaning
        self.pad_id: int = tokenizer.pad_token_id

    def __call__(self, texts: Union[str, Sequence[str]], context_length: Optional[int] = None) -> torch.Tensor:
        clean = cleaning(self.caption_cleaning, is_albef_compat(self.tokenizer))
        n = context_length or self.context_length
        rows = as_list(texts, (str,))
        return tokenize_captions(self.tokenizer, rows, n, padding="max_len", clean=clean)["input_ids"]

    def __repr__(self) -> str:
        return f"Tokenizer(context_length={self.context_length}, caption_cleaning={self.caption_cleaning!r})"


def attention_mask(input_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """The attention mask [N, T] of token ids [N, T] (a [T] row is one text: [1, T]): 1 where the id
    is not ``pad_id``."""
    ids = input_ids if input_ids.dim() == 2 else input_ids.unsqueeze(0)
    return (ids != pad_id).long()
