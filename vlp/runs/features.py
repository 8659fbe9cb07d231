"""``vlp cache-helper-features`` (the SRCL helper's features of a dataset, computed once) and
``vlp make-targets`` (every caption embedded once with a sentence encoder: the LTD targets). The
oracle helper of a shapes world (``--oracle``) is the lab's: :func:`vlp.lab.oracle.run_cache_oracle_features`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from vlp.checkpoint import image_size, open_checkpoint
from vlp.data.formats import load_pairs
from vlp.errors import DataError
from vlp.hardware import default_device
from vlp.models.open_clip_helper import is_open_clip_spec
from vlp.preprocess.transforms import test_transform
from vlp.runs.common import cache_open_clip_features, write_feature_cache


@torch.no_grad()
def run_cache_helper_features(
    helper: str | Path,
    data: Sequence[str],
    out: str | Path,
    image_root: Optional[str] = None,
    batch_size: int = 256,
    num_workers: int = 0,
    show_progress: bool = True,
) -> Path:
    """Features of every image (eval transform) and caption of ``data`` under the frozen helper,
    written to the cache folder ``out`` that ``loss.srcl.helper_features`` points at. ``helper``:
    a vlp helper checkpoint or run directory, or an open_clip model ``open_clip:ARCH[/PRETRAINED]``
    (:mod:`vlp.models.open_clip_helper`; its own eval preprocessing of the images and tokenizer of
    the raw captions: :func:`vlp.runs.common.cache_open_clip_features`)."""
    from vlp.preprocess.transforms import tokenize

    if Path(out).exists():
        raise DataError(f"{out} already exists; choose another --out or remove it")
    if is_open_clip_spec(helper):
        return cache_open_clip_features(str(helper), data, out, image_root, batch_size, num_workers, show_progress)
    ckpt = open_checkpoint(helper)
    model: Any = ckpt.load()  # a helper: ALBEF or dual encoder
    hcfg, tokenizer = ckpt.pretrain_config, ckpt.tokenizer
    device = next(model.parameters()).device

    def encode_text(texts: list[str]) -> torch.Tensor:
        tok = tokenize(tokenizer, texts, hcfg.model.text.max_len)
        return model.encode_text(tok["input_ids"].to(device), tok["attention_mask"].to(device)).feat

    meta = {
        "helper": str(ckpt.path.resolve()),
        "helper_step": ckpt.state.get("step"),
        "image_size": image_size(hcfg),
        "max_len": hcfg.model.text.max_len,
    }
    return write_feature_cache(
        out,
        data,
        image_root,
        test_transform(image_size(hcfg), hcfg.data.image),
        lambda images: model.encode_image(images.to(device)).feat,
        encode_text,
        meta,
        batch_size,
        num_workers,
        show_progress,
    )


def run_make_targets(
    data: Sequence[str], encoder: str, out: str | Path, batch_size: int = 256, show_progress: bool = True
) -> Path:
    """Embed every distinct caption of the annotation files ``data`` once with a sentence encoder
    and write the LTD targets file ``out`` (``loss.ltd.targets``)."""
    from vlp.features.targets import encode_sentences, write_targets

    if Path(out).exists():
        raise DataError(f"{out} already exists; choose another --out or remove it")
    captions = sorted({c for smp in load_pairs(list(data)) for c in smp.captions})
    print(f"vlp make-targets: {len(captions)} distinct captions, encoder {encoder}")
    vectors = encode_sentences(encoder, captions, batch_size, str(default_device()), show_progress)
    return write_targets(out, captions, vectors, encoder, [str(Path(d).resolve()) for d in data])
