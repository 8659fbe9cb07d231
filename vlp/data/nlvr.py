"""NLVR2 data: dataset of (image pair, sentence, label) with left/right flip, and its collator."""

from __future__ import annotations

import random
import re
from typing import Callable, Optional, Sequence

import torch
from PIL import Image

from vlp.data.datasets import EntryDataset, count_bad
from vlp.data.downstream_formats import NLVRItem
from vlp.preprocess.images import MAX_PIXELS, MIN_SIDE
from vlp.preprocess.transforms import is_albef_compat, tokenize

_LEFT_RIGHT = re.compile(r"\b(left|right)\b", re.IGNORECASE)


def _swap_word(word: str) -> str:
    """``left`` <-> ``right`` keeping the case pattern (lower, Title or UPPER)."""
    other = "right" if word.lower() == "left" else "left"
    if word.isupper():
        return other.upper()
    if word[0].isupper():
        return other.capitalize()
    return other


def swap_left_right(sentence: str) -> str:
    """Swap the whole words "left" and "right" (also before punctuation such as "left's" or
    "right,"), preserving case; words that merely contain them ("leftover", "bright") are kept."""
    return _LEFT_RIGHT.sub(lambda m: _swap_word(m.group(0)), sentence)


class NLVRDataset(EntryDataset):
    """Items ``{"image0", "image1", "sentence", "label"}`` from :class:`NLVRItem` s.

    With ``flip``, each load swaps the two images AND the words left/right with probability 0.5
    (the label is unchanged: the swapped sentence describes the swapped pair). Randomness comes
    from ``rng`` if given, else Python's ``random`` (seeded per item by a training loader's
    :class:`vlp.data.datasets.EpochSampler`). A bad image (either one) makes the item a bad sample
    (``on_bad``, training only; :class:`ItemDataset`).
    """

    def __init__(
        self,
        items: Sequence[NLVRItem],
        transform: Callable[[Image.Image], torch.Tensor],
        flip: bool = False,
        rng: Optional[random.Random] = None,
        on_bad: Optional[str] = None,
        max_pixels: int = MAX_PIXELS,
        min_side: int = MIN_SIDE,
    ) -> None:
        super().__init__(items, transform, on_bad, max_pixels, min_side)
        self.flip = flip
        self.rng = rng

    def _coin(self) -> bool:
        return (self.rng or random).random() < 0.5

    def load(self, i: int) -> dict:
        """Item ``i``: ``image0``/``image1`` [3, H, W] (the transformed left and right images, swapped with
        the sentence's left/right under ``flip``), ``sentence`` and ``label`` (int); a bad image raises
        :class:`~vlp.errors.BadImage`."""
        it = self.items[i]
        left, right = it.images
        sentence = it.sentence
        if self.flip and self._coin():
            left, right = right, left
            sentence = swap_left_right(sentence)
        return {
            "image0": self.transform(self.image(left, it.origin)),
            "image1": self.transform(self.image(right, it.origin)),
            "sentence": sentence,
            "label": int(it.label),
        }


def tokenize_sentences(tokenizer, sentences: Sequence[str], max_len: Optional[int]) -> dict[str, torch.Tensor]:
    """NLVR2 sentences -> ``input_ids``/``attention_mask`` [B, T], padded to the longest: cleaned by
    ``pre_caption`` (30 words) and truncated at ``max_len`` tokens; with an ``albef_compat``
    tokenizer as ALBEF's NLVR2 does: its ``pre_caption`` (30 words) and never truncated in tokens,
    whatever ``max_len`` (a converted NLVR2 checkpoint's is 30)."""
    return tokenize(tokenizer, sentences, None if is_albef_compat(tokenizer) else max_len)


class NLVRCollator:
    """Stack both images, tokenize sentences (:func:`tokenize_sentences`: padded to the longest,
    truncated at ``max_len`` tokens, except with an ``albef_compat`` tokenizer), labels to a long tensor
    -> ``images0``/``images1`` [B, 3, H, W], ``input_ids``/``attention_mask`` [B, T], ``labels`` [B],
    ``bad_samples`` (0-d long, the bad loads the items replaced)."""

    def __init__(self, tokenizer, max_len: int = 40) -> None:
        self.tokenizer, self.max_len = tokenizer, max_len

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = tokenize_sentences(self.tokenizer, [it["sentence"] for it in items], self.max_len)
        batch["images0"] = torch.stack([it["image0"] for it in items])
        batch["images1"] = torch.stack([it["image1"] for it in items])
        batch["labels"] = torch.tensor([it["label"] for it in items], dtype=torch.long)
        batch["bad_samples"] = count_bad(items)
        return batch
