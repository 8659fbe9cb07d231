"""Map-style datasets and the batch collator (tokenisation happens here, in loader workers)."""

from __future__ import annotations

import random
from typing import Callable, Optional, Sequence

import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from vlp.data.formats import DataError, Sample
from vlp.data.helper_cache import HelperCache
from vlp.data.targets import LatentTargets
from vlp.data.transforms import tokenize


def load_image(path: str, origin: str) -> Image.Image:
    """Open an image as RGB; a missing or unreadable file raises one :class:`DataError`."""
    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except FileNotFoundError:
        raise DataError(f"{origin}: image file not found: {path}") from None
    except (UnidentifiedImageError, OSError) as e:
        raise DataError(f"{origin}: cannot read image {path}: {e}") from None


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

    def _captions(self, caps: Sequence[str]) -> list[str]:
        k = self.captions_per_image
        if k == 1:
            return [random.choice(caps) if len(caps) > 1 else caps[0]]
        order = random.sample(list(caps), len(caps))
        return [order[i % len(order)] for i in range(k)]

    def __getitem__(self, i: int) -> dict:
        s = self.samples[i]
        caps = self._captions(s.captions)
        item = {"image": self.transform(load_image(s.image, s.origin)), "image_id": self.key_to_id[s.image_key],
                "caption": caps[0] if self.captions_per_image == 1 else caps}
        if self.helper_cache is not None:
            item["helper_image"], item["helper_text"] = self.helper_cache.lookup(s.image_key, caps[0])
        if self.targets is not None:
            t = torch.stack([self.targets.lookup(c) for c in caps])
            item["ltd_target"] = t[0] if self.captions_per_image == 1 else t
        return item


class ImageDataset(Dataset):
    """Images only (evaluation): item = (index, tensor)."""

    def __init__(self, paths: Sequence[str], transform: Callable[[Image.Image], torch.Tensor], source: str) -> None:
        self.paths, self.transform, self.source = list(paths), transform, source

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.transform(load_image(self.paths[i], f"{self.source} entry {i}"))


class Collator:
    """Stack images, tokenize captions (padded to the longest, truncated at ``max_len``), ids to tensors.

    Image-level items (a list of k captions each) give ``input_ids`` [B*k, T] in item order and
    ``text_image_ids`` [B*k], the image id of every caption."""

    def __init__(self, tokenizer, max_len: int) -> None:
        self.tokenizer, self.max_len = tokenizer, max_len

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        grouped = isinstance(items[0]["caption"], list)
        captions = [c for it in items for c in it["caption"]] if grouped else [it["caption"] for it in items]
        batch = tokenize(self.tokenizer, captions, self.max_len)
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
