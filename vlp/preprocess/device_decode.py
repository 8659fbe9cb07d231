"""JPEG decoding and augmentation on the training device (``data.image.decode=device``).

**In the loader worker** nothing is decoded that the device can decode: :func:`open_for_device`
reads a file's bytes and its size from the header (Pillow's lazy open), and :class:`DeviceDraws`
makes every random choice of the training transform (:func:`vlp.preprocess.transforms.train_transform`)
with the same calls, in the same order, as the transform makes on the decoded image under
``full``: RandomResizedCrop's box (torch), the flip (torch), RandAugment's ops and signed
magnitudes (Python's ``random``, :meth:`~vlp.preprocess.transforms.AlbefRandAugment.draw`). So a seeded
item gets ``full``'s crop box, flip and ops, and leaves both random streams as ``full`` does. The
item's image is a :class:`DeviceImage`: the JPEG's bytes (uint8 ``[N]``) and those draws.

Only plain files take that route: 8-bit 3-component JPEGs (baseline, extended or progressive
Huffman, every quantisation table defined, ending with the EOI marker) within the pixel limit and
not tiny. Anything else (PNG and other formats, grayscale / CMYK JPEGs, truncated or corrupt
files, images over ``max_image_pixels``, tiny images) is opened by
:func:`vlp.preprocess.images.open_image` as under ``full``: decoded on the host (converted, upscaled,
or refused with ``full``'s :class:`~vlp.errors.BadImage`, which the bad-sample policy handles), and
shipped as uint8 ``[3, H, W]``, un-augmented, with the same draws.

**Collation** (:func:`collate_images`): a :class:`DeviceBatch` (the payloads, variable-length,
and the draws as small tensors) in ``batch["images"]``.

**On the device** (:func:`decode_images`, called by the task's ``on_device`` before
:class:`~vlp.preprocess.transforms.PixelNorm`, outside any compiled graph): the batch's JPEGs are decoded
in one ``torchvision.io.decode_jpeg(list, device=...)`` call (nvJPEG on CUDA; on a CPU device it
is libjpeg-turbo, which is how the CPU tests run this path), then each image is cropped and resized
(bicubic, antialiased), flipped and RandAugment-ed with torchvision's tensor ops and the drawn
arguments, giving uint8 ``[B, 3, H, W]``. The pixels are close to ``full``'s, not equal: tensor
resampling and affine ops are not Pillow's (``tests/data/test_device_decode.py`` measures it).
A JPEG that passed the worker's checks but fails on the device is decoded on the host by Pillow
instead; one that fails there too stops the run with a :class:`~vlp.errors.DataError` naming it
(at this point ``data.on_bad_sample=skip`` can no longer replace the sample).
"""

from __future__ import annotations

import io
import os
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF
from torchvision.transforms.v2 import functional as F2

from vlp.errors import DataError
from vlp.preprocess.images import MAX_PIXELS, MIN_SIDE, MemberFile, decoded_bytes, open_image
from vlp.preprocess.transforms import AlbefRandAugment, apply_randaugment

#: SOF markers decode_jpeg (libjpeg-turbo and nvJPEG) takes: baseline, extended, progressive Huffman
_SOF_OK = (0xC0, 0xC1, 0xC2)
#: markers without a length (RSTn, TEM)
_STANDALONE = {0x01, *range(0xD0, 0xD8)}

# ----------------------------------------------------------------------------- loader worker


@dataclass(frozen=True)
class JpegFile:
    """A JPEG left encoded: its bytes, size (Pillow's lazy open) and name for messages."""

    data: bytes
    size: tuple[int, int]  # width, height
    name: str  # "ORIGIN: image PATH"


def plain_jpeg(data: bytes) -> bool:
    """Whether ``data`` is a JPEG that ``decode_jpeg`` takes as it is: SOI, then up to the scan an
    8-bit 3-component frame (SOF0/1/2, Huffman coded) whose quantisation tables are all defined and
    at least one Huffman table; and EOI at the end (a truncated file has none). Reads the headers only."""
    if data[:2] != b"\xff\xd8" or data[-2:] != b"\xff\xd9":
        return False
    i, tables, frame, huffman = 2, set(), None, False
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return False
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _STANDALONE:
            i += 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        seg = data[i + 4 : i + 2 + length]
        if length < 2 or len(seg) != length - 2:
            return False
        if marker == 0xDA:  # start of scan: the headers are complete
            return frame is not None and huffman and frame <= tables
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a frame
            if marker not in _SOF_OK or len(seg) < 15 or seg[0] != 8 or seg[5] != 3:  # 8 bits, 3 components
                return False
            frame = {seg[6 + 3 * c + 2] for c in range(3)}  # the components' quantisation tables
        elif marker == 0xDB:  # quantisation tables
            while seg:
                tables.add(seg[0] & 15)
                seg = seg[1 + 64 * (1 + (seg[0] >> 4)) :]
        elif marker == 0xC4:
            huffman = True
        i += 2 + length
    return False


def _read_plain_jpeg(path: Any, origin: str, max_pixels: int, min_side: int) -> Optional[JpegFile]:
    """``path`` (a path or a shard member's file object) as a :class:`JpegFile` when it is a plain
    RGB JPEG (:func:`plain_jpeg`) within ``max_pixels`` and not tiny; None for anything else and
    for any problem (then :func:`open_image` decodes it, or raises ``full``'s error)."""
    try:
        if isinstance(path, io.BytesIO):
            data = path.getvalue()
        elif os.path.isfile(path):  # not a FIFO or device, which open_image refuses
            data = Path(path).read_bytes()
        else:
            return None
        if not plain_jpeg(data):
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the limit is checked here
            with Image.open(io.BytesIO(data)) as im:  # lazy: the header only
                if im.format != "JPEG" or im.mode != "RGB" or min(im.size) < min_side:
                    return None
                if max_pixels and decoded_bytes(im) > 3 * max_pixels:
                    return None
                return JpegFile(data, im.size, f"{origin}: image {path}")
    except Exception:  # noqa: BLE001 - open_image reads it again and names the problem
        return None


def open_for_device(
    path: Any, origin: str, max_pixels: int = MAX_PIXELS, min_side: int = MIN_SIDE
) -> Union[JpegFile, Image.Image]:
    """A plain JPEG's bytes (:class:`JpegFile`), else the image decoded as ``full`` decodes it
    (:func:`~vlp.preprocess.images.open_image`: RGB, tiny images upscaled; its limits and errors)."""
    jpeg = _read_plain_jpeg(path, origin, max_pixels, min_side)
    return jpeg if jpeg is not None else open_image(path, origin, max_pixels, min_side)


@dataclass(frozen=True)
class DeviceImage:
    """One training image for the device: ``data`` (uint8: a JPEG's bytes ``[N]``, or a host-decoded
    image ``[3, H, W]``) and the training transform's draws: the crop ``box`` (top, left, height,
    width, in ``data``'s pixels), ``flip``, the RandAugment ``ops`` ((index, argument) pairs,
    :meth:`~vlp.preprocess.transforms.AlbefRandAugment.draw`), the output ``size`` (height, width),
    ``max_ops`` (RandAugment's N: the width of :attr:`DeviceBatch.ops`) and ``name``, for messages."""

    data: torch.Tensor
    box: tuple[int, int, int, int]
    flip: bool
    ops: tuple[tuple[int, float], ...]
    size: tuple[int, int]
    max_ops: int
    name: str


def _sized(width: int, height: int) -> torch.Tensor:
    """A ``[3, height, width]`` tensor of no memory: what ``RandomResizedCrop.get_params`` reads the size of."""
    return torch.empty((), dtype=torch.uint8).expand(3, height, width)


class DeviceDraws:
    """The loader-side half of a uint8 training ``transform`` (RandomResizedCrop or Resize((h, w)),
    then optionally RandomHorizontalFlip and :class:`~vlp.preprocess.transforms.AlbefRandAugment`, then
    PILToTensor): called on what :func:`open_for_device` returns, it makes the transform's random
    draws and returns a :class:`DeviceImage`; :func:`decode_images` applies them on the device."""

    def __init__(self, transform: Callable) -> None:
        steps = list(getattr(transform, "transforms", [None]))
        crop, *middle, last = steps if len(steps) > 1 else [None, None]
        if not isinstance(crop, (T.RandomResizedCrop, T.Resize)) or not isinstance(crop.size, (list, tuple)):
            raise TypeError(
                f"expected a training transform starting with a crop or a resize to (h, w), got {transform!r}"
            )
        if not isinstance(last, T.PILToTensor):
            raise ValueError(
                "data.image.decode=device needs the uint8 training transform (ending with PILToTensor: "
                f"data.image.uint8=true), got {transform!r}"
            )
        unknown = [s for s in middle if not isinstance(s, (T.RandomHorizontalFlip, AlbefRandAugment))]
        if unknown:
            raise TypeError(f"data.image.decode=device cannot apply {unknown} on the device")
        self.crop = crop
        self.size = (int(crop.size[0]), int(crop.size[1]))
        self.flip = next((s for s in middle if isinstance(s, T.RandomHorizontalFlip)), None)
        self.randaugment = next((s for s in middle if isinstance(s, AlbefRandAugment)), None)

    def __call__(self, image: Union[JpegFile, Image.Image]) -> DeviceImage:
        w, h = image.size
        crop = self.crop
        if isinstance(crop, T.RandomResizedCrop):
            top, left, ch, cw = crop.get_params(_sized(w, h), crop.scale, crop.ratio)  # torch's stream
        else:
            top, left, ch, cw = 0, 0, h, w
        flip = self.flip is not None and bool(torch.rand(1) < self.flip.p)  # RandomHorizontalFlip's draw
        ra = self.randaugment
        ops = tuple(ra.draw(self.size[1], self.size[0])) if ra is not None else ()  # Python's stream
        if isinstance(image, JpegFile):
            data, name = torch.frombuffer(bytearray(image.data), dtype=torch.uint8), image.name
        else:
            data, name = TF.pil_to_tensor(image), ""
        return DeviceImage(data, (top, left, ch, cw), flip, ops, self.size, ra.n if ra is not None else 0, name)


# ----------------------------------------------------------------------------- collation


@dataclass(frozen=True)
class DeviceBatch:
    """``batch["images"]`` under ``data.image.decode=device``: B images to decode and augment on
    the device (:func:`decode_images` gives uint8 ``[B, 3, H, W]``).

    ``data``: per image a JPEG's bytes (uint8 ``[N]``) or a host-decoded image (uint8 ``[3, h, w]``);
    ``boxes`` ``[B, 4]`` (top, left, height, width), ``flips`` ``[B]`` bool, ``ops`` ``[B, N]``
    (index in :data:`~vlp.preprocess.transforms.RANDAUG_OPS`, -1: none) and ``args`` ``[B, N]`` float64
    (their arguments), ``size`` (H, W) and ``names`` (for messages). The draws stay on the host:
    they are read there to launch each image's ops, so reading them costs no device sync."""

    data: list[torch.Tensor]
    boxes: torch.Tensor
    flips: torch.Tensor
    ops: torch.Tensor
    args: torch.Tensor
    size: tuple[int, int]
    names: list[str]

    def __len__(self) -> int:
        return len(self.data)

    def to(self, device: Union[str, torch.device], non_blocking: bool = False) -> DeviceBatch:
        """The host-decoded images moved to ``device`` (what accelerate and the training loop call);
        JPEG bytes stay on the host, where ``decode_jpeg`` reads them, and so do the draws."""
        data = [d if d.dim() == 1 else d.to(device, non_blocking=non_blocking) for d in self.data]
        return replace(self, data=data)

    def pin_memory(self) -> DeviceBatch:
        """Host-decoded images in pinned memory (the DataLoader's ``pin_memory``), for an asynchronous copy."""
        return replace(self, data=[d if d.dim() == 1 else d.pin_memory() for d in self.data])


def collate_images(images: Sequence[Any]) -> Any:
    """A batch's ``images``: tensors ``[3, H, W]`` stacked ``[B, 3, H, W]``, or :class:`DeviceImage`
    items as one :class:`DeviceBatch`."""
    if not isinstance(images[0], DeviceImage):
        return torch.stack(list(images))
    n = max(im.max_ops for im in images)
    ops = torch.full((len(images), n), -1, dtype=torch.long)
    args = torch.zeros((len(images), n), dtype=torch.float64)
    for row, im in enumerate(images):
        for k, (op, arg) in enumerate(im.ops):
            ops[row, k], args[row, k] = op, arg
    return DeviceBatch(
        data=[im.data for im in images],
        boxes=torch.tensor([im.box for im in images], dtype=torch.long),
        flips=torch.tensor([im.flip for im in images], dtype=torch.bool),
        ops=ops,
        args=args,
        size=images[0].size,
        names=[im.name for im in images],
    )


# ----------------------------------------------------------------------------- on the device


def _decode(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """``decode_jpeg`` of JPEG bytes (uint8 ``[N]`` on the host) to RGB uint8 ``[3, h, w]`` on ``device``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*decoding and encoding capabilities of TorchVision are deprecated")
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


def _decode_one(data: torch.Tensor, name: str, device: torch.device) -> torch.Tensor:
    """One JPEG on ``device``, else decoded by Pillow on the host (as ``full`` would have); a file
    neither can decode is a :class:`DataError` naming it."""
    try:
        return _decode([data], device)[0]
    except RuntimeError as e:
        origin, _, path = name.partition(": image ")
        try:
            member: Any = MemberFile(data.numpy().tobytes(), path)  # named as the file in messages
            rgb = open_image(member, origin)
        except DataError as bad:
            raise DataError(
                f"{bad} (data.image.decode=device: decode_jpeg on {device} failed too: {e}; found after the "
                "loader's checks, so data.on_bad_sample cannot replace it; data.image.decode=full can)"
            ) from None
        return TF.pil_to_tensor(rgb).to(device)


def decode_jpegs(data: list[torch.Tensor], names: list[str], device: torch.device) -> list[torch.Tensor]:
    """JPEG bytes (uint8 ``[N_i]``, host) -> RGB uint8 ``[3, h_i, w_i]`` on ``device``: one batched
    ``decode_jpeg`` call; when it fails, image by image (:func:`_decode_one`), naming a bad file."""
    if not data:
        return []
    try:
        return _decode(data, device)
    except RuntimeError:
        return [_decode_one(d, n, device) for d, n in zip(data, names)]


def augment(
    image: torch.Tensor,
    box: Sequence[int],
    flip: bool,
    ops: Sequence[tuple[int, float]],
    size: Sequence[int],
) -> torch.Tensor:
    """uint8 ``[3, h, w]`` -> uint8 ``[3, H, W]`` (``size``): the ``box`` (top, left, height, width)
    resized (bicubic, antialiased), flipped when ``flip``, then the RandAugment ``ops``, with
    torchvision's ``transforms.v2.functional`` tensor ops (uint8 kernels where it has them)."""
    top, left, height, width = (int(v) for v in box)
    out = F2.resized_crop(image, top, left, height, width, list(size), InterpolationMode.BICUBIC, antialias=True)
    if flip:
        out = F2.hflip(out)
    return apply_randaugment(out, ops, F2)


def decode_images(batch: DeviceBatch, device: Union[str, torch.device]) -> torch.Tensor:
    """A :class:`DeviceBatch` decoded and augmented on ``device``: uint8 ``[B, 3, H, W]`` (in fp32
    arithmetic whatever autocast the caller is under, without autograd)."""
    device = torch.device(device)
    with torch.no_grad(), torch.autocast(device.type, enabled=False):
        return _decode_images(batch, device)


def _decode_images(batch: DeviceBatch, device: torch.device) -> torch.Tensor:
    jpegs = [i for i, d in enumerate(batch.data) if d.dim() == 1]
    decoded = dict(zip(jpegs, decode_jpegs([batch.data[i] for i in jpegs], [batch.names[i] for i in jpegs], device)))
    boxes, flips, ops, args = batch.boxes.tolist(), batch.flips.tolist(), batch.ops.tolist(), batch.args.tolist()
    out = []
    for i, data in enumerate(batch.data):
        image = decoded[i] if i in decoded else data.to(device, non_blocking=True)
        drawn = [(op, arg) for op, arg in zip(ops[i], args[i]) if op >= 0]
        out.append(augment(image, boxes[i], flips[i], drawn, batch.size))
    return torch.stack(out)
