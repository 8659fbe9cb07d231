"""``vlp cache-helper-features`` (the SRCL helper's features of a dataset, computed once) and
``vlp make-targets`` (every caption embedded once with a sentence encoder: the LTD targets). The
oracle helper of a shapes world (``--oracle``) is the lab's: :func:`vlp.lab.oracle.run_cache_oracle_features`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from vlp.checkpoint import image_size, open_checkpoint
from vlp.data.formats import load_pairs
from vlp.errors import ConfigError
from vlp.features.cache_writer import write_feature_cache
from vlp.features.encoders import FeatureEncoder, open_clip_encoder
from vlp.features.store import refuse_existing
from vlp.hardware import default_device
from vlp.models.open_clip_helper import CACHE_HELPER_KEY, is_open_clip_spec
from vlp.preprocess.transforms import test_transform, tokenize

logger = logging.getLogger(__name__)


def checkpoint_encoder(helper: str | Path) -> FeatureEncoder:
    """A vlp helper checkpoint or run directory (ALBEF or dual encoder) as a :class:`FeatureEncoder`:
    its eval transform of the images, its tokenizer of the captions, its ITC features."""
    ckpt = open_checkpoint(helper)
    model: Any = ckpt.load()
    hcfg, tokenizer = ckpt.pretrain_config, ckpt.tokenizer
    device = next(model.parameters()).device

    def encode_text(texts: list[str]) -> torch.Tensor:
        tok = tokenize(tokenizer, texts, hcfg.model.text.max_len)
        return model.encode_text(tok["input_ids"].to(device), tok["attention_mask"].to(device)).feat

    meta = {
        CACHE_HELPER_KEY: str(ckpt.path.resolve()),
        "helper_init": "pretrained",  # a checkpoint's weights: trained for helper_step steps
        "helper_step": ckpt.state.get("step"),
        "image_size": image_size(hcfg),
        "max_len": hcfg.model.text.max_len,
    }
    transform = test_transform(image_size(hcfg), hcfg.data.image)
    return FeatureEncoder(transform, lambda images: model.encode_image(images.to(device)).feat, encode_text, meta)


def run_cache_helper_features(
    helper: str | Path,
    data: Sequence[str],
    out: str | Path,
    image_root: Optional[str] = None,
    batch_size: int = 256,
    num_workers: int = 0,
    show_progress: bool = True,
    helper_init: str = "pretrained",
    caption_key: str = "caption",
) -> Path:
    """Features of every image and caption of ``data`` (annotation files, shard folders, brace
    patterns of tars or URL entries; ``caption_key``: img2dataset's caption key) under the frozen
    helper, written to the cache folder ``out`` that ``loss.srcl.helper_features`` points at. ``helper``: a vlp helper
    checkpoint or run directory (:func:`checkpoint_encoder`), or an open_clip model
    ``open_clip:ARCH/PRETRAINED`` (:func:`vlp.features.encoders.open_clip_encoder`; ``open_clip:ARCH``
    without weights only with ``helper_init="random"``, which ``index.json`` records)."""
    refuse_existing(out)  # before the helper loads
    if is_open_clip_spec(helper):
        encoder = open_clip_encoder(str(helper), init=helper_init)
    elif helper_init != "pretrained":
        raise ConfigError(
            f"--helper-init {helper_init} is for an open_clip helper without weights; the vlp checkpoint "
            f"{helper} has its own (leave --helper-init out)"
        )
    else:
        encoder = checkpoint_encoder(helper)
    return write_feature_cache(out, data, encoder, image_root, batch_size, num_workers, show_progress, caption_key)


def run_make_targets(
    data: Sequence[str],
    encoder: str,
    out: str | Path,
    batch_size: int = 256,
    show_progress: bool = True,
    caption_key: str = "caption",
) -> Path:
    """Embed every distinct caption of ``data`` once with a sentence encoder and write the LTD
    targets file ``out`` (``loss.ltd.targets``). ``data``: annotation files, and shard entries
    (shard folders, brace patterns of tars, URL entries; their JSON or text members streamed,
    :mod:`vlp.data.shard_samples`; ``caption_key``: img2dataset's caption key), whose shards the
    file records (``shards``: what a URL shard set is checked against)."""
    from vlp.data.shard_format import read_sizes
    from vlp.data.shard_samples import iter_samples, shard_name, split_data
    from vlp.features.targets import encode_sentences, write_targets
    from vlp.remote.shard_urls import is_url

    refuse_existing(out)
    files, entries = split_data(data)
    shards = read_sizes(entries, caption_key) if entries else []
    found = {c for smp in load_pairs(files) for c in smp.captions} if files else set()
    found.update(c for raw in iter_samples(shards, images=False) for c in raw.meta["captions"])
    captions = sorted(found)
    logger.info(f"vlp make-targets: {len(captions)} distinct captions, encoder {encoder}")
    vectors = encode_sentences(encoder, captions, batch_size, str(default_device()), show_progress)
    recorded = [d if is_url(d) else str(Path(d).resolve()) for d in data]
    return write_targets(
        out, captions, vectors, encoder, recorded, [shard_name(s) for s in shards] if entries else None
    )
