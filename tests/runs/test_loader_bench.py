"""``vlp bench --loader-only`` (:mod:`vlp.runs.bench.loader`): the result, the images it reads and
its errors. The JPEG draft-decoding rules it times: ``tests/data/test_draft.py``. No timing
thresholds: speed targets live in the benchmark."""

import json

import pytest
from PIL import Image

from vlp.cli import main
from vlp.config import PretrainConfig, load_config
from vlp.errors import ConfigError, DataError
from vlp.runs.bench.loader import (
    DECODES,
    find_images,
    format_loader_bench,
    parse_size,
    run_loader_bench,
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


@pytest.mark.parametrize("workers", [0, 1])
def test_result_has_the_keys_and_positive_rates(workers, tmp_path):
    out = tmp_path / "r.json"
    r = run_loader_bench(_cfg(*ALBEF_AUG), n=4, workers=workers, size=(400, 300), out=out, **FAST)
    assert KEYS <= set(r) and json.loads(out.read_text())["images_per_s"] == r["images_per_s"]
    assert r["workers"] == workers and r["n_images"] == 4 and r["images"] == "generated"
    assert r["source_size"] == "400x300" and r["image_size"] == 64 and r["mean_file_kb"] > 1
    assert r["decode"] == "full" and set(r["by_decode"]) == {"full", "draft", "draft-crop", "device"}
    assert r["draft_scale"] == 2 and r["not_timed"] == {} and r["uint8"] is False and r["batch"] == 8
    for v in r["by_decode"].values():
        assert v["images_per_s"] > 0 and v["images_per_s_per_worker"] > 0 and v["ms_per_image"] > 0
        assert v["cpu_ms_per_image"] > 0 and v["speedup"] > 0
        assert v["output_shape"] == [3, 64, 64]
    assert {k: v["output_dtype"] for k, v in r["by_decode"].items()} == {
        **dict.fromkeys(DECODES, "float32"),
        "device": "uint8",
    }
    assert sum(r["by_decode"]["draft-crop"]["crop_draft_scales"].values()) == 4


def test_uint8_comes_from_the_config_and_no_reduction_times_one_decode():
    r = run_loader_bench(_cfg(*ALBEF_AUG, "data.image.uint8=true"), n=2, workers=0, size=(100, 80), **FAST)
    assert r["uint8"] is True and r["output_dtype"] == "uint8" and r["output_shape"] == [3, 64, 64]
    assert r["draft_scales"] == {"1": 2} and set(r["by_decode"]) == {"full", "device"}
    assert set(r["not_timed"]) == {"draft", "draft-crop"}


def test_the_top_level_figures_are_those_of_the_decode_the_config_trains_with():
    """``data.image.decode=draft`` trains with the per-crop draft decode: the bench reports it on
    top (``full`` when no crop is reduced), with the speed-up against ``full``."""
    cfg = _cfg(*ALBEF_AUG, "data.image.decode=draft")
    r = run_loader_bench(cfg, n=2, workers=0, size=(400, 300), decodes=("full", "draft-crop"), **FAST)
    assert r["decode"] == "draft-crop" and r["data_image_decode"] == "draft" and r["not_timed"] == {}
    assert r["images_per_s"] == r["by_decode"]["draft-crop"]["images_per_s"]
    assert r["by_decode"]["full"]["speedup"] == 1
    assert "trains with data.image.decode=draft: per crop" in format_loader_bench(r)
    small = run_loader_bench(cfg, n=2, workers=0, size=(100, 80), decodes=("full", "draft-crop"), **FAST)
    assert small["decode"] == "full" and set(small["not_timed"]) == {"draft-crop"}
    plain = run_loader_bench(_cfg(*ALBEF_AUG), n=2, workers=0, size=(400, 300), **FAST)
    assert plain["decode"] == "full" and plain["images_per_s"] == plain["by_decode"]["full"]["images_per_s"]


def test_device_decoding_times_the_loaders_share_and_the_devices_apart(tmp_path):
    """``data.image.decode=device``: the worker's share (bytes, header, draws) in ``by_decode`` and on
    top; the device's share (here the CPU: decode_jpeg and the tensor ops) in ``device_decode``, in
    batches of ``data.batch_size``; both printed and in ``--out``."""
    cfg = _cfg(*ALBEF_AUG, "data.image.decode=device", "data.image.uint8=true", "data.batch_size=4")
    out = tmp_path / "r.json"
    r = run_loader_bench(cfg, n=6, workers=1, size=(200, 150), decodes=("full", "device"), out=out, **FAST)
    assert r["decode"] == "device" and r["images_per_s"] == r["by_decode"]["device"]["images_per_s"]
    d = r["device_decode"]
    assert d["device"].startswith("cpu (") and d["batch"] == 4 and d["images_per_s"] > 0 and d["ms_per_batch"] > 0
    assert d["jpeg_share"] == 1.0 and d["mean_abs_diff_vs_cpu"] is None  # on the CPU itself
    assert d["output_shape"] == r["by_decode"]["device"]["output_shape"] == [3, 64, 64] and d["output_dtype"] == "uint8"
    assert json.loads(out.read_text())["device_decode"]["images_per_s"] == d["images_per_s"]
    text = format_loader_bench(r)
    assert "device, loader's share" in text and "device's share of data.image.decode=device on cpu" in text
    assert "trains with data.image.decode=device" in text
    png = tmp_path / "a.png"
    Image.new("RGB", (90, 70), (10, 200, 30)).save(png)
    mixed = run_loader_bench(cfg, images=[png, *write_test_jpegs(tmp_path / "j", 3, (120, 90))], workers=0, **FAST)
    assert mixed["device_decode"]["jpeg_share"] == 0.75 and mixed["device_decode"]["batch"] == 4
    assert run_loader_bench(_cfg(), n=2, workers=0, decodes=("full",), **FAST)["device_decode"] is None


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
