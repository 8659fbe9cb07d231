"""Image transforms, ALBEF caption cleaning and tokenizer set-up."""

from __future__ import annotations

import math
import random
import re
from typing import Any, Callable, Optional, Sequence

import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from vlp.config import ImageConfig, TextConfig

#: characters ALBEF's pre_caption / pre_question delete
DELETE_CHARS = re.compile(r"[,.'!?\"()*#:;~]")
_WHITESPACE_RUN = re.compile(r"\s{2,}")


def pre_caption(caption: str, max_words: int = 30, albef_compat: bool = False) -> str:
    """ALBEF ``pre_caption``: lower-case, delete ``, . ' ! ? " ( ) * # : ; ~``, ``-``/``/`` -> space,
    ``<person>`` -> ``person``, collapse whitespace, strip, keep the first ``max_words`` words.

    Unlike ALBEF, every whitespace run (a lone tab or newline, Unicode spaces) becomes one space
    and ``<person>`` is replaced until none is left (``<<person>>``), so the result is idempotent;
    ordinary captions come out as in ALBEF (``tests/data/test_properties.py``).

    ``albef_compat`` (``model.text.albef_compat``, converted ALBEF checkpoints): exactly ALBEF's
    string, :func:`albef_pre_caption`."""
    if albef_compat:
        return albef_pre_caption(caption, max_words)
    c = DELETE_CHARS.sub("", caption.lower())
    c = c.replace("-", " ").replace("/", " ")
    while "<person>" in c:
        c = c.replace("<person>", "person")
    return " ".join(c.split()[:max_words])


def albef_pre_caption(caption: str, max_words: int = 30) -> str:
    """ALBEF's ``pre_caption`` to the character (albef.md §9): lower-case; delete
    ``, . ' ! ? " ( ) * # : ; ~``; ``-`` and ``/`` -> space; ``<person>`` -> ``person`` in one
    pass (``<<person>>`` -> ``<person>``); runs of 2+ whitespace characters -> one space (a lone tab
    or newline stays); strip the trailing newline, then the surrounding spaces; keep the first
    ``max_words`` ``' '``-separated words (a lone tab does not separate words)."""
    c = DELETE_CHARS.sub("", caption.lower()).replace("-", " ").replace("/", " ").replace("<person>", "person")
    c = _WHITESPACE_RUN.sub(" ", c).rstrip("\n").strip(" ")
    words = c.split(" ")
    return " ".join(words[:max_words]) if len(words) > max_words else c


#: ALBEF's RandAugment ops (no colour/hue/solarize: captions mention colours), in the order
#: :class:`AlbefRandAugment` draws from; an op is drawn as its index here
RANDAUG_OPS = (
    "identity",
    "autocontrast",
    "equalize",
    "brightness",
    "sharpness",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
    "rotate",
)
#: grey that affine ops fill uncovered pixels with
RANDAUG_FILL = [128, 128, 128]


class AlbefRandAugment:
    """ALBEF's RandAugment(N=2, M=7): each of ``n`` ops drawn from :data:`RANDAUG_OPS` is applied
    with probability 0.5, with a magnitude of sign drawn at random.

    :meth:`draw` makes a call's random draws (Python's ``random``) and :func:`apply_randaugment`
    applies them, to a PIL image (this transform) or to uint8 tensors ``[..., 3, H, W]`` (the same
    torchvision ops, on the training device: ``data.image.decode=device``)."""

    def __init__(self, n: int = 2, m: int = 7) -> None:
        self.n, self.level = n, m / 10.0

    def _signed(self, max_value: float) -> float:
        return self.level * max_value * random.choice((-1.0, 1.0))

    def _argument(self, name: str, width: int, height: int) -> float:
        """The argument of op ``name`` on a ``width`` x ``height`` image (its magnitude's sign drawn)."""
        if name in ("brightness", "sharpness"):
            return 1 + self._signed(0.9)  # the enhancement factor
        if name in ("shear_x", "shear_y"):
            return math.degrees(math.atan(self._signed(0.3)))  # degrees
        if name in ("translate_x", "translate_y"):
            return int(self._signed(0.45) * (width if name == "translate_x" else height))  # pixels
        if name == "rotate":
            return self._signed(30.0)  # degrees
        return 0.0  # identity, autocontrast, equalize: no magnitude, no draw

    def draw(self, width: int, height: int) -> list[tuple[int, float]]:
        """The ops one call applies to a ``width`` x ``height`` image, as (index in
        :data:`RANDAUG_OPS`, argument) in the order applied: the random draws of the call, in order."""
        drawn = []
        for op in random.choices(range(len(RANDAUG_OPS)), k=self.n):
            if random.random() < 0.5:
                drawn.append((op, self._argument(RANDAUG_OPS[op], width, height)))
        return drawn

    def __call__(self, im: Image.Image) -> Image.Image:
        return apply_randaugment(im, self.draw(*im.size))


def apply_randaugment(im: Any, ops: Sequence[tuple[int, float]], F: Any = TF) -> Any:
    """``ops`` (:meth:`AlbefRandAugment.draw`) applied in order to ``im``: a PIL image, or a uint8
    tensor ``[..., 3, H, W]``, with the functional ops of ``F`` (torchvision's
    ``transforms.functional``, or ``transforms.v2.functional``); affine ops fill with :data:`RANDAUG_FILL`."""
    for op, v in ops:
        name = RANDAUG_OPS[op]
        if name == "autocontrast":
            im = F.autocontrast(im)
        elif name == "equalize":
            im = F.equalize(im)
        elif name == "brightness":
            im = F.adjust_brightness(im, v)
        elif name == "sharpness":
            im = F.adjust_sharpness(im, v)
        elif name in ("shear_x", "shear_y", "translate_x", "translate_y"):
            x, y = name.endswith("_x"), name.endswith("_y")
            shear = [v if x else 0.0, v if y else 0.0] if name.startswith("shear") else [0.0, 0.0]
            shift = [int(v) if x else 0, int(v) if y else 0] if name.startswith("translate") else [0, 0]
            im = F.affine(im, angle=0.0, translate=shift, scale=1.0, shear=shear, fill=RANDAUG_FILL)
        elif name == "rotate":
            im = F.rotate(im, v, interpolation=InterpolationMode.BILINEAR, fill=RANDAUG_FILL)
    return im


def _normalize(cfg: ImageConfig) -> list:
    return [T.ToTensor(), T.Normalize(cfg.mean, cfg.std)]


class PixelNorm(torch.nn.Module):
    """Normalisation on the device for uint8 images (``data.image.uint8``): the loader ships
    ``[B, 3, H, W]`` uint8 (4x fewer bytes to collate, pin and copy), and this computes
    ``(x / 255 - mean) / std`` as one multiply-add where the model runs. Float images pass
    through unchanged (they were normalised by the transform)."""

    def __init__(self, cfg: ImageConfig) -> None:
        super().__init__()
        mean, std = torch.tensor(cfg.mean).view(3, 1, 1), torch.tensor(cfg.std).view(3, 1, 1)
        self.register_buffer("scale", 1.0 / (255.0 * std), persistent=False)
        self.register_buffer("shift", -mean / std, persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8:
            return images
        return torch.addcmul(self.shift, images.float(), self.scale)


def train_transform(res: int, cfg: ImageConfig) -> Callable[[Image.Image], torch.Tensor]:
    """RandomResizedCrop(scale) -> flip -> RandAugment -> normalise (each step optional); with
    ``cfg.uint8`` the last step is a uint8 tensor instead, normalised on the device (:class:`PixelNorm`)."""
    steps: list = []
    if cfg.crop_scale is not None:
        steps.append(T.RandomResizedCrop(res, scale=tuple(cfg.crop_scale), interpolation=InterpolationMode.BICUBIC))
    else:
        steps.append(T.Resize((res, res), interpolation=InterpolationMode.BICUBIC))
    if cfg.hflip:
        steps.append(T.RandomHorizontalFlip())
    if cfg.randaugment:
        steps.append(AlbefRandAugment())
    return T.Compose(steps + ([T.PILToTensor()] if cfg.uint8 else _normalize(cfg)))


def split_crop(transform: Callable) -> tuple[Any, Callable]:
    """(crop step, the rest) of a :func:`train_transform`: its first step (``RandomResizedCrop`` or
    ``Resize((res, res))``) and a Compose of the others (flip, RandAugment, to tensor: image
    ``[3, res, res]``)."""
    composed: Any = transform  # a torchvision Compose
    steps = list(getattr(composed, "transforms", [None]))
    if not isinstance(steps[0], (T.RandomResizedCrop, T.Resize)) or not isinstance(steps[0].size, (list, tuple)):
        raise TypeError(f"expected a training transform starting with a crop or a resize to (h, w), got {transform!r}")
    return steps[0], T.Compose(steps[1:])


def test_transform(res: int, cfg: ImageConfig) -> Callable[[Image.Image], torch.Tensor]:
    """Resize((res, res), bicubic), no centre crop -> normalise."""
    return T.Compose([T.Resize((res, res), interpolation=InterpolationMode.BICUBIC)] + _normalize(cfg))


def load_tokenizer(cfg: TextConfig, files: Optional[str] = None):
    """BERT WordPiece tokenizer (bert-base-uncased vocabulary by default, shipped offline), or the
    tokenizer files of ``files`` (a ``save_pretrained`` directory), marked with ``cfg.albef_compat``."""
    from transformers import BertTokenizerFast

    from vlp.sources import minilm_path, resolve_source

    src = files or (resolve_source(cfg.tokenizer) if cfg.tokenizer else str(minilm_path()))
    tokenizer = BertTokenizerFast.from_pretrained(src)
    # the config reaches every tokenize() call site through the tokenizer (collators, eval embedding)
    setattr(tokenizer, ALBEF_COMPAT_ATTR, bool(cfg.albef_compat))
    return tokenizer


#: Tokenizer attribute set by :func:`load_tokenizer` from ``model.text.albef_compat``.
ALBEF_COMPAT_ATTR = "vlp_albef_compat"


def is_albef_compat(tokenizer) -> bool:
    """The ``model.text.albef_compat`` of the config ``tokenizer`` was loaded for (:func:`load_tokenizer`)."""
    return bool(getattr(tokenizer, ALBEF_COMPAT_ATTR, False))


#: ``data.text_padding``: pad each batch to its longest text, or every batch to ``max_len``.
TEXT_PADDING = ("longest", "max_len")


def tokenize(
    tokenizer,
    texts: Sequence[str],
    max_len: Optional[int],
    padding: str = "longest",
    albef_compat: Optional[bool] = None,
    clean: Optional[Callable[[str], str]] = None,
) -> dict[str, torch.Tensor]:
    """Clean (``clean``, default :func:`pre_caption` in the ``albef_compat`` mode) and tokenize ->
    ``input_ids``/``attention_mask`` [B, T], truncated to ``max_len`` tokens (None: not truncated;
    ALBEF's VQA test questions and NLVR2 sentences). ``padding``: ``longest`` (T = the longest text in
    the batch) or ``max_len`` (T = ``max_len`` for every batch: the shape a cross-rank gather of text needs).

    ``albef_compat`` (default: the tokenizer's ``model.text.albef_compat``, see :func:`load_tokenizer`):
    ALBEF's own caption cleaning (:func:`albef_pre_caption`) and its ``[CLS] text`` without the
    trailing ``[SEP]`` (so ``max_len - 1`` word pieces), padded after."""
    if padding not in TEXT_PADDING:
        raise ValueError(f"padding must be one of {list(TEXT_PADDING)}, got {padding!r}")
    if padding == "max_len" and max_len is None:
        raise ValueError("padding='max_len' needs a max_len")
    compat = albef_compat if albef_compat is not None else is_albef_compat(tokenizer)
    clean = clean or (albef_pre_caption if compat else pre_caption)
    cleaned = [clean(t) for t in texts]
    if compat:
        return _tokenize_albef(tokenizer, cleaned, max_len, padding)
    enc = tokenizer(
        cleaned,
        padding="longest" if padding == "longest" else "max_length",
        truncation=max_len is not None,
        max_length=max_len,
        return_tensors="pt",
    )
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def _tokenize_albef(tokenizer, texts: Sequence[str], max_len: Optional[int], padding: str) -> dict[str, torch.Tensor]:
    """ALBEF's forked BERT tokenizer on single texts: ``[CLS] w_1 .. w_k`` (k <= max_len - 1), no [SEP]."""
    cut = {"truncation": True, "max_length": max_len - 1} if max_len is not None else {"truncation": False}
    pieces = tokenizer(list(texts), add_special_tokens=False, **cut)["input_ids"]
    rows = [[tokenizer.cls_token_id, *p] for p in pieces]
    width = max_len if padding == "max_len" else max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        attention_mask[i, : len(r)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}
