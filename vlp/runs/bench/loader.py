"""``vlp bench --loader-only``: images per second that one loader worker delivers to training.

A training run at 1,300 pairs/s needs 1,300 decoded, augmented images per second from the host's
cores. This benchmark times what a training loader worker does per image: open and decode the file
and apply the config's *training* transform (:func:`vlp.preprocess.transforms.train_transform` at the
model's resolution, ``data.image``), under the per-item seeds of training, in the real training
dataset (:class:`vlp.data.datasets.ImageTextDataset`) and ``workers`` DataLoader worker processes.

**Images.** Files the user names (``--images``: folders of .jpg/.jpeg/.png, or files), or ``n``
photo-sized JPEGs written here into a temporary folder (:func:`write_test_jpegs`): shapes-world
scenes (:func:`vlp.world.scene.render_scene`) at ``size`` with a smooth colour field and
pixel noise on top, so that they compress like photos (about 50 KB at 500x375, quality 90).

**Three decodes** (:mod:`vlp.preprocess.draft`). ``full``: training's ``data.image.decode=full``.
``draft``: JPEG draft-mode decoding chosen per image (:func:`~vlp.preprocess.draft.open_image_draft`, the
rule in :func:`~vlp.preprocess.draft.draft_scale`): libjpeg decodes at 1/2, 1/4 or 1/8 scale when *every*
crop the transform can take is still at least the output resolution; the bench's alone.
``draft-crop``: chosen per crop, training's ``data.image.decode=draft``
(:func:`~vlp.preprocess.draft.open_crop_draft`): the crop's box is drawn from the file's size first (the
same random draws as the transform), and the JPEG decoded at the largest reduced scale at which
*that* crop is still at least the output resolution. Neither changes what the network sees beyond
the decoder's own downscaling (no crop is ever upsampled where the full decode would have
downsampled it). The top-level figures are those of the decode the config trains with
(``data.image.decode``: ``full``, ``draft-crop`` or ``device``); ``by_decode`` has each.

**Decoding on the device** (:mod:`vlp.preprocess.device_decode`, ``data.image.decode=device``): the
worker's share is timed as the others (read the bytes, the header, the transform's draws; uint8
whatever ``data.image.uint8`` says), and the device's share apart (:func:`time_device_decode`): the
same items collated into batches of ``data.batch_size`` and decoded and augmented on the available
device (CUDA when there is one, else this process's CPU threads): ``device_decode`` in the result.

Timing: each item is timed inside its worker (``time.perf_counter``, CLOCK_MONOTONIC on Linux, one
clock for all processes) from the dataset's ``__getitem__`` entry to the image tensor
``[3, res, res]``; the worker stacks batches of ``batch`` (``[B, 3, res, res]``, as a training
collator does) and ships them to the main process. ``images_per_s`` is the timed items over the span
from the first timed item's start to the last one's end (so it includes the worker's idle time
while it waits on the main process), after ``warmup`` untimed items per worker. Each decode runs
``rounds`` times, the decodes alternating (a busy machine slows each alike), with fresh workers each
time; the median round is reported. A draft decode that would reduce no image (scale 1 throughout)
is the full decode and is not timed again (``not_timed``).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from vlp.config import PretrainConfig
from vlp.data.datasets import ImageTextDataset, SeededIndex, seed_of
from vlp.data.formats import Sample
from vlp.errors import ConfigError
from vlp.preprocess.device_decode import DeviceBatch, collate_images, decode_images
from vlp.preprocess.draft import crop_draft_scale, draft_scale, open_image_draft
from vlp.preprocess.images import open_image
from vlp.preprocess.transforms import train_transform
from vlp.version import __version__
from vlp.world.scene import render_scene, sample_scene, world_rng

#: file suffixes ``--images`` folders are searched for (case-insensitive)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
#: images generated when the user names none
DEFAULT_N = 200
#: the decodes the bench times: ``data.image.decode=full``, JPEG draft mode chosen per image
#: (:func:`~vlp.preprocess.draft.draft_scale`), chosen per crop (``data.image.decode=draft``), and the
#: worker's share of ``data.image.decode=device``
DECODES = ("full", "draft", "draft-crop", "device")
#: the bench's decode of each ``data.image.decode``
TRAINING_DECODE = {"full": "full", "draft": "draft-crop", "device": "device"}


# ----------------------------------------------------------------------------- draft decoding


class DraftImageTextDataset(ImageTextDataset):
    """:class:`~vlp.data.datasets.ImageTextDataset` whose images open with
    :func:`~vlp.preprocess.draft.open_image_draft` (one draft scale per image) for a transform that crops
    to ``res`` with ``crop_scale`` (the only change: :meth:`image`). Timed by the bench only;
    training's ``data.image.decode=draft`` is the per-crop decode."""

    def __init__(self, *args: Any, res: int, crop_scale: Optional[Sequence[float]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.res, self.crop_scale = res, crop_scale

    def image(self, path: str, origin: str) -> Image.Image:
        return open_image_draft(path, origin, self.res, self.crop_scale, self.max_pixels, self.min_side)


# ----------------------------------------------------------------------------- test images


def parse_size(text: str) -> tuple[int, int]:
    """``"1280x960"`` -> (1280, 960); a :class:`ConfigError` otherwise."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"vlp bench: --source-size must be WIDTHxHEIGHT, e.g. 500x375, got {text!r}") from None
    if w < 16 or h < 16:
        raise ConfigError(f"vlp bench: --source-size must be at least 16x16, got {text!r}")
    return w, h


def find_images(paths: Sequence[str | Path]) -> list[Path]:
    """The image files of ``paths``: a file as it is, a folder's .jpg/.jpeg/.png files (recursively,
    sorted). A path that does not exist, or a folder without images, is a :class:`ConfigError`."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise ConfigError(f"vlp bench --images: no {'/'.join(IMAGE_SUFFIXES)} files in folder {p}")
            found += files
        else:
            hint = "; a config override? give overrides before --images" if "=" in p.name else ""
            raise ConfigError(
                f"vlp bench --images: {p} does not exist (expected an image file or a folder of images{hint})"
            )
    if not found:
        raise ConfigError("vlp bench --images: no image given")
    return found


def photo_like(im: Image.Image, seed: int, noise: float = 6.0, field: float = 25.0) -> Image.Image:
    """``im`` with a smooth random colour field (std ``field``, 1/16 resolution, bicubic) and
    per-pixel Gaussian noise (std ``noise``) added: texture that JPEG cannot compress away, so the
    file is photo-sized (about 50 KB at 500x375, quality 90, against 5 KB for the flat drawing)."""
    w, h = im.size
    g = np.random.default_rng(seed)
    low = g.normal(128.0, field, (h // 16 + 2, w // 16 + 2, 3))
    smooth = Image.fromarray(np.clip(low, 0, 255).astype(np.uint8)).resize((w, h), Image.Resampling.BICUBIC)
    a = np.asarray(im, np.float32) + np.asarray(smooth, np.float32) - 128.0 + g.normal(0.0, noise, (h, w, 3))
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def write_test_jpegs(folder: Path, n: int, size: tuple[int, int] = (500, 375), quality: int = 90, seed: int = 0):
    """Write ``n`` JPEGs ``bench_00000.jpg`` ... of ``size`` (width, height) at ``quality`` into
    ``folder``: shapes-world scenes rendered at the longer side, resized to ``size``, made
    :func:`photo_like`. Deterministic in ``seed``. Returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    w, h = size
    paths = []
    for i in range(n):
        rng = world_rng(seed, "loader-bench", i, "scene")
        im = render_scene(sample_scene(rng), max(w, h), rng).resize((w, h), Image.Resampling.BILINEAR)
        path = folder / f"bench_{i:05d}.jpg"
        photo_like(im, seed_of("loader-bench", seed, i)).save(path, "JPEG", quality=quality)
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------- timing


class _Timed(Dataset):
    """Item ``k`` of ``keys`` from ``dataset``, timed: (image [3, res, res], start, end in seconds of
    ``time.perf_counter``, the process's CPU seconds spent on it, the per-crop draft scale of a
    ``data.image.decode=draft`` dataset, else None)."""

    def __init__(self, dataset: Dataset, keys: Sequence[SeededIndex]) -> None:
        self.dataset, self.keys = dataset, list(keys)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, float, float, float, Optional[int]]:
        t0, c0 = time.perf_counter(), time.process_time()
        image = self.dataset[self.keys[k]]["image"]
        cpu, t1 = time.process_time() - c0, time.perf_counter()
        return image, t0, t1, cpu, getattr(getattr(self.dataset, "decoder", None), "last_scale", None)


def _header(s: Sample) -> tuple[int, int, Optional[str]]:
    """(width, height, format) of a sample's image file; a file Pillow cannot open raises
    ``open_image``'s :class:`~vlp.errors.BadImage`, naming it."""
    try:
        with Image.open(s.image) as im:
            return im.width, im.height, im.format
    except Exception:
        open_image(s.image, s.origin, 0, 1)  # raises with the reason
        raise


def _collate(items: list) -> tuple[Any, list[tuple[float, float, float, Optional[int]]]]:
    """A batch of :class:`_Timed` items: images stacked ``[B, 3, res, res]`` (or gathered for the
    device: :func:`~vlp.preprocess.device_decode.collate_images`; in the worker, as a training collator
    does), and each item's (start, end, CPU seconds, scale)."""
    return collate_images([it[0] for it in items]), [it[1:] for it in items]


def time_loader(dataset: Dataset, n: int, workers: int, warmup: int, seed: int = 0, batch: int = 8) -> dict[str, Any]:
    """Load at least ``warmup`` untimed items per worker process (whole batches), then items
    ``0..n-1`` of ``dataset`` (indices cycled, seeded as training's epoch 0), through a DataLoader
    of batches of ``batch`` with ``workers`` processes (0: in this process). Returns
    ``images_per_s`` (over the span of the timed items), ``ms`` / ``cpu_ms`` (each timed item's
    wall-clock / CPU milliseconds),
    ``scales`` (the per-crop draft scales the dataset reported, if any) and the images'
    ``output_shape`` / ``output_dtype`` (``[3, res, res]``, float32 or uint8)."""
    n_warm = math.ceil(warmup / batch) * batch * max(workers, 1)
    size = len(dataset)  # type: ignore[arg-type]
    keys = [SeededIndex(k % size, seed_of("item", seed, 0, k % size)) for k in range(n_warm + n)]
    loader = DataLoader(_Timed(dataset, keys), batch_size=batch, num_workers=workers, collate_fn=_collate)
    scales: Counter[int] = Counter()
    spans, cpu, k = [], [], 0
    last: Any = None
    for images, timings in loader:
        for t0, t1, c, scale in timings:
            if k >= n_warm:
                spans.append((t0, t1))
                cpu.append(c)
                if scale is not None:
                    scales[scale] += 1
            k += 1
        last = images
    wall = max(t1 for _, t1 in spans) - min(t0 for t0, _ in spans)
    shape, dtype = (None, None) if isinstance(last, DeviceBatch) else (list(last.shape[1:]), last.dtype)
    return {
        "images_per_s": n / wall,
        "ms": [1000 * (t1 - t0) for t0, t1 in spans],
        "cpu_ms": [1000 * c for c in cpu],
        "scales": scales,
        "output_shape": shape,  # None: the device makes the images
        "output_dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    """``cuda:0 (NVIDIA H100 ...)``, or the CPU's name with this process's torch threads."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({cpu_name()}; {torch.get_num_threads()} torch threads)"


def time_device_decode(
    dataset: Dataset, n: int, batch: int, device: torch.device, rounds: int = 3, seed: int = 0
) -> dict[str, Any]:
    """The device's share of ``data.image.decode=device``: items ``0..n-1`` of ``dataset`` (a
    ``decode="device"`` training dataset; seeded as training's epoch 0) loaded here once, collated
    into batches of ``batch``, then decoded and augmented on ``device``
    (:func:`~vlp.preprocess.device_decode.decode_images`, the batch's copy to it included) ``rounds``
    times after one untimed batch. Returns ``images_per_s`` (the median round), ``ms_per_batch``
    (median over batches, each synchronised), the output's shape and dtype (``[3, res, res]``,
    uint8), the share of images shipped as JPEG bytes, and on a device other than the CPU the mean
    absolute difference from the CPU decode of the first batch (of 255)."""
    size = len(dataset)  # type: ignore[arg-type]
    items = [dataset[SeededIndex(k % size, seed_of("item", seed, 0, k % size))]["image"] for k in range(n)]
    batches = [collate_images(items[i : i + batch]) for i in range(0, n, batch)]
    first = decode_images(batches[0].to(device), device)  # warm-up: CUDA context, nvJPEG, kernels
    _sync(device)
    rates, ms = [], []
    for _ in range(rounds):
        t_round = time.perf_counter()
        for b in batches:
            t0 = time.perf_counter()
            decode_images(b.to(device, non_blocking=True), device)
            _sync(device)
            ms.append(1000 * (time.perf_counter() - t0))
        rates.append(n / (time.perf_counter() - t_round))
    diff = None
    if device.type != "cpu":
        diff = (decode_images(batches[0], "cpu").float() - first.cpu().float()).abs().mean().item()
    return {
        "device": device_name(device),
        "images_per_s": statistics.median(rates),
        "ms_per_batch": statistics.median(ms),
        "batch": batch,
        "images_per_s_rounds": rates,
        "jpeg_share": sum(d.dim() == 1 for b in batches for d in b.data) / n,
        "mean_abs_diff_vs_cpu": diff,
        "output_shape": list(first.shape[1:]),
        "output_dtype": str(first.dtype).replace("torch.", ""),
    }


def summarize(rounds: Sequence[dict[str, Any]], workers: int) -> dict[str, Any]:
    """One decode's figures over its rounds (:func:`time_loader` results): the median round's
    images/s (total and per worker process, 0 workers counting as one), the median and mean ms per
    image over every timed item, the median CPU ms per image (``cpu_ms_per_image``; its inverse,
    ``images_per_cpu_s``, is what one worker would deliver on a core of its own) and each round's
    images/s."""
    rate = statistics.median(r["images_per_s"] for r in rounds)
    ms = [m for r in rounds for m in r["ms"]]
    cpu_ms = statistics.median(m for r in rounds for m in r["cpu_ms"])
    scales: Counter[int] = sum((r["scales"] for r in rounds), Counter())
    return {
        "images_per_s": rate,
        "images_per_s_per_worker": rate / max(workers, 1),
        "ms_per_image": statistics.median(ms),
        "ms_per_image_mean": statistics.mean(ms),
        "cpu_ms_per_image": cpu_ms,
        "images_per_cpu_s": 1000 / cpu_ms,
        "images_per_s_rounds": [r["images_per_s"] for r in rounds],
        **({"crop_draft_scales": {str(k): v for k, v in sorted(scales.items())}} if scales else {}),
        "output_shape": rounds[-1]["output_shape"],
        "output_dtype": rounds[-1]["output_dtype"],
    }


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``) and the cores this process may use."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}, {cores} cores"


def run_loader_bench(
    cfg: PretrainConfig,
    images: Optional[Sequence[str | Path]] = None,
    n: Optional[int] = None,
    workers: int = 1,
    size: tuple[int, int] = (500, 375),
    quality: int = 90,
    out: Optional[str | Path] = None,
    warmup: int = 5,
    decodes: Sequence[str] = DECODES,
    rounds: int = 3,
    batch: int = 8,
    device: Optional[str | torch.device] = None,
) -> dict[str, Any]:
    """Time the training image pipeline of ``cfg`` (module doc) and return (and write to ``out``
    as JSON) the result. ``images``: files / folders to read (``n``: the first ``n`` of them, default
    all); None: ``n`` (default :data:`DEFAULT_N`) generated JPEGs of ``size`` at ``quality``.
    ``data.train`` is not read. The top-level rates are those of the decode training uses with
    ``cfg`` (``data.image.decode``: ``full``, ``draft-crop`` or ``device``; the first of ``decodes``
    when that one is not timed); ``by_decode`` holds each decode's, ``speedup`` against the first.
    With ``device`` among ``decodes``, ``device_decode`` holds the device's share
    (:func:`time_device_decode`, batches of ``data.batch_size`` on ``device``: default CUDA when
    there is one, else the CPU)."""
    from vlp.checkpoint import image_size

    _check_loader_args(workers, warmup, rounds, batch, n, decodes)
    res, icfg = image_size(cfg), cfg.data.image
    with tempfile.TemporaryDirectory(prefix="vlp-loader-bench-") as tmp:
        paths = _bench_images(Path(tmp), images, n, size, quality, cfg.train.seed)
        samples = [Sample(str(p), ("a photo",), str(p), f"loader bench image {i}") for i, p in enumerate(paths)]
        scales, sizes, crop_max = _header_scales(samples, res, icfg.crop_scale)
        datasets = _decode_datasets(samples, res, cfg)
        same = {"draft": set(scales) == {1}, "draft-crop": crop_max == 1}  # decodes exactly as "full" does
        not_timed = {k: "no image is reduced: the full decode" for k in decodes[1:] if same.get(k)}
        decodes = [k for k in decodes if k not in not_timed]
        by_decode = _time_decodes(datasets, decodes, len(paths), workers, warmup, rounds, cfg.train.seed, batch)
        on_device = _device_share(by_decode, datasets["device"], len(paths), cfg, rounds, device)
        mean_kb = statistics.mean(p.stat().st_size for p in paths) / 1024
    source_sizes = Counter(f"{w}x{h}" for w, h in sizes)
    top = _training_top(by_decode, decodes, icfg.decode)
    main = by_decode[top]
    result: dict[str, Any] = {
        "date": date.today().isoformat(),
        "device": cpu_name(),
        "workers": workers,
        "images_per_s": main["images_per_s"],
        "images_per_s_per_worker": main["images_per_s_per_worker"],
        "ms_per_image": main["ms_per_image"],
        "decode": top,
        "data_image_decode": icfg.decode,
        "by_decode": by_decode,
        "not_timed": not_timed,
        "device_decode": on_device,
        **_pipeline_fields(cfg, res, scales, main),
        "images": "given" if images is not None else "generated",
        "n_images": len(paths),
        "warmup_per_worker": warmup,
        "rounds": rounds,
        "batch": batch,
        "source_size": source_sizes.most_common(1)[0][0] if len(source_sizes) == 1 else "mixed",
        "source_sizes": dict(source_sizes.most_common(5)),
        "jpeg_quality": quality if images is None else None,
        "mean_file_kb": mean_kb,
        **_versions(),
    }
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2))
    return result


def _bench_images(
    tmp: Path, images: Optional[Sequence[str | Path]], n: Optional[int], size: tuple[int, int], quality: int, seed: int
) -> list[Path]:
    """The images to time: the first ``n`` (default all) of the files / folders ``images``, or, with
    ``images`` None, ``n`` (default :data:`DEFAULT_N`) JPEGs of ``size`` at ``quality`` written
    into ``tmp``. Returns their paths."""
    if images is None:
        return write_test_jpegs(tmp, n or DEFAULT_N, size, quality, seed)
    return find_images(images)[:n]


def _device_share(
    by_decode: dict[str, dict[str, Any]],
    dataset: Callable[[], Dataset],
    n: int,
    cfg: PretrainConfig,
    rounds: int,
    device: Optional[str | torch.device],
) -> Optional[dict[str, Any]]:
    """With ``device`` among the timed decodes (``by_decode``), the device's share of decoding
    (:func:`time_device_decode` of the ``n`` items of ``dataset`` in batches of ``data.batch_size`` on
    ``device``: default CUDA when there is one, else the CPU); its output shape and dtype go into
    ``by_decode["device"]``. Returns its figures, or None when ``device`` was not timed."""
    if "device" not in by_decode:
        return None
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    b = min(cfg.data.batch_size, n)
    on_device = time_device_decode(dataset(), n, b, dev, rounds, cfg.train.seed)
    by_decode["device"].update(output_shape=on_device["output_shape"], output_dtype=on_device["output_dtype"])
    return on_device


def _check_loader_args(
    workers: int, warmup: int, rounds: int, batch: int, n: Optional[int], decodes: Sequence[str]
) -> None:
    """Raises ConfigError on a negative ``workers`` or ``warmup``, ``rounds``, ``batch`` or ``n``
    below 1, or ``decodes`` empty or not among :data:`DECODES`; returns None."""
    if workers < 0 or warmup < 0 or rounds < 1 or batch < 1 or (n is not None and n < 1):
        raise ConfigError(
            f"vlp bench --loader-only: --workers and warmup must be >= 0, --n-images, rounds and batch >= 1, "
            f"got {workers} / {warmup} / {n} / {rounds} / {batch}"
        )
    unknown = [d for d in decodes if d not in DECODES]
    if unknown or not decodes:
        raise ConfigError(f"vlp bench --loader-only: decodes must be among {list(DECODES)}, got {list(decodes)}")


def _header_scales(
    samples: Sequence[Sample], res: int, crop_scale: Optional[Sequence[float]]
) -> tuple[Counter[int], list[tuple[int, int]], int]:
    """From each image's header: the count of images per draft scale of the per-image draft decode
    (1 for a file that is not a JPEG), the (width, height) of each, and the largest per-crop draft
    scale of a full-image crop (1 without a JPEG). Returns (scales, sizes, crop_max)."""
    scales: Counter[int] = Counter()
    sizes, crop_max = [], 1
    for s in samples:
        w, h, fmt = _header(s)
        sizes.append((w, h))
        scales[draft_scale(w, h, res, crop_scale) if fmt == "JPEG" else 1] += 1
        crop_max = max(crop_max, crop_draft_scale(w, h, (res, res)) if fmt == "JPEG" else 1)
    return scales, sizes, crop_max


def _decode_datasets(samples: list[Sample], res: int, cfg: PretrainConfig) -> dict[str, Callable[[], Dataset]]:
    """Per decode of :data:`DECODES`, a function making a fresh training dataset of ``samples`` with
    the training transform at ``res`` (uint8 for ``device``) and ``cfg.data``'s image limits (an image
    outside them raises). Returns decode -> dataset maker."""
    icfg, d = cfg.data.image, cfg.data
    transform: Callable = train_transform(res, icfg)
    uint8 = train_transform(res, replace(icfg, uint8=True))  # what decode=device needs
    common: dict[str, Any] = {"max_pixels": d.max_image_pixels, "min_side": d.min_image_side}  # errors raise
    return {
        "full": lambda: ImageTextDataset(samples, transform, decode="full", **common),
        "draft": lambda: DraftImageTextDataset(samples, transform, res=res, crop_scale=icfg.crop_scale, **common),
        "draft-crop": lambda: ImageTextDataset(samples, transform, decode="draft", **common),
        "device": lambda: ImageTextDataset(samples, uint8, decode="device", **common),
    }


def _time_decodes(
    datasets: dict[str, Callable[[], Dataset]],
    decodes: Sequence[str],
    n: int,
    workers: int,
    warmup: int,
    rounds: int,
    seed: int,
    batch: int,
) -> dict[str, dict[str, Any]]:
    """Times the loader of each of ``decodes`` (:func:`time_loader` over ``n`` items) ``rounds`` times,
    the decodes alternating so that a busy machine slows each alike. Returns decode -> its
    :func:`summarize` figures, in the order of ``decodes``."""
    timed: dict[str, list] = {name: [] for name in decodes}
    for _ in range(rounds):
        for name in decodes:
            timed[name].append(time_loader(datasets[name](), n, workers, warmup, seed, batch))
    return {name: summarize(v, workers) for name, v in timed.items()}


def _training_top(by_decode: dict[str, dict[str, Any]], decodes: Sequence[str], decode: str) -> str:
    """Adds each decode's ``speedup`` over the first of ``decodes`` to ``by_decode``. Returns the decode
    that training with ``data.image.decode=decode`` uses, or the first of ``decodes`` when that one
    was not timed."""
    first, top = by_decode[decodes[0]], TRAINING_DECODE[decode]
    top = top if top in by_decode else decodes[0]
    for v in by_decode.values():
        v["speedup"] = v["images_per_s"] / first["images_per_s"]
    return top


def _pipeline_fields(cfg: PretrainConfig, res: int, scales: Counter[int], main: dict[str, Any]) -> dict[str, Any]:
    """The image pipeline's part of the record: the most common and every per-image draft scale
    (``scales``), the resolution ``res``, the output of the training decode (``main``) and the
    ``data.image`` settings. Returns the dict."""
    icfg = cfg.data.image
    return {
        "draft_scale": scales.most_common(1)[0][0],
        "draft_scales": {str(k): v for k, v in sorted(scales.items())},
        "image_size": res,
        "output_shape": main["output_shape"],
        "output_dtype": main["output_dtype"],
        "uint8": icfg.uint8,
        "crop_scale": icfg.crop_scale,
        "hflip": icfg.hflip,
        "randaugment": icfg.randaugment,
    }


def _versions() -> dict[str, Any]:
    """The software the timing ran on: torch (and its threads), Pillow (with libjpeg-turbo or not), vlp."""
    return {
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "pillow": Image.__version__,
        "libjpeg_turbo": _libjpeg_turbo(),
        "vlp_version": __version__,
    }


def _libjpeg_turbo() -> Optional[bool]:
    try:
        from PIL import features

        return bool(features.check_feature("libjpeg_turbo"))
    except Exception:  # an old Pillow without the feature check
        return None


#: width of the decode column of :func:`format_loader_bench`
W = 48


def format_loader_bench(r: dict[str, Any]) -> str:
    """The short table ``vlp bench --loader-only`` prints."""
    lines = [
        f"loader bench on {r['device']}: {r['n_images']} {r['images']} images, {r['source_size']}, "
        f"{r['mean_file_kb']:.0f} KB on average -> {r['image_size']} px "
        f"({'uint8' if r['uint8'] else 'float'} output, crop_scale {r['crop_scale']}, "
        f"hflip {r['hflip']}, randaugment {r['randaugment']}), {r['workers']} worker(s)",
        f"{'decode':<{W}}{'images/s':>10}{'per worker':>12}{'ms/image':>10}{'CPU ms/image':>14}",
    ]
    labels = {
        "full": "full (data.image.decode=full)",
        "draft": f"draft, per image (1/{r['draft_scale']})",
        "draft-crop": "per crop (data.image.decode=draft)",
        "device": "device, loader's share (bytes, header, draws)",
    }
    for name, v in r["by_decode"].items():
        label = labels[name] + (f" {_scales(v['crop_draft_scales'])}" if "crop_draft_scales" in v else "")
        lines.append(
            f"{label:<{W}}{v['images_per_s']:>10.1f}{v['images_per_s_per_worker']:>12.1f}{v['ms_per_image']:>10.2f}"
            f"{v['cpu_ms_per_image']:>14.2f}"
        )
    lines += [f"{labels[k]:<{W}}not timed: {why}" for k, why in r["not_timed"].items()]
    dd = r.get("device_decode")
    if dd:
        lines.append(
            f"device's share of data.image.decode=device on {dd['device']}: {dd['images_per_s']:.1f} images/s "
            f"decoded and augmented ({dd['ms_per_batch']:.1f} ms per batch of {dd['batch']}, "
            f"{100 * dd['jpeg_share']:.0f}% shipped as JPEG bytes)"
        )
    lines.append(f"this config trains with data.image.decode={r['data_image_decode']}: {labels[r['decode']]}")
    return "\n".join(lines)


def _scales(counts: dict[str, int]) -> str:
    """``{"1": 30, "2": 170}`` -> ``(1/2: 85%)``: the share of crops decoded at each reduced scale."""
    total = sum(counts.values())
    reduced = [f"1/{k}: {100 * v / total:.0f}%" for k, v in counts.items() if k != "1"]
    return f"({', '.join(reduced)})" if reduced else "(none reduced)"
