"""Image transforms, ALBEF caption cleaning and tokenizer set-up."""

from __future__ import annotations

import math
import random
import re
from typing import Callable, Sequence

import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from vlp.config import ImageConfig, TextConfig

#: characters ALBEF's pre_caption / pre_question delete
DELETE_CHARS = re.compile(r"[,.'!?\"()*#:;~]")


def pre_caption(caption: str, max_words: int = 30) -> str:
    """ALBEF ``pre_caption``: lower-case, delete ``, . ' ! ? " ( ) * # : ; ~``, ``-``/``/`` -> space,
    ``<person>`` -> ``person``, collapse whitespace, strip, keep the first ``max_words`` words."""
    c = DELETE_CHARS.sub("", caption.lower())
    c = c.replace("-", " ").replace("/", " ").replace("<person>", "person")
    c = re.sub(r"\s{2,}", " ", c).rstrip("\n").strip(" ")
    return " ".join(c.split(" ")[:max_words])


class AlbefRandAugment:
    """ALBEF's RandAugment(N=2, M=7): no colour/hue/solarize ops (captions mention colours).

    Each of ``n`` ops drawn from {Identity, AutoContrast, Equalize, Brightness, Sharpness, ShearX,
    ShearY, TranslateX, TranslateY, Rotate} is applied with probability 0.5.
    """

    def __init__(self, n: int = 2, m: int = 7) -> None:
        self.n, self.level = n, m / 10.0
        self.ops: list[Callable[[Image.Image], Image.Image]] = [
            lambda im: im,
            TF.autocontrast,
            TF.equalize,
            lambda im: TF.adjust_brightness(im, 1 + self._signed(0.9)),
            lambda im: TF.adjust_sharpness(im, 1 + self._signed(0.9)),
            lambda im: self._affine(im, shear=(math.degrees(math.atan(self._signed(0.3))), 0.0)),
            lambda im: self._affine(im, shear=(0.0, math.degrees(math.atan(self._signed(0.3))))),
            lambda im: self._affine(im, translate=(int(self._signed(0.45) * im.width), 0)),
            lambda im: self._affine(im, translate=(0, int(self._signed(0.45) * im.height))),
            lambda im: TF.rotate(im, self._signed(30.0), interpolation=InterpolationMode.BILINEAR, fill=[128, 128, 128]),
        ]

    def _signed(self, max_value: float) -> float:
        return self.level * max_value * random.choice((-1.0, 1.0))

    @staticmethod
    def _affine(im: Image.Image, translate=(0, 0), shear=(0.0, 0.0)) -> Image.Image:
        return TF.affine(im, angle=0.0, translate=list(translate), scale=1.0, shear=list(shear), fill=[128, 128, 128])

    def __call__(self, im: Image.Image) -> Image.Image:
        for op in random.choices(self.ops, k=self.n):
            if random.random() < 0.5:
                im = op(im)
        return im


def _normalize(cfg: ImageConfig) -> list:
    return [T.ToTensor(), T.Normalize(cfg.mean, cfg.std)]


def train_transform(res: int, cfg: ImageConfig) -> Callable[[Image.Image], torch.Tensor]:
    """RandomResizedCrop(scale) -> flip -> RandAugment -> normalise (each step optional)."""
    steps: list = []
    if cfg.crop_scale is not None:
        steps.append(T.RandomResizedCrop(res, scale=tuple(cfg.crop_scale), interpolation=InterpolationMode.BICUBIC))
    else:
        steps.append(T.Resize((res, res), interpolation=InterpolationMode.BICUBIC))
    if cfg.hflip:
        steps.append(T.RandomHorizontalFlip())
    if cfg.randaugment:
        steps.append(AlbefRandAugment())
    return T.Compose(steps + _normalize(cfg))


def test_transform(res: int, cfg: ImageConfig) -> Callable[[Image.Image], torch.Tensor]:
    """Resize((res, res), bicubic), no centre crop -> normalise."""
    return T.Compose([T.Resize((res, res), interpolation=InterpolationMode.BICUBIC)] + _normalize(cfg))


def load_tokenizer(cfg: TextConfig):
    """BERT WordPiece tokenizer (bert-base-uncased vocabulary by default, shipped offline)."""
    from transformers import BertTokenizerFast

    from vlp.models.text import minilm_path, resolve_source

    src = resolve_source(cfg.tokenizer) if cfg.tokenizer else str(minilm_path())
    return BertTokenizerFast.from_pretrained(src)


def tokenize(tokenizer, texts: Sequence[str], max_len: int) -> dict[str, torch.Tensor]:
    """Clean (``pre_caption``) and tokenize -> ``input_ids``/``attention_mask`` [B, T], padded to the
    longest, truncated to ``max_len`` tokens."""
    enc = tokenizer(
        [pre_caption(t) for t in texts], padding="longest", truncation=True, max_length=max_len, return_tensors="pt"
    )
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
