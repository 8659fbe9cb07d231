"""Writing a helper-feature cache (:mod:`vlp.features.helper_cache`) of annotation files and shard
entries with a :class:`~vlp.features.encoders.FeatureEncoder` (:func:`write_feature_cache`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import torch

from vlp.data.image_checks import check_images
from vlp.errors import DataError
from vlp.features.encoders import FeatureEncoder

#: a part of a cache's image rows: image keys, their features [N, E] in that order, the captions met
ImageRows = tuple[list[str], torch.Tensor, set[str]]


@torch.no_grad()
def write_feature_cache(
    out: str | Path,
    data: Sequence[str],
    encoder: FeatureEncoder,
    image_root: Optional[str] = None,
    batch_size: int = 256,
    num_workers: int = 0,
    show_progress: bool = True,
    caption_key: str = "caption",
) -> Path:
    """The helper-feature cache (:mod:`vlp.features.helper_cache`) ``out`` of ``data``: annotation
    files and shard entries (shard folders, brace patterns of tars, URL entries:
    :mod:`vlp.data.shard_samples`; ``caption_key``: img2dataset's caption key). Every image goes
    through the encoder's ``preprocess`` and ``encode_image``, every distinct caption through its
    ``encode_text``, in batches of ``batch_size``, with progress bars; rows are keyed as training
    looks them up (a shard sample by its ``image_key``). ``index.json`` records the encoder's
    ``meta``, ``data`` and, for shard entries, the ``shards`` read (what a URL shard set is checked
    against)."""
    from vlp.data.shard_format import read_sizes
    from vlp.data.shard_samples import shard_name, split_data
    from vlp.features.helper_cache import write_cache
    from vlp.progress import progress

    files, entries = split_data(data)
    shards = read_sizes(entries, caption_key) if entries else []
    parts = [_file_image_rows(files, encoder, image_root, batch_size, num_workers, show_progress)] if files else []
    if shards:
        parts.append(_shard_image_rows(shards, encoder, batch_size, num_workers, show_progress))
    keys, image, texts = _merged_rows(parts, data)
    bar = progress(len(texts), "helper features (captions)", show_progress)
    text_feats = []
    for start in range(0, len(texts), batch_size):
        text_feats.append(encoder.encode_text(texts[start : start + batch_size]).float().cpu())
        bar.update(len(text_feats[-1]))
    bar.close()
    meta = {**encoder.meta, "data": [str(d) for d in data]}
    if entries:
        meta["shards"] = [shard_name(s) for s in shards]
    return write_cache(out, keys, image, texts, torch.cat(text_feats), meta)


def _file_image_rows(
    files: list[str], encoder: FeatureEncoder, image_root: Optional[str], batch_size: int, workers: int, bar: bool
) -> ImageRows:
    """The image rows of annotation ``files``: every distinct image key, its image read from disk."""
    from torch.utils.data import DataLoader

    from vlp.data.datasets import ImageDataset
    from vlp.data.formats import load_pairs
    from vlp.features.helper_cache import cache_rows
    from vlp.progress import progress

    samples = load_pairs(files, image_root)
    check_images(samples)
    paths, keys, texts = cache_rows(samples)
    dataset = ImageDataset([paths[k] for k in keys], encoder.preprocess, "helper cache")
    shown = progress(len(keys), "helper features (images)", bar)
    feats = []
    for images in DataLoader(dataset, batch_size=batch_size, num_workers=workers):
        feats.append(encoder.encode_image(images).float().cpu())
        shown.update(len(images))
    shown.close()
    return keys, torch.cat(feats), set(texts)


def _shard_image_rows(shards: Sequence, encoder: FeatureEncoder, batch_size: int, workers: int, bar: bool) -> ImageRows:
    """The image rows of ``shards`` (:class:`~vlp.data.shard_format.ShardInfo`): every readable sample,
    its image decoded from the tar member as it streams by (loader workers split the shards)."""
    import json

    from torch.utils.data import DataLoader

    from vlp.data.shard_samples import ShardImages
    from vlp.progress import progress

    shown = progress(sum(s.images for s in shards), "helper features (shard images)", bar)
    keys: list[str] = []
    feats: list[torch.Tensor] = []
    texts: set[str] = set()
    for batch_keys, captions, images in DataLoader(
        ShardImages(shards, encoder.preprocess), batch_size=batch_size, num_workers=min(workers, len(shards))
    ):
        feats.append(encoder.encode_image(images).float().cpu())
        keys += batch_keys
        texts.update(c for caps in captions for c in json.loads(caps))
        shown.update(len(images))
    shown.close()
    if not keys:
        raise DataError(f"{len(shards)} shard(s) from {shards[0].path} on: no readable sample to cache")
    return keys, torch.cat(feats), texts


def _merged_rows(parts: list[ImageRows], data: Sequence[str]) -> tuple[list[str], torch.Tensor, list[str]]:
    """The parts' image keys sorted with their features [N, E] in that order, and the sorted captions.
    An image key met twice (two img2dataset folders numbering their samples alike) is one
    :class:`DataError`: a cache row per key cannot tell the two images apart."""
    keys = [k for p in parts for k in p[0]]
    image = torch.cat([p[1] for p in parts])
    order = sorted(range(len(keys)), key=keys.__getitem__)
    twice = next((keys[a] for a, b in zip(order, order[1:]) if keys[a] == keys[b]), None)
    if twice is not None:
        raise DataError(
            f"--data {list(data)}: image key {twice!r} is held by two samples, whose features would share "
            "one cache row; build one cache per shard set whose keys repeat"
        )
    return [keys[i] for i in order], image[order], sorted(set().union(*(p[2] for p in parts)))
