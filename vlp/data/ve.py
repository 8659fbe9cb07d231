"""SNLI-VE data: dataset of (image premise, hypothesis, label) and its collator."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from PIL import Image

from vlp.data.datasets import ItemDataset, count_bad
from vlp.data.downstream_formats import VEItem
from vlp.data.nlvr import tokenize_sentences
from vlp.preprocess.images import MAX_PIXELS, MIN_SIDE


class VEDataset(ItemDataset):
    """Items ``{"image", "sentence", "label"}`` from :class:`VEItem` s. A bad image makes the item a
    bad sample (``on_bad``, training only; :class:`ItemDataset`)."""

    def __init__(
        self,
        items: Sequence[VEItem],
        transform: Callable[[Image.Image], torch.Tensor],
        on_bad: Optional[str] = None,
        max_pixels: int = MAX_PIXELS,
        min_side: int = MIN_SIDE,
    ) -> None:
        super().__init__(on_bad, max_pixels, min_side)
        self.items = list(items)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.items)

    def load(self, i: int) -> dict:
        it = self.items[i]
        return {"image": self.transform(self.image(it.image, it.origin)), "sentence": it.sentence, "label": it.label}


class VECollator:
    """Stack the images, tokenize the hypotheses (:func:`vlp.data.nlvr.tokenize_sentences`: padded
    to the longest, ``pre_caption`` 30 words, truncated at ``max_len`` tokens except with an
    ``albef_compat`` tokenizer, as ALBEF's VE) -> ``images`` [B, 3, H, W], ``input_ids``/
    ``attention_mask`` [B, T], ``labels`` [B] long, ``bad_samples`` (0-d long)."""

    def __init__(self, tokenizer, max_len: int = 40) -> None:
        self.tokenizer, self.max_len = tokenizer, max_len

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = tokenize_sentences(self.tokenizer, [it["sentence"] for it in items], self.max_len)
        batch["images"] = torch.stack([it["image"] for it in items])
        batch["labels"] = torch.tensor([it["label"] for it in items], dtype=torch.long)
        batch["bad_samples"] = count_bad(items)
        return batch
