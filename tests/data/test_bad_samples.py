"""Bad samples at training time (raise / skip = replace, counted in ``batch["bad_samples"]``), image
conversions, captions through the collator, and per-item seeds (exact resume with loader workers)."""

from __future__ import annotations

import io
import itertools
import json
import random
import re
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import functional as TF

from vlp.config import DataConfig, FinetuneDataConfig, PretrainConfig, TextConfig, TrainConfig
from vlp.data.datasets import (
    MAX_REPLACEMENTS,
    Collator,
    EpochSampler,
    ImageTextDataset,
    SeededIndex,
    draw_other,
    seed_of,
    train_loader,
)
from vlp.data.downstream_formats import NLVRItem
from vlp.data.formats import load_pairs
from vlp.data.image_checks import check_images
from vlp.data.nlvr import NLVRCollator, NLVRDataset
from vlp.errors import ConfigError, DataError
from vlp.preprocess.transforms import load_tokenizer
from vlp.runs.training.pretrain import build_train_loader
from vlp.train.loop import endless_batches
from vlp.train.setup import make_accelerator

HINT = "; set data.on_bad_sample=skip to replace bad samples"
N = 8  # entries of the test annotation file
BAD = 3  # the entry whose image is bad


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TextConfig())


def colour(i: int) -> tuple[int, int, int]:
    """The distinct solid colour of good image ``i``."""
    return (10 + 20 * i, 200 - 15 * i, 7 * i)


def write_good(path: Path, i: int, size: tuple[int, int] = (20, 20)) -> str:
    Image.new("RGB", size, colour(i)).save(path)
    return str(path)


def jpeg_bytes() -> bytes:
    """A real (noisy, so not tiny) 64x64 JPEG."""
    arr = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(arr).save(out, "JPEG")
    return out.getvalue()


def png_bytes() -> bytes:
    arr = np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(arr).save(out, "PNG")
    return out.getvalue()


# kind -> (file name, writer of the bad file (None: no file), message after "ann.json entry 3: ")
BAD_KINDS: dict[str, tuple[str, Callable[[Path], None] | None, str]] = {
    "missing": ("gone.jpg", None, "image file not found: {path}"),
    "zero_byte": (
        "empty.jpg",
        lambda p: p.write_bytes(b""),
        "cannot read image {path}: not an image file Pillow can identify",
    ),
    "truncated_jpeg": (
        "half.jpg",
        lambda p: p.write_bytes(jpeg_bytes()[: len(jpeg_bytes()) // 2]),
        "cannot read image {path}: truncated or corrupt (image file is truncated",
    ),
    "truncated_png": (
        "half.png",
        lambda p: p.write_bytes(png_bytes()[: len(png_bytes()) // 2]),
        "cannot read image {path}: truncated or corrupt (image file is truncated",
    ),
    "text_as_jpg": (
        "notes.jpg",
        lambda p: p.write_text("not an image, just text\n"),
        "cannot read image {path}: not an image file Pillow can identify",
    ),
    "directory": ("folder.jpg", lambda p: p.mkdir(), "{path} is a directory, not an image file"),
    "too_many_pixels": (
        "huge.png",
        lambda p: Image.new("RGB", (80, 70), (1, 2, 3)).save(p),
        "image {path} is 80x70 RGB = 16800 bytes decoded, more than the limit of 15000 (an 8-bit RGB image "
        "of 5000 pixels: the decompression-bomb guard, data.max_image_pixels)",
    ),
}


def dataset_with(tmp_path: Path, kind: str, on_bad: str | None, bad: tuple[int, ...] = (BAD,)) -> ImageTextDataset:
    """N entries (one caption each, "caption i"); the entries ``bad`` have a bad image of ``kind``, the
    others solid colour(i) 20x20 PNGs. max_pixels=5000 (good images have 400); transform: uint8 tensor."""
    entries = []
    name, write_bad, _ = BAD_KINDS[kind]
    for i in range(N):
        if i in bad:
            path = tmp_path / f"{i}_{name}"
            if write_bad is not None:
                write_bad(path)
        else:
            path = Path(write_good(tmp_path / f"{i}.png", i))
        entries.append({"image": path.name, "caption": f"caption {i}", "image_id": i})
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps(entries))
    return ImageTextDataset(load_pairs([ann]), TF.pil_to_tensor, on_bad=on_bad, max_pixels=5000)


def expected_message(tmp_path: Path, kind: str, index: int = BAD) -> str:
    name, _, reason = BAD_KINDS[kind]
    return f"{tmp_path / 'ann.json'} entry {index}: " + reason.format(path=tmp_path / f"{index}_{name}")


# ----------------------------------------------------------------------------- raise


@pytest.mark.parametrize("kind", list(BAD_KINDS))
def test_raise_names_entry_path_and_reason(tmp_path: Path, kind: str) -> None:
    ds = dataset_with(tmp_path, kind, "raise")
    assert ds[SeededIndex(BAD - 1, 5)]["bad_samples"] == 0  # good entries load
    with pytest.raises(DataError) as e:
        ds[SeededIndex(BAD, 5)]
    msg, want = str(e.value), expected_message(tmp_path, kind)
    if kind.startswith("truncated"):  # Pillow's own detail follows in the parentheses
        assert re.fullmatch(re.escape(want) + r"[^;]*\)" + re.escape(HINT), msg), msg
    else:
        assert msg == want + HINT


def test_evaluation_datasets_raise_without_the_hint(tmp_path: Path) -> None:
    ds = dataset_with(tmp_path, "missing", None)  # on_bad=None: evaluation, every image must load
    with pytest.raises(DataError) as e:
        ds[BAD]
    assert str(e.value) == expected_message(tmp_path, "missing")


# ----------------------------------------------------------------------------- skip


@pytest.mark.parametrize("kind", list(BAD_KINDS))
def test_skip_replaces_with_a_good_sample_and_counts_it(tmp_path: Path, kind: str, tok) -> None:
    ds = dataset_with(tmp_path, kind, "skip")
    seed = seed_of("item", 0, 0, BAD)
    item = ds[SeededIndex(BAD, seed)]
    j = draw_other(random.Random(seed_of("replace", seed)), BAD, N)  # the documented draw
    assert j != BAD and item["bad_samples"] == 1
    assert item["image_id"] == j and item["caption"] == f"caption {j}"
    assert torch.equal(item["image"], torch.tensor(colour(j), dtype=torch.uint8)[:, None, None].expand(3, 20, 20))
    again = ds[SeededIndex(BAD, seed)]  # deterministic: a resumed run replaces identically
    assert again["image_id"] == j and again["bad_samples"] == 1

    loader = train_loader(ds, batch_size=4, collate=Collator(tok, 30), num_workers=0, seed=0)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == 2
        assert [b["images"].shape for b in batches] == [torch.Size([4, 3, 20, 20])] * 2  # fixed shapes
        assert [b["bad_samples"].shape for b in batches] == [torch.Size([])] * 2
        assert all(b["bad_samples"].dtype == torch.long for b in batches)
        assert sum(int(b["bad_samples"]) for b in batches) == 1  # exactly the one bad entry per epoch
        ids = [i for b in batches for i in b["image_ids"].tolist()]
        assert BAD not in ids and len(ids) == N  # the bad image never reaches a batch


def test_skip_count_is_exact_over_an_epoch_with_several_bad_entries(tmp_path: Path, tok) -> None:
    bad = (0, 3, 5)
    ds = dataset_with(tmp_path, "zero_byte", "skip", bad=bad)
    loader = train_loader(ds, batch_size=4, collate=Collator(tok, 30), num_workers=0, seed=7)
    batches = list(loader)
    # every bad entry once, plus each replacement drawn for it that was bad too (the documented rule)
    extra = 0
    for i in bad:
        rng = random.Random(seed_of("replace", seed_of("item", 7, 0, i)))
        while draw_other(rng, i, N) in bad:
            extra += 1
    assert sum(int(b["bad_samples"]) for b in batches) == len(bad) + extra
    assert not set(bad) & {i for b in batches for i in b["image_ids"].tolist()}


def test_skip_gives_up_after_max_replacements(tmp_path: Path) -> None:
    ds = dataset_with(tmp_path, "missing", "skip", bad=tuple(range(N)))
    with pytest.raises(DataError) as e:
        ds[SeededIndex(2, 11)]
    assert str(e.value) == (
        f"{expected_message(tmp_path, 'missing', 2)}; and the {MAX_REPLACEMENTS} replacement "
        "samples drawn for it were bad too (data.on_bad_sample=skip): check that the data's "
        "images are readable"
    )


def test_nlvr_training_items_replace_a_pair_with_a_bad_image(tmp_path: Path, tok) -> None:
    good = [write_good(tmp_path / f"{i}.png", i, (8, 8)) for i in range(4)]
    items = [NLVRItem((good[i], good[(i + 1) % 4]), f"sentence {i}", i % 2, f"nlvr.json entry {i}") for i in range(4)]
    items[2] = NLVRItem((good[2], str(tmp_path / "gone.png")), "sentence 2", 0, "nlvr.json entry 2")
    with pytest.raises(
        DataError, match=re.escape(f"nlvr.json entry 2: image file not found: {tmp_path / 'gone.png'}" + HINT)
    ):
        NLVRDataset(items, TF.pil_to_tensor, on_bad="raise")[SeededIndex(2, 0)]
    ds = NLVRDataset(items, TF.pil_to_tensor, on_bad="skip")
    item = ds[SeededIndex(2, 0)]
    assert item["bad_samples"] == 1 and item["sentence"] != "sentence 2"
    batch = NLVRCollator(tok)([item, ds[SeededIndex(0, 1)]])
    assert batch["bad_samples"].item() == 1 and batch["images0"].shape == (2, 3, 16, 16)  # 8 px upscaled to min_side


# ----------------------------------------------------------------------------- up-front check


def test_check_images_raise_skip_and_max_bad_fraction(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    dataset_with(tmp_path, "missing", "skip")
    samples = load_pairs([tmp_path / "ann.json"])
    gone = f"{tmp_path / 'ann.json'} entry {BAD}: {tmp_path / f'{BAD}_gone.jpg'}"
    with pytest.raises(DataError) as e:
        check_images(samples, DataConfig(on_bad_sample="raise"))
    assert str(e.value) == f"1 of {N} image files not found, e.g. {gone}{HINT}"
    with pytest.raises(DataError) as e:
        check_images(samples, DataConfig(on_bad_sample="skip", max_bad_fraction=0.1))
    assert str(e.value) == (
        f"1 of {N} image files not found (12.50%), more than data.max_bad_fraction=0.1, e.g. {gone}"
    )
    capsys.readouterr()
    check_images(samples, DataConfig(on_bad_sample="skip", max_bad_fraction=0.125))
    err = capsys.readouterr().err
    assert err == (
        f"vlp data: warning: 1 of {N} image files not found (12.50%); data.on_bad_sample=skip replaces "
        f"them at training time, e.g. {gone}\n"
    )
    with pytest.raises(DataError, match=re.escape(f"1 of {N} image files not found, e.g. {gone}") + "$"):
        check_images(samples)  # no data config (helper features, COCOS): every file must exist


def test_build_train_loader_wires_the_keys(tmp_path: Path, tok) -> None:
    dataset_with(tmp_path, "too_many_pixels", "skip")
    cfg = PretrainConfig()
    cfg.data.train, cfg.data.batch_size = [str(tmp_path / "ann.json")], 4
    cfg.data.max_image_pixels, cfg.data.on_bad_sample = 5000, "raise"
    loader, pairs, images = build_train_loader(cfg, tok, None, None)
    assert (pairs, images) == (N, N)
    with pytest.raises(
        DataError, match=re.escape("16800 bytes decoded, more than the limit of 15000") + ".*" + re.escape(HINT)
    ):
        list(loader)
    cfg.data.on_bad_sample = "skip"
    loader, _, _ = build_train_loader(cfg, tok, None, None)
    assert sum(int(b["bad_samples"]) for b in loader) == 1
    cfg.data.max_image_pixels = 0  # no limit: the 80x70 image is a good sample
    loader, _, _ = build_train_loader(cfg, tok, None, None)
    assert sum(int(b["bad_samples"]) for b in loader) == 0


def test_config_keys_are_validated() -> None:
    d = DataConfig()
    assert (d.on_bad_sample, d.max_bad_fraction, d.max_image_pixels, d.min_image_side) == ("skip", 0.05, 89_478_485, 16)
    assert FinetuneDataConfig().on_bad_sample == "skip"
    for kw, msg in (
        (
            dict(on_bad_sample="ignore"),
            "config key 'data.on_bad_sample': got 'ignore', expected one of ['skip', 'raise']",
        ),
        (dict(max_bad_fraction=1.5), "config key 'data.max_bad_fraction': got 1.5, expected 0 <= x <= 1"),
        (dict(max_image_pixels=-1), "config key 'data.max_image_pixels': got -1, expected >= 0 (0: no limit)"),
        (dict(min_image_side=0), "config key 'data.min_image_side': got 0, expected >= 1"),
    ):
        for schema in (DataConfig, FinetuneDataConfig):
            with pytest.raises(ConfigError) as e:
                schema(**kw)
            assert str(e.value) == msg


# ----------------------------------------------------------------------------- conversions


def rgb_of(tmp_path: Path, name: str, im: Image.Image, **save) -> Image.Image:
    """``im`` saved as ``name`` and loaded as a training item's image (identity transform)."""
    im.save(tmp_path / name, **save)
    (tmp_path / "a.json").write_text(json.dumps([{"image": name, "caption": "x"}]))
    out = ImageTextDataset(load_pairs([tmp_path / "a.json"]), lambda x: x, on_bad="raise")[0]["image"]
    assert out.mode == "RGB"
    return out


def test_modes_are_converted_to_rgb(tmp_path: Path) -> None:
    assert rgb_of(tmp_path, "l.png", Image.new("L", (20, 20), 100)).getpixel((5, 5)) == (100, 100, 100)
    la = Image.new("LA", (20, 20), (100, 255))
    la.putpixel((0, 0), (30, 0))  # transparent: composited onto white
    out = rgb_of(tmp_path, "la.png", la)
    assert out.getpixel((0, 0)) == (255, 255, 255) and out.getpixel((5, 5)) == (100, 100, 100)
    a = np.full((20, 20), 65535, np.uint16)
    a[0, 0], a[1, 1] = 0, 32896
    out = rgb_of(tmp_path, "i16.png", Image.fromarray(a))  # 16-bit grayscale, scaled to 8 bits
    assert [out.getpixel(p) for p in ((5, 5), (0, 0), (1, 1))] == [(255, 255, 255), (0, 0, 0), (128, 128, 128)]
    cmyk = rgb_of(tmp_path, "cmyk.jpg", Image.new("CMYK", (20, 20), (0, 255, 255, 0)))
    assert cmyk.getpixel((5, 5)) == (255, 0, 0)
    p = Image.new("P", (20, 20), 1)
    p.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    p.putpixel((0, 0), 0)  # palette index 0 is transparent
    out = rgb_of(tmp_path, "p.png", p, transparency=0)
    assert out.getpixel((0, 0)) == (255, 255, 255) and out.getpixel((5, 5)) == (200, 10, 10)
    rgba = Image.new("RGBA", (20, 20), (10, 20, 30, 255))
    rgba.putpixel((0, 0), (0, 255, 0, 0))  # a fully transparent green pixel shows the white background
    out = rgb_of(tmp_path, "rgba.png", rgba)
    assert out.getpixel((0, 0)) == (255, 255, 255) and out.getpixel((5, 5)) == (10, 20, 30)


@pytest.mark.parametrize("size,expected", [((1, 1), (16, 16)), ((3, 50), (16, 267)), ((50, 3), (267, 16))])
def test_tiny_images_are_upscaled_keeping_the_aspect(tmp_path: Path, size, expected) -> None:
    assert rgb_of(tmp_path, "tiny.png", Image.new("RGB", size, (9, 99, 199))).size == expected


# ----------------------------------------------------------------------------- captions


def test_non_ascii_captions_survive_the_collator(tok) -> None:
    item = {"image": torch.zeros(3, 2, 2), "image_id": 0, "caption": "Zürich café: 東京 — naïve Ωmega"}
    batch = Collator(tok, 30)([item])
    assert tok.unk_token_id not in batch["input_ids"][0].tolist()
    assert tok.decode(batch["input_ids"][0], skip_special_tokens=True) == "zurich cafe 東 京 — naive ωmega"
    assert batch["bad_samples"].item() == 0  # always present


def test_overlong_caption_is_truncated_to_max_len(tok) -> None:
    cfg = PretrainConfig()
    item = {"image": torch.zeros(3, 2, 2), "image_id": 0, "caption": " ".join(["zebra"] * 100)}
    batch = Collator(tok, cfg.model.text.max_len)([item])
    ids = batch["input_ids"][0].tolist()
    assert len(ids) == cfg.model.text.max_len == 30
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and batch["attention_mask"].sum() == 30


# ----------------------------------------------------------------------------- per-item seeds


def seeded_world(tmp_path: Path) -> Path:
    """8 noisy 24 px images (so crops and RandAugment change pixels), one caption each, and a 9th
    entry whose image is missing (replaced under skip: replacements must replay too)."""
    rng = np.random.default_rng(0)
    entries = []
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        entries.append(
            {"image": f"{i}.png", "caption": [f"caption {i} a", f"caption {i} b", f"caption {i} c"], "image_id": i}
        )
    entries.append({"image": "gone.png", "caption": "lost", "image_id": 99})
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps(entries))
    return ann


def prepared_loader(ann: Path, tok, num_workers: int, seed: int = 0):
    """``build_train_loader`` (randaugment, crop, flip; skip) after ``accelerate.prepare``, as the loop has it."""
    cfg = PretrainConfig()
    cfg.data.train, cfg.data.batch_size, cfg.data.num_workers = [str(ann)], 3, num_workers
    cfg.data.max_bad_fraction, cfg.model.vision.img_size, cfg.train.seed = 0.2, 16, seed
    loader, _, _ = build_train_loader(cfg, tok, None, None)
    return make_accelerator(TrainConfig()).prepare(loader)


def take(loader, start: int, n: int) -> list[dict]:
    """``n`` batches of the loop's batch sequence from batch ``start`` (``endless_batches``: set_epoch
    every epoch, ``skip_first_batches`` on resume)."""
    return list(itertools.islice(endless_batches(loader, start), n))


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x["images"], y["images"])
        and torch.equal(x["input_ids"], y["input_ids"])
        and torch.equal(x["image_ids"], y["image_ids"])
        and torch.equal(x["bad_samples"], y["bad_samples"])
        for x, y in zip(a, b)
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_replays_batches_and_augmentations_exactly(tmp_path: Path, tok, num_workers: int) -> None:
    ann = seeded_world(tmp_path)
    py_state, torch_state = random.getstate(), torch.get_rng_state()
    loader = prepared_loader(ann, tok, num_workers)
    per_epoch = len(loader)
    assert per_epoch == 3  # 9 entries, batches of 3
    full = take(loader, 0, 2 * per_epoch)  # epochs 0 and 1
    if num_workers == 0:
        assert random.getstate() == py_state and torch.equal(torch.get_rng_state(), torch_state)  # untouched
    assert sum(int(b["bad_samples"]) for b in full) == 2  # the missing entry, once per epoch
    assert same(take(prepared_loader(ann, tok, num_workers), 0, 2 * per_epoch), full)  # same seed, fresh loader
    assert same(take(prepared_loader(ann, tok, num_workers), per_epoch, per_epoch), full[per_epoch:])  # epoch 1
    for k in (1, per_epoch + 2):  # resume inside epoch 0 and inside epoch 1 (skip_first_batches)
        assert same(take(prepared_loader(ann, tok, num_workers), k, 2 * per_epoch - k), full[k:])
    other = take(prepared_loader(ann, tok, num_workers, seed=1), 0, per_epoch)
    assert not same(other, full[:per_epoch])


def test_epochs_draw_other_augmentations_and_orders(tmp_path: Path, tok) -> None:
    loader = prepared_loader(seeded_world(tmp_path), tok, 0)
    e0, e1 = take(loader, 0, 3), take(loader, 3, 3)

    def by_image(batches: list[dict]) -> dict[int, torch.Tensor]:
        """Image id -> its augmented image, for the ids that appear once (a replacement repeats one)."""
        rows = [(i, b["images"][r]) for b in batches for r, i in enumerate(b["image_ids"].tolist())]
        ids = [i for i, _ in rows]
        return {i: x for i, x in rows if ids.count(i) == 1}

    a, b = by_image(e0), by_image(e1)
    common = set(a) & set(b)
    assert len(common) >= 6 and all(not torch.equal(a[i], b[i]) for i in common)
    assert [x["image_ids"].tolist() for x in e0] != [x["image_ids"].tolist() for x in e1]


def test_epoch_sampler_depends_on_seed_and_epoch_only() -> None:
    s = EpochSampler(10, seed=4)
    s.set_epoch(2)
    first = list(s)
    s.set_epoch(0)
    list(s)
    s.set_epoch(2)
    assert list(s) == first and sorted(i.index for i in first) == list(range(10))
    assert [i.seed for i in first] == [seed_of("item", 4, 2, i.index) for i in first]
    s.set_epoch(3)
    assert [i.index for i in s] != [i.index for i in first]
