"""A frozen helper as a feature cache sees it (:class:`FeatureEncoder`), and the open_clip helper
as one (:func:`open_clip_encoder`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from vlp.models.open_clip_helper import CACHE_HELPER_KEY


@dataclass(frozen=True)
class FeatureEncoder:
    """A frozen helper as its feature cache sees it: ``preprocess`` (a PIL image -> [3, H, W]),
    ``encode_image`` (a batch [N, 3, H, W] -> [N, E]), ``encode_text`` (a list of N raw captions
    -> [N, E]) and ``meta``, what ``index.json`` records of it."""

    preprocess: Callable[[Any], torch.Tensor]
    encode_image: Callable[[torch.Tensor], torch.Tensor]
    encode_text: Callable[[list[str]], torch.Tensor]
    meta: dict[str, Any]


def open_clip_encoder(spec: str, key: str = "--helper", init: str = "pretrained") -> FeatureEncoder:
    """The open_clip helper ``spec`` (``open_clip:ARCH[/PRETRAINED]``, :mod:`vlp.models.open_clip_helper`)
    as a :class:`FeatureEncoder`: open_clip's own eval preprocessing of the images (read as vlp reads
    images) and its tokenizer of the raw captions; cache kind ``learned``, ``helper_init`` ``init``
    (``random`` only for a spec without weights: :func:`~vlp.models.open_clip_helper.require_weights`).
    ``key`` (``--helper`` or ``loss.srcl.helper``) is named by the errors of a bad spec."""
    from vlp.models.open_clip_helper import OpenClipHelper

    helper = OpenClipHelper.load(spec, key, init=init)
    meta = {
        "kind": "learned",
        CACHE_HELPER_KEY: spec,
        "helper_init": init,
        "arch": helper.spec.model_name,
        "pretrained": helper.pretrained,
        "image_size": helper.image_size,
        "context_length": helper.context_length,
    }
    return FeatureEncoder(helper.preprocess, helper.encode_image, helper.encode_text, meta)
