"""SNLI-VE data: dataset of (image premise, hypothesis, label) and its collator."""

from __future__ import annotations

import torch

from vlp.data.datasets import EntryDataset, count_bad
from vlp.data.nlvr import tokenize_sentences


class VEDataset(EntryDataset):
    """Items ``{"image", "sentence", "label"}`` from :class:`VEItem` s (``items``). A bad image makes
    the item a bad sample (``on_bad``, training only; :class:`ItemDataset`)."""

    def load(self, i: int) -> dict:
        """Item ``i``: ``image`` [3, H, W] (the transformed premise), ``sentence`` (the hypothesis) and
        ``label``; a bad image raises :class:`~vlp.errors.BadImage`."""
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
