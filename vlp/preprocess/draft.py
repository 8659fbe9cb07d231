"""JPEG draft-mode decoding for training (``data.image.decode=draft``): libjpeg decodes a JPEG at
1/2, 1/4 or 1/8 of its size in the DCT, several times faster than the full decode and the resize
of a large crop down to the output resolution.

**Per crop** (:func:`open_crop_draft`, what training uses): the training transform's crop box is
drawn first from the file's size alone (``RandomResizedCrop.get_params``: the same random draws, in
the same order, as the transform makes on the fully decoded image, so a seeded item gets the same
box), then the JPEG is decoded at the largest reduced scale at which *that* box still has both
sides at least the output resolution (:func:`crop_draft_scale`), and the box, mapped to the reduced
image, is resized to the output. So no crop is ever upsampled where the full decode would have
downsampled it; only the decoder's own downscaling changes the pixels (about 0.5/255 on average).
Non-JPEGs, JPEGs whose crop cannot be halved and tiny images (upscaled first) take the full decode
and the transform's own crop: the same tensors, bit for bit.

**Per image** (:func:`open_image_draft`, measured by ``vlp bench --loader-only`` only): one scale
per file, the largest at which *every* crop the transform can take still has both sides at least the
output resolution (:func:`draft_scale`); with ALBEF's crop scale it reduces only images over about
1.75 MP.

:class:`Decoder` is how a training dataset opens its images for a transform under any
``data.image.decode`` (:class:`vlp.data.datasets.ImageTextDataset`, :class:`vlp.data.shards.ShardStream`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as TF

from vlp.preprocess.device_decode import DeviceDraws, open_for_device
from vlp.preprocess.images import MAX_PIXELS, MIN_SIDE, open_image

#: ``data.image.decode``: the full decode, JPEG draft mode chosen per crop, or decoding on the
#: training device (:mod:`vlp.preprocess.device_decode`)
DECODES = ("full", "draft", "device")
#: libjpeg's reduced decoding scales (1/d), largest first
JPEG_SCALES = (8, 4, 2, 1)
#: RandomResizedCrop's aspect-ratio range (torchvision's default, which the training transform uses)
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)

# ----------------------------------------------------------------------------- per crop


def split_crop(transform: Callable) -> tuple[Any, Callable]:
    """(crop step, the rest) of a :func:`~vlp.preprocess.transforms.train_transform`: its first step
    (``RandomResizedCrop`` or ``Resize((res, res))``) and a Compose of the others (flip,
    RandAugment, to tensor: image ``[3, res, res]``)."""
    composed: Any = transform  # a torchvision Compose
    steps = list(getattr(composed, "transforms", [None]))
    if not isinstance(steps[0], (T.RandomResizedCrop, T.Resize)) or not isinstance(steps[0].size, (list, tuple)):
        raise TypeError(f"expected a training transform starting with a crop or a resize to (h, w), got {transform!r}")
    return steps[0], T.Compose(steps[1:])


def crop_draft_scale(crop_w: int, crop_h: int, size: Sequence[int]) -> int:
    """The JPEG draft reduction ``d`` for *one* crop of ``crop_w`` x ``crop_h`` source pixels that
    is resized to ``size`` (height, width): the largest of 8, 4, 2 with ``crop_w // d >= width``
    and ``crop_h // d >= height``, else 1. The crop is then still resized *down* (or kept) from the
    reduced image, never up where the full decode would have gone down."""
    return next(d for d in JPEG_SCALES if d == 1 or (crop_w // d >= size[1] and crop_h // d >= size[0]))


def open_crop_draft(
    path: Any, origin: str, crop: Any, max_pixels: int = MAX_PIXELS, min_side: int = MIN_SIDE
) -> tuple[Image.Image, int]:
    """``crop(open_image(path))`` with JPEG draft decoding chosen *per crop* (module doc): the box is
    drawn from the file's size before decoding, the JPEG decoded at 1/d (:func:`crop_draft_scale`),
    and the box, mapped to the reduced image, resized (the transform's interpolation, bicubic) to
    ``crop.size``. With d = 1 the result is the transform's own, pixel for pixel. Non-JPEGs, tiny
    images (upscaled first) and every problem take ``open_image`` and ``crop`` as they are; limits
    and errors are ``open_image``'s, and a file that fails after its box was drawn leaves torch's
    random stream as the full decode would (untouched). ``path``: a path or a file object.
    Returns (RGB image, d)."""
    drawn: dict[str, Any] = {}

    def reduce(im: Image.Image) -> None:  # JPEGs not upscaled as tiny: draw the box, choose d
        w, h = im.size
        if im.format != "JPEG" or min(w, h) < min_side:
            return
        drawn["state"] = torch.random.get_rng_state()
        box = crop.get_params(im, crop.scale, crop.ratio) if isinstance(crop, T.RandomResizedCrop) else (0, 0, h, w)
        d = crop_draft_scale(box[3], box[2], list(crop.size))
        while d > 1 and min(w // d, h // d) < min_side:  # a reduced image must not be upscaled as tiny
            d //= 2
        drawn.update(box=box, full=(w, h), drafted=im.draft("RGB", (w // d, h // d)) if d > 1 else None)

    try:
        rgb = open_image(path, origin, max_pixels, min_side, before_load=reduce)
    except Exception:
        if "state" in drawn:
            torch.random.set_rng_state(drawn["state"])  # the full decode fails before its transform draws
        raise
    if not drawn:  # non-JPEG or tiny: as the full decode
        return crop(rgb), 1
    (top, left, ch, cw), (w, h), drafted, size = drawn["box"], drawn["full"], drawn["drafted"], list(crop.size)
    if drafted is None or rgb.size == (w, h):  # not reduced: the transform's own crop
        return TF.resized_crop(rgb, top, left, ch, cw, size, crop.interpolation, antialias=crop.antialias), 1
    f = w / drafted[1][2]  # the scale libjpeg applied (d): Pillow's box is the full image in reduced pixels
    box = (left / f, top / f, min(rgb.width, (left + cw) / f), min(rgb.height, (top + ch) / f))
    return rgb.resize((size[1], size[0]), TF.pil_modes_mapping[crop.interpolation], box=box), round(f)


class Decoder:
    """How a training dataset opens an image for ``transform`` under ``data.image.decode``
    (``mode``): ``full``: :func:`~vlp.preprocess.images.open_image`, then the whole transform; ``draft``:
    :func:`open_crop_draft` with the transform's first step (:func:`split_crop`), then the rest;
    ``device``: :func:`~vlp.preprocess.device_decode.open_for_device` (a plain JPEG's bytes, else the
    decoded image), then the transform's random draws
    (:class:`~vlp.preprocess.device_decode.DeviceDraws`: a ``DeviceImage`` that the task decodes and
    augments on the device). A dataset calls :meth:`open` and applies :attr:`transform`.
    ``last_scale``: the draft scale of the last image opened (``draft`` only; None otherwise)."""

    def __init__(self, transform: Callable[[Image.Image], torch.Tensor], mode: str = "full") -> None:
        if mode not in DECODES:
            raise ValueError(f"image decode {mode!r}: expected one of {list(DECODES)}")
        self.mode = mode
        self.crop: Optional[Any] = None
        self.transform: Callable[[Any], Any] = transform
        self.last_scale: Optional[int] = None
        if mode == "draft":
            self.crop, self.transform = split_crop(transform)
            self.last_scale = 1
        elif mode == "device":
            self.transform = DeviceDraws(transform)

    def open(self, path: Any, origin: str, max_pixels: int = MAX_PIXELS, min_side: int = MIN_SIDE) -> Any:
        """What to apply :attr:`transform` to: the image decoded (``full``), decoded and cropped
        (``draft``), or a plain JPEG left encoded (``device``)."""
        if self.mode == "device":
            return open_for_device(path, origin, max_pixels, min_side)
        if self.crop is None:
            return open_image(path, origin, max_pixels, min_side)
        im, self.last_scale = open_crop_draft(path, origin, self.crop, max_pixels, min_side)
        return im


# ----------------------------------------------------------------------------- per image


def min_crop_side(width: int, height: int, crop_scale: Optional[Sequence[float]], ratio=CROP_RATIO) -> int:
    """The shortest side (pixels) of any crop that the training transform can take from a
    ``width`` x ``height`` image before resizing it to ``res`` x ``res``.

    ``crop_scale`` None (``Resize((res, res))``, no crop): the whole image, ``min(width, height)``.
    Otherwise torchvision's RandomResizedCrop: a sampled crop of area fraction ``s >= s_min`` and
    aspect ratio ``r`` in ``ratio`` has sides ``round(sqrt(A s r))`` x ``round(sqrt(A s / r))``, so
    its shorter side is at least ``floor(sqrt(A s_min min(r_lo, 1/r_hi)))``; when 10 draws fail,
    its fallback is the centre crop of the whole width or height (ratio clamped to ``ratio``), whose
    shorter side is ``min(width, height)``. The result is the smaller of the two bounds."""
    whole = min(width, height)
    if crop_scale is None:
        return whole
    r_min = min(ratio[0], 1.0 / ratio[1])
    return min(whole, math.floor(math.sqrt(width * height * crop_scale[0] * r_min)))


def draft_scale(width: int, height: int, res: int, crop_scale: Optional[Sequence[float]], ratio=CROP_RATIO) -> int:
    """The JPEG draft reduction ``d`` (1, 2, 4 or 8: decode at 1/d scale) for a ``width`` x
    ``height`` image whose crop is resized to ``res`` x ``res``.

    **Rule:** the largest ``d`` such that every crop the transform can take from the reduced image
    (``width // d`` x ``height // d``; libjpeg gives ``ceil``, at least that) still has both sides
    ``>= res`` (:func:`min_crop_side`); 1 when none does. So with ``d > 1`` every crop is resized
    *down* (or kept) to ``res``: draft decoding never makes the network input upsampled where the
    full decode would have been downsampled, and the crop's position and relative size are drawn as
    before (RandomResizedCrop draws them relative to the image; only pixel rounding differs).

    With ``crop_scale [0.2, 1.0]`` at 256 px this needs ``sqrt(W H 0.15) / d >= 256``: 500x375 and
    1280x960 photos stay at ``d = 1``, 2000x1500 decodes at ``d = 2``; with ``[0.5, 1.0]``
    1280x960 gets ``d = 2`` and 2000x1500 ``d = 4``."""
    return next(d for d in JPEG_SCALES if d == 1 or min_crop_side(width // d, height // d, crop_scale, ratio) >= res)


def open_image_draft(
    path: str,
    origin: str,
    res: int,
    crop_scale: Optional[Sequence[float]],
    max_pixels: int = MAX_PIXELS,
    min_side: int = MIN_SIDE,
) -> Image.Image:
    """:func:`vlp.preprocess.images.open_image` with JPEG draft-mode decoding: a JPEG is decoded by
    libjpeg at 1/d scale, ``d = draft_scale(width, height, res, crop_scale)`` (1: full size);
    other formats decode fully. Limits and errors are ``open_image``'s own."""

    def reduce(im: Image.Image) -> None:
        if im.format == "JPEG":
            d = draft_scale(im.width, im.height, res, crop_scale)
            if d > 1:
                im.draft("RGB", (im.width // d, im.height // d))

    return open_image(path, origin, max_pixels, min_side, before_load=reduce)
