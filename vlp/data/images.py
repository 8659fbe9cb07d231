"""Opening images the way training needs them: any mode to RGB, tiny images upscaled, truncated
files and decompression bombs refused, each problem one :class:`BadImage` naming the file."""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import numpy as np
from PIL import Image, UnidentifiedImageError

from vlp.errors import BadImage

#: pixel count above which an image is refused (Pillow's own decompression-bomb threshold)
MAX_PIXELS = 89_478_485
#: images whose shorter side is below this are upscaled (bicubic, aspect kept) before any transform
MIN_SIDE = 16
#: what transparent pixels are composited onto
BACKGROUND = (255, 255, 255)


def to_rgb(im: Image.Image) -> Image.Image:
    """Grayscale, 16-bit, CMYK, palette and alpha images as 8-bit RGB; transparency is composited
    onto :data:`BACKGROUND` (dropping alpha would expose whatever colour transparent pixels hold)."""
    if im.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        a = np.asarray(im, dtype=np.float64)
        scale = 255.0 / 65535.0 if a.max(initial=0.0) > 255 else 1.0
        im = Image.fromarray(np.clip(a * scale, 0, 255).astype(np.uint8), "L")
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, BACKGROUND + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im.convert("RGB")


def open_image(
    path: str,
    origin: str,
    max_pixels: int = MAX_PIXELS,
    min_side: int = MIN_SIDE,
    before_load: Optional[Callable[[Image.Image], None]] = None,
) -> Image.Image:
    """Open ``path`` fully decoded as RGB. ``origin`` (e.g. ``ann.json entry 12``) starts every
    error message. Images over ``max_pixels`` (0: no limit) are refused before decoding; those with
    a side below ``min_side`` are upscaled so that it reaches ``min_side``. ``before_load(im)``: called
    with the opened, not yet decoded image once its size passed the limit (e.g. to choose a JPEG
    draft scale, ``im.draft``)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the limit is checked here
            with Image.open(path) as im:
                w, h = im.size
                if max_pixels and w * h > max_pixels:
                    raise BadImage(
                        f"{origin}: image {path} is {w}x{h} = {w * h} pixels, more than the limit of "
                        f"{max_pixels} (decompression-bomb guard, data.max_image_pixels)"
                    )
                if before_load is not None:
                    before_load(im)
                im.load()
                rgb = to_rgb(im)
    except BadImage:
        raise
    except FileNotFoundError:
        raise BadImage(f"{origin}: image file not found: {path}") from None
    except IsADirectoryError:
        raise BadImage(f"{origin}: {path} is a directory, not an image file") from None
    except Image.DecompressionBombError as e:
        raise BadImage(f"{origin}: image {path} refused as a decompression bomb: {e}") from None
    except UnidentifiedImageError:
        raise BadImage(f"{origin}: cannot read image {path}: not an image file Pillow can identify") from None
    except (OSError, SyntaxError, ValueError) as e:  # truncated or corrupt data (Pillow raises all three)
        raise BadImage(f"{origin}: cannot read image {path}: truncated or corrupt ({e})") from None
    return upscale_tiny(rgb, min_side)


def upscale_tiny(im: Image.Image, min_side: int = MIN_SIDE) -> Image.Image:
    """``im`` upscaled (bicubic, aspect kept) so that its shorter side is ``min_side``, if it is shorter."""
    if min(im.size) >= min_side:
        return im
    s = min_side / min(im.size)
    return im.resize(
        (max(min_side, round(im.width * s)), max(min_side, round(im.height * s))), Image.Resampling.BICUBIC
    )
