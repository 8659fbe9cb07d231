"""Opening images the way training needs them: any mode to RGB, tiny images upscaled, truncated
files and decompression bombs refused, each problem one :class:`BadImage` naming the file."""

from __future__ import annotations

import io
import os
import stat
import struct
import warnings
from contextlib import ExitStack, contextmanager
from typing import BinaryIO, Callable, Iterator, Optional

import numpy as np
from PIL import Image, UnidentifiedImageError

from vlp.errors import BadImage
from vlp.regular_files import kind_of

#: pixel count of the decompression-bomb guard (Pillow's own threshold): an image is refused when
#: its decoded bytes exceed those of an 8-bit RGB image of this many pixels (:func:`decoded_bytes`)
MAX_PIXELS = 89_478_485
#: decoded bytes per pixel of Pillow's modes (others: one byte per band)
_MODE_BYTES = {"1": 1, "I": 4, "F": 4, "I;16": 2, "I;16B": 2, "I;16L": 2, "I;16N": 2}
#: images whose shorter side is below this are upscaled (bicubic, aspect kept) before any transform
MIN_SIDE = 16
#: what transparent pixels are composited onto
BACKGROUND = (255, 255, 255)


def decoded_bytes(im: Image.Image) -> int:
    """Bytes of ``im`` decoded in its own mode: width x height x bytes per pixel."""
    return im.width * im.height * _MODE_BYTES.get(im.mode, len(im.getbands()))


def to_rgb(im: Image.Image) -> Image.Image:
    """Grayscale, 16-bit, CMYK, palette and alpha images as 8-bit RGB; transparency is composited
    onto :data:`BACKGROUND` (dropping alpha would expose whatever colour transparent pixels hold).
    16-bit, 32-bit and float images are scaled to 8 bits (by 255/65535 when any value exceeds 255,
    then clipped to [0, 255]) a block of rows at a time, so the temporaries stay small."""
    if im.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        im = Image.fromarray(_to_8bit(np.asarray(im)), "L")
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
        _regular_file(path, origin)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the limit is checked here
            try:
                with Image.open(path) as im:
                    rgb = _decoded(im, path, origin, max_pixels, before_load)
            except Image.DecompressionBombError:  # Pillow's global cap, not vlp's: vlp's limit decides
                with _opened_past_pillow_cap(path) as im:
                    rgb = _decoded(im, path, origin, max_pixels, before_load)
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


def _decoded(
    im: Image.Image, path: object, origin: str, max_pixels: int, before_load: Optional[Callable[[Image.Image], None]]
) -> Image.Image:
    """``im`` (opened, not decoded) decoded as RGB, after :func:`open_image`'s size limit."""
    if max_pixels and decoded_bytes(im) > 3 * max_pixels:
        raise BadImage(
            f"{origin}: image {path} is {im.width}x{im.height} {im.mode} = {decoded_bytes(im)} bytes decoded, more "
            f"than the limit of {3 * max_pixels} (an 8-bit RGB image of {max_pixels} pixels: the "
            "decompression-bomb guard, data.max_image_pixels)"
        )
    if before_load is not None:
        before_load(im)
    im.load()
    return to_rgb(im)


@contextmanager
def _opened_past_pillow_cap(path: object) -> Iterator[Image.Image]:
    """``Image.open(path)`` without Pillow's own pixel cap (twice ``Image.MAX_IMAGE_PIXELS``, a
    process-wide setting), for :func:`open_image` to apply ``data.max_image_pixels`` instead (0: no
    limit) without changing that setting for other callers: Pillow's registered format plugins,
    tried in its order on the file's first bytes."""
    Image.init()
    with ExitStack() as stack:
        if isinstance(path, (str, os.PathLike)):
            fp: BinaryIO = stack.enter_context(open(path, "rb"))
        else:
            fp = path  # type: ignore[assignment]  # a file object (a shard member)
        fp.seek(0)
        prefix = fp.read(16)
        for fmt in Image.ID:
            factory, accept = Image.OPEN[fmt]
            accepted = accept is None or accept(prefix)  # a str: Pillow's warning that the format does not fit
            if not accepted or isinstance(accepted, str):
                continue
            fp.seek(0)
            try:
                im = factory(fp, str(path))
            except (SyntaxError, IndexError, TypeError, struct.error):
                continue
            with im:
                yield im
            return
        raise UnidentifiedImageError(f"cannot identify image file {path}")


def _to_8bit(a: np.ndarray, rows: int = 256) -> np.ndarray:
    """``a`` [H, W] (16/32-bit integers or floats) as uint8: ``clip(a * scale, 0, 255)`` truncated,
    scale 255/65535 when the maximum exceeds 255 else 1; float64 only ``rows`` rows at a time."""
    scale = 255.0 / 65535.0 if a.max(initial=0) > 255 else 1.0
    out = np.empty(a.shape, dtype=np.uint8)
    for lo in range(0, a.shape[0], rows):
        out[lo : lo + rows] = np.clip(a[lo : lo + rows].astype(np.float64) * scale, 0, 255)
    return out


def _regular_file(path: object, origin: str) -> None:
    """Refuse a path that names a special file (FIFO, device, socket) before opening it: opening a
    FIFO blocks until a writer comes. File objects (shard members) pass; a missing path and a
    directory are left to :func:`open_image`'s own messages."""
    if not isinstance(path, (str, os.PathLike)):
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise BadImage(f"{origin}: {path} is {kind_of(mode)}, not a regular file: not an image file")


def upscale_tiny(im: Image.Image, min_side: int = MIN_SIDE) -> Image.Image:
    """``im`` upscaled (bicubic, aspect kept) so that its shorter side is ``min_side``, if it is shorter."""
    if min(im.size) >= min_side:
        return im
    s = min_side / min(im.size)
    return im.resize(
        (max(min_side, round(im.width * s)), max(min_side, round(im.height * s))), Image.Resampling.BICUBIC
    )


class MemberFile(io.BytesIO):
    """Image bytes named as their file (a shard member's ``KEY.jpg``) in :func:`open_image`'s messages."""

    def __init__(self, data: bytes, name: str) -> None:
        super().__init__(data)
        self.name = name

    def __str__(self) -> str:
        return self.name
