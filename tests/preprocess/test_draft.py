"""``data.image.decode=draft``: training's per-crop JPEG draft decoding (:mod:`vlp.preprocess.draft`). The crop
box is the full decode's (the same random draws), the pixels close to its, never upsampled where the
full decode is downsampled; other files decode exactly as ``full``; the key is validated; training
runs with it, from JSON files and from shards."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from tests.helpers import JPEG_RUN
from vlp.config import FinetuneConfig, ImageConfig, PretrainConfig, load_config
from vlp.data.datasets import ImageTextDataset, SeededIndex, seed_of, seeded_rng
from vlp.data.formats import Sample
from vlp.errors import BadImage, ConfigError
from vlp.preprocess.draft import (
    crop_draft_scale,
    draft_scale,
    min_crop_side,
    open_crop_draft,
    open_image_draft,
)
from vlp.preprocess.images import open_image
from vlp.preprocess.transforms import load_tokenizer, split_crop, train_transform
from vlp.runs.bench.loader import write_test_jpegs

TINY = "configs/pretrain/shapes_tiny.yaml"  # 64 px
ALBEF_AUG = dict(crop_scale=[0.2, 1.0], hflip=True, randaugment=True)


@pytest.fixture(scope="module")
def big_jpeg(tmp_path_factory) -> str:
    """A 2000x1500 photo-like JPEG: every ALBEF crop at 256 px can be decoded at 1/2 or less."""
    return str(write_test_jpegs(tmp_path_factory.mktemp("big"), 1, (2000, 1500))[0])


def dataset(path: str, decode: str, **image) -> ImageTextDataset:
    tf = train_transform(256, ImageConfig(**{**ALBEF_AUG, "uint8": True, **image}))
    return ImageTextDataset([Sample(path, ("a photo",), path, "entry 0")], tf, decode=decode)


def boxes_and_images(ds: ImageTextDataset, seeds, monkeypatch) -> tuple[list, list, list]:
    """(the crop box RandomResizedCrop drew, the item's image, the draft scale) per seed."""
    drawn: list = []
    get_params = T.RandomResizedCrop.get_params

    def spy(img, scale, ratio):
        drawn.append(get_params(img, scale, ratio))
        return drawn[-1]

    monkeypatch.setattr(T.RandomResizedCrop, "get_params", staticmethod(spy))
    images, scales = [], []
    for s in seeds:
        images.append(ds[SeededIndex(0, seed_of("t", s))]["image"])
        scales.append(getattr(ds.decoder, "last_scale", None))
    monkeypatch.undo()
    return drawn, images, scales


@pytest.mark.parametrize("randaugment", [False, True])
def test_draft_takes_the_full_decodes_crop_from_a_reduced_decode(big_jpeg, monkeypatch, randaugment):
    seeds = range(8)
    full_boxes, full, _ = boxes_and_images(dataset(big_jpeg, "full", randaugment=randaugment), seeds, monkeypatch)
    draft_boxes, draft, scales = boxes_and_images(
        dataset(big_jpeg, "draft", randaugment=randaugment), seeds, monkeypatch
    )
    assert draft_boxes == full_boxes  # the same random draws, from the file's full size
    assert set(scales) <= {2, 4, 8} and len(set(scales)) > 1
    for (_, _, h, w), d in zip(draft_boxes, scales):
        assert h // d >= 256 and w // d >= 256  # the reduced crop is still resized down, never up
        assert d == 8 or h // (2 * d) < 256 or w // (2 * d) < 256  # the largest such scale
    for a, b in zip(full, draft):
        assert a.shape == b.shape == (3, 256, 256) and a.dtype == b.dtype == torch.uint8
        diff = (a.float() - b.float()).abs().mean().item()
        assert diff < (4 if randaugment else 2)  # of 255 (equalize / autocontrast spread the decoder's rounding)


def test_draft_from_a_jpeg_with_float_output_is_close_to_full(big_jpeg):
    full = dataset(big_jpeg, "full", uint8=False, randaugment=False)[SeededIndex(0, 7)]["image"]
    draft = dataset(big_jpeg, "draft", uint8=False, randaugment=False)[SeededIndex(0, 7)]["image"]
    assert full.dtype == draft.dtype == torch.float32
    std = torch.tensor(ImageConfig().std).view(3, 1, 1)
    assert ((full - draft) * std).abs().mean() < 2 / 255  # normalised: back to the [0, 1] scale


def _png(folder: Path) -> str:
    im = Image.open(write_test_jpegs(folder / "p", 1, (800, 600))[0])
    im.save(folder / "big.png")
    return str(folder / "big.png")


@pytest.mark.parametrize(
    "make",
    [
        _png,  # large, but no JPEG: no draft mode
        lambda f: str(write_test_jpegs(f, 1, (500, 375))[0]),  # no 256 px crop can be halved
        lambda f: str(write_test_jpegs(f, 1, (12, 9))[0]),  # tiny: upscaled before the transform
    ],
    ids=["png", "small-jpeg", "tiny-jpeg"],
)
@pytest.mark.parametrize("uint8", [False, True])
def test_files_that_cannot_be_reduced_give_the_full_decodes_tensors(tmp_path, make, uint8):
    path = make(tmp_path)
    full, draft = dataset(path, "full", uint8=uint8), dataset(path, "draft", uint8=uint8)
    for s in range(4):
        key = SeededIndex(0, seed_of("t", s))
        assert torch.equal(full[key]["image"], draft[key]["image"])
    assert draft.decoder.last_scale == 1


def test_resize_without_crop_and_bad_files_behave_as_full(tmp_path, big_jpeg):
    """``crop_scale: null`` (Resize to res x res): the whole image, decoded at 1/4 for 2000x1500 at
    256 px; a file that does not decode raises the full decode's error, message for message."""
    full = dataset(big_jpeg, "full", crop_scale=None, hflip=False, randaugment=False)[0]["image"]
    ds = dataset(big_jpeg, "draft", crop_scale=None, hflip=False, randaugment=False)
    draft = ds[0]["image"]
    assert ds.decoder.last_scale == 4 and (full.float() - draft.float()).abs().mean() < 2
    junk = tmp_path / "junk.jpg"
    junk.write_bytes(Path(big_jpeg).read_bytes()[:5000])  # truncated
    errors = []
    for decode in ("full", "draft"):
        with pytest.raises(Exception) as e:
            dataset(str(junk), decode)[SeededIndex(0, 1)]
        errors.append((type(e.value), str(e.value)))
    assert errors[0] == errors[1] and "truncated" in errors[0][1]
    crop = split_crop(train_transform(256, ImageConfig()))[0]
    torch.manual_seed(5)
    with pytest.raises(BadImage):
        open_crop_draft(str(junk), "x", crop)  # the box was drawn before the decode failed
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(3))  # torch's stream as the full decode leaves it (a shard's next items)


def test_the_config_key_is_validated_and_fine_tuning_refuses_draft():
    assert PretrainConfig().data.image.decode == "full"
    assert load_config(PretrainConfig, TINY, ["data.image.decode=draft"]).data.image.decode == "draft"
    with pytest.raises(ConfigError, match=r"data\.image\.decode.*'fast'.*\['full', 'draft', 'device'\]"):
        load_config(PretrainConfig, TINY, ["data.image.decode=fast"])
    with pytest.raises(ConfigError, match=r"data\.image\.decode=draft.*pretraining only"):
        load_config(FinetuneConfig, "configs/finetune/shapes_retrieval.yaml", ["data.image.decode=draft"])


# ----------------------------------------------------------------------------- the scale rules


@pytest.mark.parametrize(("crop_scale", "scale"), [([0.2, 1.0], 2), ([0.5, 1.0], 4), (None, 4)])
def test_draft_decoding_keeps_every_crop_at_the_output_resolution(big_jpeg, crop_scale, scale):
    """2000x1500 at 256 px: the reduced image is decoded, and every crop RandomResizedCrop takes from
    it (sampled, plus the fallback) has both sides >= 256, while one more halving would break that."""
    assert draft_scale(2000, 1500, 256, crop_scale) == scale
    im = open_image_draft(str(big_jpeg), "test", 256, crop_scale)
    assert im.mode == "RGB" and im.size == (2000 // scale, 1500 // scale)
    assert min_crop_side(*im.size, crop_scale) >= 256
    assert min_crop_side(2000 // (2 * scale), 1500 // (2 * scale), crop_scale) < 256  # the largest scale
    if crop_scale is not None:
        torch.manual_seed(0)
        crops = [T.RandomResizedCrop.get_params(im, crop_scale, (3 / 4, 4 / 3)) for _ in range(3000)]
        assert min(min(h, w) for _, _, h, w in crops) >= 256
        assert min(h * w for _, _, h, w in crops) < 1.05 * crop_scale[0] * im.width * im.height  # s_min reached


def test_the_scale_rule_on_many_sizes():
    rng = random.Random(0)
    for _ in range(500):
        w, h, res = rng.randint(16, 5000), rng.randint(16, 5000), rng.choice([64, 224, 256, 384])
        cs = rng.choice([None, [0.08, 1.0], [0.2, 1.0], [0.5, 1.0]])
        d = draft_scale(w, h, res, cs)
        assert d in (1, 2, 4, 8)
        assert d == 1 or min_crop_side(w // d, h // d, cs) >= res
        assert d == 8 or min_crop_side(w // (2 * d), h // (2 * d), cs) < res
    assert draft_scale(500, 375, 256, [0.2, 1.0]) == 1 and draft_scale(1280, 960, 256, [0.2, 1.0]) == 1
    assert draft_scale(1280, 960, 256, [0.5, 1.0]) == 2
    size = (256, 256)
    assert [crop_draft_scale(*wh, size) for wh in [(1024, 600), (512, 512), (511, 900), (2048, 2048)]] == [2, 2, 1, 8]


def _seeded(seed, fn):
    with seeded_rng(seed):
        return fn()


def test_per_crop_draft_is_the_training_transform_where_it_does_not_reduce(tmp_path):
    """500x375 at 256: no crop can be halved, and the output is the training transform's, pixel for pixel."""
    path = str(write_test_jpegs(tmp_path, 1, (500, 375))[0])
    tf = train_transform(256, ImageConfig(crop_scale=[0.2, 1.0], uint8=True))
    crop, rest = split_crop(tf)
    for seed in range(5):
        want = _seeded(seed, lambda: tf(open_image(path, "x")))
        im, scale = _seeded(seed, lambda: open_crop_draft(path, "x", crop))
        got = _seeded(seed, lambda: rest(open_crop_draft(path, "x", crop)[0]))
        assert scale == 1 and im.size == (256, 256) and torch.equal(got, want)


@pytest.mark.parametrize("crop_scale", [[0.2, 1.0], None])
def test_per_crop_draft_takes_the_same_crop_from_a_reduced_decode(big_jpeg, crop_scale):
    """2000x1500 at 256: the same seeded crop, decoded at 1/2 .. 1/8, is close to the full decode's."""
    tf = train_transform(256, ImageConfig(crop_scale=crop_scale, hflip=False, randaugment=False, uint8=True))
    crop, rest = split_crop(tf)
    scales = set()
    for seed in range(6):
        want = _seeded(seed, lambda: tf(open_image(str(big_jpeg), "x")))
        im, scale = _seeded(seed, lambda: open_crop_draft(str(big_jpeg), "x", crop))
        got = rest(im)
        scales.add(scale)
        assert got.shape == want.shape == (3, 256, 256) and got.dtype == want.dtype == torch.uint8
        assert (
            got.float() - want.float()
        ).abs().mean() < 2  # same box (~0.5 measured); only the decoding scale differs
    assert scales <= {2, 4, 8} and (crop_scale is not None or scales == {4})


def test_draft_open_matches_open_image_where_it_does_not_reduce(tmp_path):
    path = write_test_jpegs(tmp_path, 1, (500, 375))[0]
    full, draft = open_image(str(path), "x"), open_image_draft(str(path), "x", 256, [0.2, 1.0])
    assert np.array_equal(np.asarray(full), np.asarray(draft))
    png = tmp_path / "a.png"
    Image.new("RGB", (2000, 1500), (1, 2, 3)).save(png)
    assert open_image_draft(str(png), "x", 256, None).size == (2000, 1500)  # only JPEGs have a draft mode


def test_draft_open_raises_open_images_errors(tmp_path, big_jpeg):
    for path, kwargs in [(tmp_path / "missing.jpg", {}), (tmp_path, {}), (big_jpeg, {"max_pixels": 1000})]:
        with pytest.raises(BadImage) as want:
            open_image(str(path), "entry 3", **kwargs)
        with pytest.raises(BadImage) as got:
            open_image_draft(str(path), "entry 3", 256, [0.2, 1.0], **kwargs)
        assert str(got.value) == str(want.value)


@pytest.mark.parametrize("uint8", [False, True])
def test_transform_output_is_the_same_with_draft_decoding(big_jpeg, uint8):
    cfg = ImageConfig(crop_scale=[0.5, 1.0], uint8=uint8)
    tf = train_transform(256, cfg)
    full = tf(open_image(str(big_jpeg), "x"))
    draft = tf(open_image_draft(str(big_jpeg), "x", 256, cfg.crop_scale))
    assert full.shape == draft.shape == (3, 256, 256) and full.dtype == draft.dtype
    assert draft.dtype == (torch.uint8 if uint8 else torch.float32)


# ----------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(PretrainConfig().model.text)


@pytest.mark.parametrize("fmt", ["json", "webdataset"])
def test_the_training_loader_decodes_draft_with_the_full_decodes_crops(jpeg_world, tmp_path, tok, fmt):
    from vlp.data.shard_writer import write_shards
    from vlp.runs.training.pretrain import build_train_loader

    train = jpeg_world
    if fmt == "webdataset":
        train = write_shards([jpeg_world], tmp_path / "sh", size=240, max_per_shard=4, show_progress=False)
    batches = {}
    for decode in ("full", "draft"):
        over = [f"data.train=[{train}]", f"data.format={fmt}", f"data.image.decode={decode}", *JPEG_RUN]
        loader, pairs, images = build_train_loader(load_config(PretrainConfig, TINY, over), tok, None, None)
        assert images == 8 and pairs == (16 if fmt == "webdataset" else 8)  # one pair per caption / per entry
        batches[decode] = next(iter(loader))
    full, draft = batches["full"], batches["draft"]
    assert torch.equal(full["image_ids"], draft["image_ids"]) and torch.equal(full["input_ids"], draft["input_ids"])
    assert full["images"].dtype == draft["images"].dtype == torch.uint8 and full["images"].shape == (4, 3, 64, 64)
    assert not torch.equal(full["images"], draft["images"])  # decoded at 1/2 or less
    assert (full["images"].float() - draft["images"].float()).abs().mean() < 3  # the same crops


def test_pretraining_runs_with_draft_decoding(jpeg_world, tmp_path, capsys):
    from vlp.cli import main

    run = tmp_path / "run"
    rc = main(
        [
            "pretrain",
            "--config",
            TINY,
            f"output_dir={run}",
            f"data.train=[{jpeg_world}]",
            "data.image.decode=draft",
            *JPEG_RUN,
            "train.steps=2",
            "train.log_every=1",
            "train.ckpt_every=0",
            "train.warmup_steps=0",
            "train.progress=false",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(math.isfinite(r["loss"]) for r in records)
    assert "decode: draft" in (run / "config.yaml").read_text()
