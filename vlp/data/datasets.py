"""Map-style datasets and the batch collator (tokenisation happens here, in loader workers)."""

from __future__ import annotations

import random
from typing import Callable, Optional, Sequence

import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from vlp.data.formats import DataError, Sample
from vlp.data.helper_cache import HelperCache
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

    With a :class:`HelperCache`, items also carry the frozen SRCL helper's cached features of the
    image and of the chosen caption (``helper_image``/``helper_text``)."""

    def __init__(self, samples: Sequence[Sample], transform: Callable[[Image.Image], torch.Tensor],
                 helper_cache: Optional[HelperCache] = None) -> None:
        self.samples = list(samples)
        self.transform = transform
        self.helper_cache = helper_cache
        if helper_cache is not None:
            helper_cache.check_covers(self.samples)
        keys = sorted({s.image_key for s in self.samples})
        self.key_to_id = {k: i for i, k in enumerate(keys)}  # contiguous int per image

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        s = self.samples[i]
        caption = random.choice(s.captions) if len(s.captions) > 1 else s.captions[0]
        item = {"image": self.transform(load_image(s.image, s.origin)), "caption": caption,
                "image_id": self.key_to_id[s.image_key]}
        if self.helper_cache is not None:
            item["helper_image"], item["helper_text"] = self.helper_cache.lookup(s.image_key, caption)
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
    """Stack images, tokenize captions (padded to the longest, truncated at ``max_len``), ids to tensors."""

    def __init__(self, tokenizer, max_len: int) -> None:
        self.tokenizer, self.max_len = tokenizer, max_len

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = tokenize(self.tokenizer, [it["caption"] for it in items], self.max_len)
        batch["images"] = torch.stack([it["image"] for it in items])
        batch["image_ids"] = torch.tensor([it["image_id"] for it in items], dtype=torch.long)
        for key in ("helper_image", "helper_text"):
            if key in items[0]:
                batch[key] = torch.stack([it[key] for it in items])
        return batch
