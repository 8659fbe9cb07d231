"""Cached features of the frozen SRCL helper: computed once, read by the training data path.

A cache is a folder with ``features.safetensors`` (``image`` [N_img, E], ``text`` [N_txt, E],
L2-normalised, fp32) and ``index.json`` (format, the image keys and caption strings in row order,
and where the features came from). Images are looked up by their sample key (``image_id`` or
path), captions by their exact text, so one cache serves any subset or order of the data it was
built from.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import load_file, save_file

from vlp.data.formats import Sample
from vlp.errors import DataError

CACHE_FORMAT = "vlp-helper-features-v1"


@dataclass
class HelperCache:
    image: torch.Tensor  # [N_img, E]
    text: torch.Tensor  # [N_txt, E]
    image_index: dict[str, int]
    text_index: dict[str, int]
    meta: dict[str, Any]
    path: Path

    @property
    def dim(self) -> int:
        return int(self.image.shape[1])

    @classmethod
    def load(cls, path: str | Path) -> HelperCache:
        """Read a cache folder; a missing or inconsistent cache raises one :class:`DataError`."""
        path = Path(path)
        index_file, feat_file = path / "index.json", path / "features.safetensors"
        if not index_file.is_file() or not feat_file.is_file():
            raise DataError(
                f"helper feature cache {path}: expected index.json and features.safetensors "
                "(build it with `vlp cache-helper-features`)"
            )
        try:
            index = json.loads(index_file.read_text())
        except json.JSONDecodeError as e:
            raise DataError(f"{index_file}: not valid JSON: {e}") from None
        if index.get("format") != CACHE_FORMAT:
            raise DataError(f"{index_file}: key 'format' is {index.get('format')!r}, expected {CACHE_FORMAT!r}")
        feats = load_file(str(feat_file))
        image, text = feats.get("image"), feats.get("text")
        keys, texts = index.get("image_keys", []), index.get("texts", [])
        if image is None or text is None or image.shape[0] != len(keys) or text.shape[0] != len(texts):
            raise DataError(
                f"{path}: features.safetensors does not match index.json ({len(keys)} image keys, {len(texts)} texts)"
            )
        meta = {k: v for k, v in index.items() if k not in ("image_keys", "texts")}
        return cls(image, text, {k: i for i, k in enumerate(keys)}, {t: i for i, t in enumerate(texts)}, meta, path)

    def check_covers(self, samples: Sequence[Sample], limit: int = 3) -> None:
        """Fail before training if a training image or caption has no cached feature."""
        missing_img = [s for s in samples if s.image_key not in self.image_index]
        missing_txt = [(s, c) for s in samples for c in s.captions if c not in self.text_index]
        if missing_img or missing_txt:
            ex = [f"{s.origin}: image {s.image_key}" for s in missing_img[:limit]]
            ex += [f"{s.origin}: caption {c!r}" for s, c in missing_txt[:limit]]
            raise DataError(
                f"helper feature cache {self.path} lacks {len(missing_img)} images and "
                f"{len(missing_txt)} captions of the training data, e.g. {'; '.join(ex)}. "
                "Rebuild it with `vlp cache-helper-features` on the same annotation files"
            )

    def lookup(self, image_key: str, caption: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.image[self.image_index[image_key]], self.text[self.text_index[caption]]


def write_cache(
    out: str | Path,
    image_keys: Sequence[str],
    image: torch.Tensor,
    texts: Sequence[str],
    text: torch.Tensor,
    meta: dict[str, Any],
) -> Path:
    """Write a cache folder atomically; an existing folder is never overwritten."""
    out = Path(out)
    if out.exists():
        raise DataError(f"{out} already exists; choose another --out or remove it")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(
        {"image": image.float().contiguous(), "text": text.float().contiguous()}, str(tmp / "features.safetensors")
    )
    index = {
        "format": CACHE_FORMAT,
        **meta,
        "embed_dim": int(image.shape[1]),
        "num_images": len(image_keys),
        "num_texts": len(texts),
        "image_keys": list(image_keys),
        "texts": list(texts),
    }
    (tmp / "index.json").write_text(json.dumps(index))
    os.replace(tmp, out)
    return out
