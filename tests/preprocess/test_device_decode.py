"""``data.image.decode=device`` (:mod:`vlp.preprocess.device_decode`): the loader ships a JPEG's bytes and
``full``'s random draws; the task decodes and augments on the device (here the CPU, through the same
``decode_jpeg`` call). The draws are ``full``'s exactly, the pixels close to its; other files decode
on the host as ``full``; bad files give ``full``'s errors; pretraining runs with it, from JSON files
and from shards; fine-tuning refuses it."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
import torchvision.transforms.functional as TF1
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms.v2 import functional as F2

from tests.helpers import JPEG_RUN, SHAPES_TINY, pretrain
from vlp.config import FinetuneConfig, ImageConfig, PretrainConfig, load_config
from vlp.data.datasets import Collator, ImageTextDataset, SeededIndex, draw_other, seed_of, seeded_rng
from vlp.data.formats import Sample
from vlp.errors import ConfigError, DataError
from vlp.preprocess import device_decode
from vlp.preprocess.device_decode import (
    DeviceBatch,
    DeviceImage,
    collate_images,
    decode_images,
    decode_jpegs,
    plain_jpeg,
)
from vlp.preprocess.images import open_image
from vlp.preprocess.transforms import RANDAUG_OPS, AlbefRandAugment, apply_randaugment, load_tokenizer, train_transform
from vlp.runs.bench.loader import write_test_jpegs
from vlp.tasks.base import Task

RES = 128


def dataset(path: str, decode: str, on_bad: str | None = None, **image) -> ImageTextDataset:
    """One entry, ``path``, under the ALBEF training transform at RES px with uint8 output."""
    cfg = ImageConfig(**{"crop_scale": [0.2, 1.0], "hflip": True, "randaugment": True, "uint8": True, **image})
    return ImageTextDataset([Sample(path, ("a photo",), path, "entry 0")], train_transform(RES, cfg), decode=decode)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """A photo-like 500x375 JPEG, the same progressive, and files that must take the host route: as
    PNG, as a grayscale and a CMYK JPEG, a tiny JPEG (upscaled first) and a JPEG without EOI at its
    end (trailing bytes)."""
    folder = tmp_path_factory.mktemp("files")
    jpeg = write_test_jpegs(folder, 1, (500, 375))[0]
    im = Image.open(jpeg)
    out = {"jpeg": str(jpeg), "tiny": str(write_test_jpegs(folder / "t", 1, (12, 9))[0])}
    for name, mode, fmt in [("png", "RGB", "PNG"), ("gray", "L", "JPEG"), ("cmyk", "CMYK", "JPEG")]:
        im.convert(mode).save(folder / f"{name}.img", fmt)
        out[name] = str(folder / f"{name}.img")
    im.save(folder / "progressive.jpg", "JPEG", quality=90, progressive=True)
    out["progressive"] = str(folder / "progressive.jpg")
    (folder / "trailing.jpg").write_bytes(jpeg.read_bytes() + b"trailing bytes")
    out["trailing"] = str(folder / "trailing.jpg")
    return out


def draws_of_full(ds: ImageTextDataset, seed: int, monkeypatch) -> tuple:
    """(crop box, flipped, RandAugment ops, the next torch and Python random numbers) of ``full``."""
    seen: dict = {}
    get_params, draw, hflip = T.RandomResizedCrop.get_params, AlbefRandAugment.draw, TF1.hflip
    monkeypatch.setattr(
        T.RandomResizedCrop, "get_params", staticmethod(lambda *a: seen.setdefault("box", get_params(*a)))
    )
    monkeypatch.setattr(AlbefRandAugment, "draw", lambda self, *a: seen.setdefault("ops", draw(self, *a)))
    monkeypatch.setattr(TF1, "hflip", lambda im: seen.setdefault("flip", hflip(im)))
    with seeded_rng(seed):
        ds.load(0)
        after = (torch.rand(1).item(), random.random())
    monkeypatch.undo()
    return tuple(seen["box"]), "flip" in seen, tuple(seen.get("ops", ())), after


def draws_of_device(ds: ImageTextDataset, seed: int) -> tuple:
    with seeded_rng(seed):
        im = ds.load(0)["image"]
        after = (torch.rand(1).item(), random.random())
    assert isinstance(im, DeviceImage)
    return im.box, im.flip, im.ops, after


@pytest.mark.parametrize("kind", ["jpeg", "png", "tiny", "gray"])
def test_device_draws_the_full_decodes_boxes_flips_and_ops_exactly(files, kind, monkeypatch):
    full, device = dataset(files[kind], "full"), dataset(files[kind], "device")
    seeds = range(24)
    got = [draws_of_device(device, s) for s in seeds]
    want = [draws_of_full(full, s, monkeypatch) for s in seeds]
    assert got == want  # the same box, flip, ops and arguments, and the streams left alike
    assert {f for _, f, _, _ in got} == {True, False} and {op for *_, ops, _ in got for op, _ in ops} >= {0, 3, 7}


def decode_pair(path: str, seeds, **image) -> tuple[torch.Tensor, torch.Tensor, DeviceBatch]:
    """``full``'s images and ``device``'s (decoded here on the CPU) for ``seeds``: [S, 3, RES, RES] each."""
    full, device = dataset(path, "full", **image), dataset(path, "device", **image)
    keys = [SeededIndex(0, seed_of("t", s)) for s in seeds]
    batch = collate_images([device[k]["image"] for k in keys])
    return torch.stack([full[k]["image"] for k in keys]), decode_images(batch, "cpu"), batch


def mean_abs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean |a - b| per image, in 1/255 steps."""
    return (a.float() - b.float()).abs().flatten(1).mean(1)


@pytest.mark.parametrize("kind", ["jpeg", "progressive"])
def test_jpegs_decoded_on_the_device_are_close_to_full_without_randaugment(files, kind):
    """Not bit-equal: the decoders agree (libjpeg-turbo both, bit for bit), but the crop is resized by
    torch's antialiased bicubic kernel, not Pillow's: 0.006 of 255 at most measured here (crops
    resized down; a crop resized up differs more, about 0.2 of 255)."""
    full, dev, batch = decode_pair(files[kind], range(12), randaugment=False)
    assert all(d.dim() == 1 for d in batch.data)  # shipped as bytes
    (decoded,) = decode_jpegs(batch.data[:1], batch.names[:1], torch.device("cpu"))
    assert torch.equal(decoded, TF1.pil_to_tensor(open_image(files[kind], "x")))  # Pillow's pixels exactly
    assert dev.shape == full.shape == (12, 3, RES, RES) and dev.dtype == torch.uint8
    assert mean_abs(full, dev).max() < 0.05 and not torch.equal(full, dev)


def test_with_randaugment_the_images_stay_close(files):
    full, dev, batch = decode_pair(files["jpeg"], range(16))
    assert (batch.ops >= 0).any()  # some ops were drawn
    assert mean_abs(full, dev).max() < 1.0  # rotate's edge, and equalize spreading the resize's rounding: 0.57 measured


@pytest.mark.parametrize("name", RANDAUG_OPS)
@pytest.mark.parametrize("sign", [-1.0, 1.0])
def test_each_randaugment_op_on_tensors_is_close_to_the_pil_op(files, name, sign, monkeypatch):
    """The op on a PIL image (``full``) and on a uint8 tensor (``device``), at ALBEF's magnitude.
    Measured: identical except autocontrast (at most a 1 in one pixel) and rotate (about 0.7 of 255:
    the bilinear edge against the grey fill)."""
    im = open_image(files["jpeg"], "x").resize((RES, RES))
    monkeypatch.setattr(random, "choice", lambda _: sign)  # the magnitude's sign
    op = [(RANDAUG_OPS.index(name), AlbefRandAugment()._argument(name, RES, RES))]
    pil = TF1.pil_to_tensor(apply_randaugment(im, op))
    tensor = apply_randaugment(TF1.pil_to_tensor(im), op, F2)
    assert tensor.dtype == torch.uint8 and not (name != "identity" and torch.equal(pil, TF1.pil_to_tensor(im)))
    assert mean_abs(pil[None], tensor[None]).item() < (1.0 if name == "rotate" else 0.05)


@pytest.mark.parametrize("kind", ["png", "gray", "cmyk", "tiny", "trailing"])
def test_other_files_are_decoded_on_the_host_and_match_full(files, kind):
    full, dev, batch = decode_pair(files[kind], range(6), randaugment=False)
    assert all(d.dim() == 3 and d.dtype == torch.uint8 for d in batch.data)  # decoded, un-augmented
    assert batch.data[0].shape[1:] == torch.Size(open_image(files[kind], "x").size[::-1])
    assert mean_abs(full, dev).max() < 0.05  # as the JPEG route: only the resampling differs (0.009 measured)


def test_plain_jpeg_reads_the_headers(files, tmp_path):
    data = Path(files["jpeg"]).read_bytes()
    assert plain_jpeg(data)
    assert not plain_jpeg(data[: len(data) // 2])  # truncated: no EOI
    assert not plain_jpeg(Path(files["png"]).read_bytes()) and not plain_jpeg(b"not an image")
    assert not plain_jpeg(Path(files["gray"]).read_bytes()) and not plain_jpeg(Path(files["cmyk"]).read_bytes())
    assert not plain_jpeg(no_quantisation_tables(data))


def no_quantisation_tables(data: bytes) -> bytes:
    """``data`` without its DQT segments: Pillow opens it (the header is fine), no decoder can decode it."""
    while (i := data.find(b"\xff\xdb")) >= 0:
        data = data[:i] + data[i + 2 + int.from_bytes(data[i + 2 : i + 4], "big") :]
    return data


BAD_FILES = {
    "truncated": lambda jpeg, big: jpeg[: len(jpeg) // 2],
    "no_tables": lambda jpeg, big: no_quantisation_tables(jpeg),
    "text": lambda jpeg, big: b"not an image, just text\n",
    "too_many_pixels": lambda jpeg, big: big,  # 800x600 over a limit of 200,000 pixels
    "missing": None,
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_bad_files_give_the_full_decodes_errors_and_skips(files, tmp_path, kind):
    """Checked in the worker (the headers, EOI, the pixel limit), so ``raise`` gives ``full``'s
    error, message for message, and ``skip`` replaces the sample with the one ``full`` takes."""
    bad, write = tmp_path / "bad.jpg", BAD_FILES[kind]
    if write is not None:
        big = write_test_jpegs(tmp_path / "big", 1, (800, 600))[0].read_bytes() if kind == "too_many_pixels" else b""
        bad.write_bytes(write(Path(files["jpeg"]).read_bytes(), big))
    samples = [Sample(str(bad), ("bad",), "bad", "entry 0")]
    samples += [Sample(files["jpeg"], ("good",), f"good {i}", f"entry {i}") for i in (1, 2, 3)]
    tf = train_transform(RES, ImageConfig(uint8=True))
    got = {}
    for decode in ("full", "device"):
        with pytest.raises(DataError) as e:
            ImageTextDataset(samples, tf, on_bad="raise", decode=decode, max_pixels=200_000)[SeededIndex(0, 9)]
        got[decode] = (
            str(e.value),
            ImageTextDataset(samples, tf, on_bad="skip", decode=decode, max_pixels=200_000)[SeededIndex(0, 9)],
        )
    (error, full), (device_error, dev) = got["full"], got["device"]
    assert device_error == error and error.startswith("entry 0: ") and str(bad) in error
    assert dev["bad_samples"] == full["bad_samples"] == 1
    assert dev["image_id"] == full["image_id"] == draw_other(random.Random(seed_of("replace", 9)), 0, 4)
    assert mean_abs(full["image"][None], decode_images(collate_images([dev["image"]]), "cpu")).item() < 1.0


def test_a_jpeg_the_device_cannot_decode_is_decoded_on_the_host_or_named(files, monkeypatch):
    """Past the worker's checks: a JPEG that ``decode_jpeg`` fails on is decoded by Pillow (as
    ``full`` would); one that Pillow cannot decode either stops the run, naming the file."""
    ds = dataset(files["jpeg"], "device", randaugment=False)
    batch = collate_images([ds[SeededIndex(0, s)]["image"] for s in range(3)])
    want = decode_images(batch, "cpu")
    real = device_decode.decode_jpeg

    def fails_on_the_second(data, **kwargs):
        if isinstance(data, list) and len(data) > 1 or data[0] is batch.data[1]:
            raise RuntimeError("decode_jpeg: cannot decode this one")
        return real(data, **kwargs)

    monkeypatch.setattr(device_decode, "decode_jpeg", fails_on_the_second)
    assert torch.equal(decode_images(batch, "cpu"), want)  # the second decoded by Pillow: the same pixels
    monkeypatch.undo()
    broken = torch.frombuffer(bytearray(no_quantisation_tables(Path(files["jpeg"]).read_bytes())), dtype=torch.uint8)
    batch.data[1] = broken
    with pytest.raises(DataError, match=rf"entry 0: cannot read image {files['jpeg']}: .*decode=device: decode_jpeg"):
        decode_images(batch, "cpu")


def test_the_task_decodes_a_device_batch_on_its_device_before_normalising(files):
    from vlp.preprocess.transforms import PixelNorm

    ds = dataset(files["jpeg"], "device")
    batch = {"images": collate_images([ds[SeededIndex(0, s)]["image"] for s in range(2)])}
    task = Task(torch.nn.Linear(1, 1))
    with pytest.raises(ValueError, match="data.image.uint8=true"):
        task.on_device(batch)
    task.pixel_norm = PixelNorm(ImageConfig())
    images = task.on_device(batch)["images"]
    assert images.shape == (2, 3, RES, RES) and images.dtype == torch.float32
    assert torch.allclose(images, task.pixel_norm(decode_images(batch["images"], "cpu")))
    batch["images"].ops[:], batch["images"].args[:] = RANDAUG_OPS.index("sharpness"), 1.63  # a convolution
    images = task.on_device(batch)["images"]
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a bf16 run's forward: the decode stays in fp32
        assert torch.equal(task.on_device(batch)["images"], images)


# ----------------------------------------------------------------------------- config and training


def test_the_config_needs_uint8_and_fine_tuning_refuses_device():
    assert load_config(PretrainConfig, SHAPES_TINY, ["data.image.decode=device", "data.image.uint8=true"])
    with pytest.raises(ConfigError, match=r"data\.image\.decode.*device.*set data\.image\.uint8=true"):
        load_config(PretrainConfig, SHAPES_TINY, ["data.image.decode=device"])
    with pytest.raises(
        ConfigError, match=r"data\.image\.decode=device \(JPEG decoding on the training device: pretraining only"
    ):
        load_config(FinetuneConfig, "configs/finetune/shapes_retrieval.yaml", ["data.image.decode=device"])


@pytest.fixture(scope="module")
def shards(jpeg_world, tmp_path_factory) -> Path:
    from vlp.data.shard_writer import write_shards

    return write_shards([jpeg_world], tmp_path_factory.mktemp("sh"), size=240, max_per_shard=4, show_progress=False)


@pytest.mark.parametrize("fmt", ["json", "webdataset"])
def test_the_training_loader_ships_jpegs_with_the_full_decodes_draws(jpeg_world, shards, fmt):
    from vlp.runs.training.pretrain import build_train_loader

    tok = load_tokenizer(PretrainConfig().model.text)
    train = jpeg_world if fmt == "json" else shards
    batches = {}
    for decode in ("full", "device"):
        over = [f"data.train=[{train}]", f"data.format={fmt}", f"data.image.decode={decode}", *JPEG_RUN]
        loader, _, _ = build_train_loader(load_config(PretrainConfig, SHAPES_TINY, over), tok, None, None)
        batches[decode] = next(iter(loader))
    full, dev = batches["full"], batches["device"]
    assert torch.equal(full["image_ids"], dev["image_ids"]) and torch.equal(full["input_ids"], dev["input_ids"])
    assert isinstance(dev["images"], DeviceBatch) and all(d.dim() == 1 for d in dev["images"].data)
    images = decode_images(dev["images"], "cpu")
    assert images.shape == full["images"].shape == (4, 3, 64, 64) and images.dtype == torch.uint8
    assert mean_abs(full["images"], images).max() < 0.05


@pytest.mark.parametrize("fmt", ["json", "webdataset"])
def test_pretraining_runs_with_device_decoding(jpeg_world, shards, tmp_path, fmt, capsys):
    """Two steps through ``vlp pretrain``: accelerate's loader (JSON, with a loader worker) or the shard
    stream's, the batch's images decoded by the task."""
    run = tmp_path / "run"
    train = jpeg_world if fmt == "json" else shards
    steps = ["train.steps=2", "train.log_every=1", "train.ckpt_every=0", "train.warmup_steps=0", "train.progress=false"]
    workers = ["data.num_workers=1"] if fmt == "json" else []
    base = [o for o in JPEG_RUN if not (workers and o.startswith("data.num_workers="))]  # a key is given once
    rc = pretrain(run, train, *base, *workers, f"data.format={fmt}", "data.image.decode=device", *steps)
    assert rc == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(math.isfinite(r["loss"]) for r in records)
    assert "decode: device" in (run / "config.yaml").read_text()


def test_the_collator_gathers_device_images(files):
    tok = load_tokenizer(PretrainConfig().model.text)
    ds = dataset(files["png"], "device")
    batch = Collator(tok, 30)([ds[SeededIndex(0, s)] for s in range(3)])
    images = batch["images"]
    assert isinstance(images, DeviceBatch) and len(images) == 3 and images.size == (RES, RES)
    assert images.boxes.shape == (3, 4) and images.flips.shape == (3,) and images.ops.shape == (3, 2)
    assert images.to("cpu").data[0].data_ptr() == images.data[0].data_ptr()  # nothing copied on the CPU
