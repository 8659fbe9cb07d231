"""Map-style datasets and the batch collator (tokenisation happens here, in loader workers)."""

from __future__ import annotations

import random
from typing import Callable, Optional, Sequence

import torch
from PIL import Image
from torch.utils.data import Dataset

from vlp.data.formats import DataError, Sample
from vlp.data.helper_cache import HelperCache
from vlp.data.images import open_image
from vlp.data.targets import LatentTargets
from vlp.data.transforms import tokenize


def load_image(path: str, origin: str) -> Image.Image:
    """Open an image as RGB (:func:`vlp.data.images.open_image`); problems raise one :class:`BadImage`."""
    return open_image(path, origin)


def pick_captions(captions: Sequence[str], k: int = 1, rng: random.Random | None = None) -> list[str]:
    """The captions of one item: k = 1 draws one at random; k > 1 gives k distinct ones while the
    image has enough (random order), cycled otherwise. ``rng`` defaults to the global ``random``."""
    r = rng or random
    if k == 1:
        return [r.choice(captions) if len(captions) > 1 else captions[0]]
    order = r.sample(list(captions), len(captions))
    return [order[i % len(order)] for i in range(k)]


def make_item(image: torch.Tensor, image_id: int, image_key: str, captions: Sequence[str], grouped: bool,
              helper_cache: Optional[HelperCache] = None, targets: Optional[LatentTargets] = None) -> dict:
    """One training item: ``image`` [3, H, W], ``image_id``, ``caption`` (a string, or the list of
    captions when ``grouped``), and the helper features / LTD targets of the image and caption(s)
    when a cache / targets are given (looked up by ``image_key`` and caption text)."""
    caps = list(captions)
    item = {"image": image, "image_id": image_id, "caption": caps if grouped else caps[0]}
    if helper_cache is not None:
        item["helper_image"], item["helper_text"] = helper_cache.lookup(image_key, caps[0])
    if targets is not None:
        t = torch.stack([targets.lookup(c) for c in caps])
        item["ltd_target"] = t if grouped else t[0]
    return item


class ImageTextDataset(Dataset):
    """(image, caption, image id) items; a list of captions yields a random one per load.

    ``captions_per_image`` k > 1 gives image-level items with k of the image's captions (distinct
    while it has enough, cycled otherwise). With a :class:`HelperCache`, items also carry the
    frozen SRCL helper's cached features of the image and of the chosen caption
    (``helper_image``/``helper_text``); with :class:`LatentTargets`, each caption's LTD target
    (``ltd_target``)."""

    def __init__(self, samples: Sequence[Sample], transform: Callable[[Image.Image], torch.Tensor],
                 helper_cache: Optional[HelperCache] = None, targets: Optional[LatentTargets] = None,
                 captions_per_image: int = 1) -> None:
        self.samples = list(samples)
        self.transform = transform
        self.helper_cache = helper_cache
        self.targets = targets
        self.captions_per_image = captions_per_image
        for store in (helper_cache, targets):
            if store is not None:
                store.check_covers(self.samples)
        keys = sorted({s.image_key for s in self.samples})
        self.key_to_id = {k: i for i, k in enumerate(keys)}  # contiguous int per image

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        s = self.samples[i]
        caps = pick_captions(s.captions, self.captions_per_image)
        return make_item(self.transform(load_image(s.image, s.origin)), self.key_to_id[s.image_key], s.image_key,
                         caps, self.captions_per_image > 1, self.helper_cache, self.targets)


class ImageDataset(Dataset):
    """Images only (evaluation): item = (index, tensor)."""

    def __init__(self, paths: Sequence[str], transform: Callable[[Image.Image], torch.Tensor], source: str) -> None:
        self.paths, self.transform, self.source = list(paths), transform, source

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.transform(load_image(self.paths[i], f"{self.source} entry {i}"))


class Collator:
    """Stack images, tokenize captions (truncated at ``max_len``; ``padding``: to the batch's longest
    or always to ``max_len``, see :func:`tokenize`), ids to tensors.

    Image-level items (a list of k captions each) give ``input_ids`` [B*k, T] in item order and
    ``text_image_ids`` [B*k], the image id of every caption."""

    def __init__(self, tokenizer, max_len: int, padding: str = "longest") -> None:
        self.tokenizer, self.max_len, self.padding = tokenizer, max_len, padding

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        grouped = isinstance(items[0]["caption"], list)
        captions = [c for it in items for c in it["caption"]] if grouped else [it["caption"] for it in items]
        batch = tokenize(self.tokenizer, captions, self.max_len, self.padding)
        batch["images"] = torch.stack([it["image"] for it in items])
        batch["image_ids"] = torch.tensor([it["image_id"] for it in items], dtype=torch.long)
        if grouped:
            batch["text_image_ids"] = batch["image_ids"].repeat_interleave(len(items[0]["caption"]))
        for key in ("helper_image", "helper_text"):
            if key in items[0]:
                batch[key] = torch.stack([it[key] for it in items])
        if "ltd_target" in items[0]:
            batch["ltd_target"] = torch.cat([it["ltd_target"] for it in items]) if grouped else \
                torch.stack([it["ltd_target"] for it in items])
        return batch
