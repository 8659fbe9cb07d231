"""``vlp bench --loader-only`` (:mod:`vlp.runs.loader_bench`): the result, the images it reads, its
errors, and the JPEG draft-decoding rule. No timing thresholds: speed targets live in the benchmark."""

import json
import random

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from vlp.cli import main
from vlp.config import ImageConfig, PretrainConfig, load_config
from vlp.data.datasets import seeded_rng
from vlp.data.images import open_image
from vlp.data.transforms import train_transform
from vlp.errors import BadImage, ConfigError, DataError
from vlp.runs.loader_bench import (
    crop_draft_scale,
    draft_scale,
    find_images,
    min_crop_side,
    open_crop_draft,
    open_image_draft,
    parse_size,
    run_loader_bench,
    split_crop,
    write_test_jpegs,
)

TINY = "configs/pretrain/shapes_tiny.yaml"  # 64 px, no crop
ALBEF_AUG = ["data.image.crop_scale=[0.2,1.0]", "data.image.hflip=true", "data.image.randaugment=true"]
KEYS = {
    "images_per_s",
    "images_per_s_per_worker",
    "workers",
    "ms_per_image",
    "image_size",
    "source_size",
    "mean_file_kb",
    "decode",
    "draft_scale",
    "uint8",
    "date",
    "device",
    "torch",
    "vlp_version",
}
FAST = {"warmup": 1, "rounds": 1}


def _cfg(*overrides):
    return load_config(PretrainConfig, TINY, list(overrides))


@pytest.fixture(scope="module")
def big_jpeg(tmp_path_factory):
    """A 2000x1500 photo-like JPEG."""
    return write_test_jpegs(tmp_path_factory.mktemp("big"), 1, (2000, 1500))[0]


@pytest.mark.parametrize("workers", [0, 1])
def test_result_has_the_keys_and_positive_rates(workers, tmp_path):
    out = tmp_path / "r.json"
    r = run_loader_bench(_cfg(*ALBEF_AUG), n=4, workers=workers, size=(400, 300), out=out, **FAST)
    assert KEYS <= set(r) and json.loads(out.read_text())["images_per_s"] == r["images_per_s"]
    assert r["workers"] == workers and r["n_images"] == 4 and r["images"] == "generated"
    assert r["source_size"] == "400x300" and r["image_size"] == 64 and r["mean_file_kb"] > 1
    assert r["decode"] == "full" and set(r["by_decode"]) == {"full", "draft", "draft-crop"}
    assert r["draft_scale"] == 2 and r["not_timed"] == {} and r["uint8"] is False and r["batch"] == 8
    for v in r["by_decode"].values():
        assert v["images_per_s"] > 0 and v["images_per_s_per_worker"] > 0 and v["ms_per_image"] > 0
        assert v["cpu_ms_per_image"] > 0 and v["speedup"] > 0
        assert v["output_shape"] == [3, 64, 64] and v["output_dtype"] == "float32"
    assert sum(r["by_decode"]["draft-crop"]["crop_draft_scales"].values()) == 4


def test_uint8_comes_from_the_config_and_no_reduction_times_one_decode():
    r = run_loader_bench(_cfg(*ALBEF_AUG, "data.image.uint8=true"), n=2, workers=0, size=(100, 80), **FAST)
    assert r["uint8"] is True and r["output_dtype"] == "uint8" and r["output_shape"] == [3, 64, 64]
    assert r["draft_scales"] == {"1": 2} and set(r["by_decode"]) == {"full"}
    assert set(r["not_timed"]) == {"draft", "draft-crop"}


def test_generated_jpegs_compress_like_photos(tmp_path):
    paths = write_test_jpegs(tmp_path, 2, (500, 375))
    assert all(Image.open(p).size == (500, 375) for p in paths)
    assert all(p.stat().st_size > 20_000 for p in paths)  # a flat drawing would be ~5 KB


def test_the_images_the_user_names_are_used(tmp_path, capsys):
    folder = tmp_path / "imgs"
    write_test_jpegs(folder / "sub", 3, (120, 90))
    Image.new("RGB", (90, 70), (10, 200, 30)).save(folder / "x.PNG")
    (folder / "notes.txt").write_text("not an image")
    assert len(find_images([folder])) == 4
    r = run_loader_bench(_cfg(), images=[folder], workers=0, **FAST)
    assert r["images"] == "given" and r["n_images"] == 4 and r["source_size"] == "mixed"
    assert r["source_sizes"] == {"120x90": 3, "90x70": 1} and r["jpeg_quality"] is None
    one = sorted((folder / "sub").iterdir())[0]
    out = tmp_path / "cli.json"
    args = ["bench", "--loader-only", "--config", TINY, "--images", str(one), str(folder / "x.PNG")]
    assert main([*args, "--workers", "0", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "images/s" in printed and "per worker" in printed and f"wrote {out}" in printed
    assert json.loads(out.read_text())["n_images"] == 2


def test_bad_images_paths_are_one_clear_error(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match=f"{missing} does not exist"):
        run_loader_bench(_cfg(), images=[missing])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no .jpg/.jpeg/.png files in folder .*empty"):
        run_loader_bench(_cfg(), images=[tmp_path / "empty"])
    junk = tmp_path / "junk.jpg"
    junk.write_text("not a jpeg")
    with pytest.raises(DataError, match=f"cannot read image {junk}"):
        run_loader_bench(_cfg(), images=[junk], workers=0, **FAST)
    assert main(["bench", "--loader-only", "--config", TINY, "--images", str(missing)]) == 2
    assert f"{missing} does not exist" in capsys.readouterr().err
    assert main(["bench", "--loader-only", "--config", TINY, "--source-size", "640x480", "--images", str(junk)]) == 2
    assert "--source-size applies to generated images" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="a config override. give overrides before --images"):
        find_images(["data.image.uint8=true"])
    with pytest.raises(ConfigError, match="WIDTHxHEIGHT"):
        parse_size("1280by960")
    assert parse_size("1280X960") == (1280, 960)


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
