"""A frozen open_clip model as the SRCL helper (``open_clip:ARCH[/PRETRAINED]``): spec parsing, the
feature cache against open_clip's own outputs, clear errors, and the cache ``build_regulator``
builds into the run directory; weights are required unless the helper init is ``random``. A tiny
open_clip model from a model-config JSON, random weights saved to a file."""

import json
import os
import threading
import time

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from tests.helpers import ROOT, SHAPES_TINY, load_script, open_clip_rows
from vlp.cli import main
from vlp.config import PretrainConfig, load_config
from vlp.data.formats import load_pairs
from vlp.errors import CheckpointError, ConfigError, DataError
from vlp.features.helper_cache import HelperCache
from vlp.features.open_clip_cache import OPEN_CLIP_CACHE, open_clip_helper_cache
from vlp.models.open_clip_helper import OpenClipHelper, parse_open_clip_spec
from vlp.runs.training.assembly import build_regulator, check_helper_weights
from vlp.runs.training.features import run_cache_helper_features

TINY_CLIP = load_script("scripts/make_tiny_open_clip.py").TINY_OPEN_CLIP
CAPTIONS = [
    ["a red circle", "a red circle above a blue square"],
    ["two green triangles"],
    ["a red circle", "one large yellow square to the left of a small purple circle next to a big grey one"],
    ["three blue squares"],
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The model config, its random weights, 4 non-square images of other sizes than the model's
    and an annotation file over them."""
    root = tmp_path_factory.mktemp("oc")
    config = root / "tiny-oc-test.json"
    config.write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(config)
    torch.manual_seed(0)
    model = open_clip.create_model("tiny-oc-test")
    weights = root / "tiny_weights.pt"
    torch.save(model.state_dict(), weights)
    rng = np.random.default_rng(0)
    entries = []
    for i, caps in enumerate(CAPTIONS):
        side = 24 + 8 * i
        path = root / "images" / f"img{i}.png"
        path.parent.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (side, side + 4, 3), dtype=np.uint8)).save(path)
        entries.append({"image": f"images/img{i}.png", "caption": caps, "image_id": f"img{i}"})
    ann = root / "pretrain.json"
    ann.write_text(json.dumps(entries))
    return {"root": root, "config": config, "weights": weights, "ann": ann, "spec": f"open_clip:{config}/{weights}"}


@pytest.fixture(scope="module")
def reference(files):
    """open_clip's own model, eval preprocessing and tokenizer, loaded independently of vlp."""
    model, _, preprocess = open_clip.create_model_and_transforms("tiny-oc-test", pretrained=str(files["weights"]))
    return model.eval(), preprocess, open_clip.get_tokenizer("tiny-oc-test")


def check_against_reference(cache_dir, files, reference):
    model, preprocess, tokenizer = reference
    cache = HelperCache.load(cache_dir)
    samples = load_pairs([files["ann"]])
    cache.check_covers(samples)
    want_img, want_txt = open_clip_rows(model, preprocess, tokenizer, cache, samples)
    assert cache.kind == "learned" and cache.dim == TINY_CLIP["embed_dim"]
    assert cache.image.dtype == torch.float32 and cache.text.dtype == torch.float32
    torch.testing.assert_close(cache.image, want_img, atol=1e-5, rtol=0)
    torch.testing.assert_close(cache.text, want_txt, atol=1e-5, rtol=0)
    assert set(cache.text_index) == {c for caps in CAPTIONS for c in caps}
    return cache


@pytest.mark.parametrize(
    "spec,arch,pretrained",
    [
        ("open_clip:ViT-B-16", "ViT-B-16", None),
        ("open_clip:ViT-B-16/laion2b_s34b_b88k", "ViT-B-16", "laion2b_s34b_b88k"),
        ("open_clip:ViT-B-16//abs/w.pt", "ViT-B-16", "/abs/w.pt"),
        ("open_clip:cfg/tiny.json", "cfg/tiny.json", None),
        ("open_clip:/a/b.json/w/x.safetensors", "/a/b.json", "w/x.safetensors"),
        ("open_clip:/a/b.json//abs/w.pt", "/a/b.json", "/abs/w.pt"),
        ("open_clip:/a/cfg.json.d/tiny.json/openai", "/a/cfg.json.d/tiny.json", "openai"),
    ],
)
def test_spec_grammar(spec, arch, pretrained):
    p = parse_open_clip_spec(spec)
    assert (p.arch, p.pretrained) == (arch, pretrained)
    assert p.model_name == (arch[:-5].rsplit("/", 1)[-1] if arch.endswith(".json") else arch)


def test_cache_equals_open_clip_outputs(files, reference, tmp_path):
    out = run_cache_helper_features(files["spec"], [str(files["ann"])], tmp_path / "cache", show_progress=False)
    cache = check_against_reference(out, files, reference)
    meta = json.loads((out / "index.json").read_text())
    assert meta["helper"] == files["spec"] and meta["arch"] == "tiny-oc-test"
    assert meta["pretrained"] == str(files["weights"].resolve())
    assert meta["image_size"] == 32 and meta["context_length"] == 16 and meta["kind"] == "learned"
    assert cache.image.shape == (4, 32) and meta["num_texts"] == len(cache.text_index)


def test_cli_writes_the_same_cache(files, reference, tmp_path):
    out = tmp_path / "cli_cache"
    argv = ["cache-helper-features", "--helper", files["spec"], "--data", str(files["ann"]), "--out", str(out)]
    assert main([*argv, "--batch-size", "3"]) == 0
    check_against_reference(out, files, reference)


@pytest.mark.parametrize(
    "helper,error,words",
    [
        ("open_clip:NoSuchViT-X", ConfigError, ["unknown open_clip architecture 'NoSuchViT-X'", "ViT-B-16"]),
        ("open_clip:", ConfigError, ["no ARCH", "open_clip:ARCH[/PRETRAINED]"]),
        ("open_clip:ViT-B-16/", ConfigError, ["empty PRETRAINED"]),
        ("open_clip:{root}/missing.json", DataError, ["missing.json not found", "expected an existing .json"]),
        ("open_clip:{root}/pretrain.json", DataError, ["not an open_clip model config", "embed_dim"]),
        ("open_clip:{config}/{root}/nope.pt", DataError, ["weights file", "nope.pt not found"]),
        ("open_clip:{config}/laion9b", ConfigError, ["neither a file nor an open_clip pretrained tag", "none"]),
        ("open_clip:ViT-B-16/laion9b", ConfigError, ["laion2b_s34b_b88k"]),
    ],
)
def test_bad_spec_is_one_clear_error(files, helper, error, words):
    helper = helper.format(root=files["root"], config=files["config"])
    for key, where in [("loss.srcl.helper", "config key 'loss.srcl.helper'"), ("--helper", "--helper")]:
        with pytest.raises(error) as e:
            OpenClipHelper.load(helper, key, torch.device("cpu"))
        assert str(e.value).startswith(where) and all(w in str(e.value) for w in words), str(e.value)


def test_bad_spec_on_the_command_line(files, tmp_path, capsys):
    argv = ["--helper", "open_clip:NoSuchViT-X", "--data", str(files["ann"]), "--out", str(tmp_path / "c")]
    rc = main(["cache-helper-features", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--helper" in err and "unknown open_clip architecture" in err
    assert not (tmp_path / "c").exists()


def srcl_config(files, out_dir, helper=None, *overrides):
    return load_config(
        PretrainConfig,
        ROOT / SHAPES_TINY,  # absolute: a test changes directory
        [
            f"output_dir={out_dir}",
            f"data.train=[{files['ann']}]",
            "loss.regulation=srcl",
            "loss.srcl.delta=2.0",
            f"loss.srcl.helper={helper or files['spec']}",
            "train.progress=false",
            *overrides,
        ],
    )


def test_build_regulator_caches_the_open_clip_helper_in_the_run(files, reference, tmp_path):
    cfg = srcl_config(files, tmp_path / "run")
    assert cfg.loss.srcl.helper == files["spec"]
    reg, cache = build_regulator(cfg)
    out = tmp_path / "run" / OPEN_CLIP_CACHE
    assert reg is not None and cache is not None and cache.path == out
    assert reg.helper is None and reg.queue.get("text").shape[1] == TINY_CLIP["embed_dim"]
    check_against_reference(out, files, reference)
    stamp = (out / "features.safetensors").stat().st_mtime_ns
    _, again = build_regulator(cfg)  # a resumed run: reused, not rebuilt
    assert (out / "features.safetensors").stat().st_mtime_ns == stamp and torch.equal(again.image, cache.image)
    other = srcl_config(files, tmp_path / "run", f"open_clip:{files['config']}", "loss.srcl.helper_init=random")
    with pytest.raises(ConfigError, match="holds the features of"):
        build_regulator(other)


def test_other_processes_wait_for_the_main_one(files, tmp_path, monkeypatch):
    """Rank 1 neither builds the cache nor reads a half-written one: it waits until rank 0's folder appears."""
    built = run_cache_helper_features(files["spec"], [str(files["ann"])], tmp_path / "built", show_progress=False)
    cfg = srcl_config(files, tmp_path / "run")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    out = tmp_path / "run" / OPEN_CLIP_CACHE
    out.parent.mkdir()

    def rank0() -> None:
        time.sleep(0.3)
        os.replace(built, out)

    t = threading.Thread(target=rank0)
    t.start()
    start = time.monotonic()
    cache = open_clip_helper_cache(cfg, poll_s=0.05)
    t.join()
    assert time.monotonic() - start >= 0.25 and cache.path == out and len(cache.image_index) == 4


# ------------------------------------------------------------------ weights are required (issue 40 part 5)


def test_a_spec_without_weights_is_refused(files, tmp_path, capsys):
    """open_clip itself would build ``open_clip:ARCH`` at random with a log warning only: vlp refuses it,
    naming the setting and both ways out (weights, or the random opt-in), before any model is built."""
    spec = f"open_clip:{files['config']}"
    for key, opt_in in [("loss.srcl.helper", "loss.srcl.helper_init=random"), ("--helper", "--helper-init random")]:
        with pytest.raises(ConfigError) as e:
            OpenClipHelper.load(spec, key, torch.device("cpu"))
        msg = str(e.value)
        assert msg.startswith(key if key.startswith("-") else f"config key '{key}'"), msg
        assert "no weights" in msg and f"{spec}/TAG" in msg and f"{spec}/FILE" in msg and opt_in in msg, msg
    argv = ["cache-helper-features", "--helper", spec, "--data", str(files["ann"]), "--out", str(tmp_path / "c")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--helper" in err and "--helper-init random" in err, err
    assert not (tmp_path / "c").exists()
    cfg = srcl_config(files, tmp_path / "run", spec)
    with pytest.raises(ConfigError, match="loss.srcl.helper_init=random"):
        check_helper_weights(cfg)  # vlp pretrain: before the delta check and any work
    with pytest.raises(ConfigError, match="no weights"):
        build_regulator(cfg)
    assert not (tmp_path / "run").exists()


def test_random_init_is_an_opt_in_recorded_in_the_cache(files, reference, tmp_path):
    """``--helper-init random`` builds ``open_clip:ARCH`` at random and says so in index.json; a cache
    of weights records ``pretrained``; weights and ``random`` together are refused."""
    random_cache = tmp_path / "random"
    argv = ["cache-helper-features", "--data", str(files["ann"]), "--helper-init", "random"]
    assert main([*argv, "--helper", f"open_clip:{files['config']}", "--out", str(random_cache)]) == 0
    meta = HelperCache.load(random_cache).meta
    assert (meta["helper_init"], meta["pretrained"]) == ("random", None)
    assert HelperCache.load(random_cache).helper_init == "random"
    weighted = run_cache_helper_features(files["spec"], [str(files["ann"])], tmp_path / "w", show_progress=False)
    assert check_against_reference(weighted, files, reference).helper_init == "pretrained"
    assert HelperCache.load(weighted).meta["helper_init"] == "pretrained"
    with pytest.raises(ConfigError, match="--helper-init random loads no weights, but the spec names"):
        run_cache_helper_features(files["spec"], [str(files["ann"])], tmp_path / "x", helper_init="random")
    with pytest.raises(ConfigError, match="is for an open_clip helper without weights"):
        run_cache_helper_features(tmp_path / "no_checkpoint", [str(files["ann"])], tmp_path / "y", helper_init="random")
    with pytest.raises(ConfigError, match="loss.srcl.helper_init"):
        srcl_config(files, tmp_path / "run", None, "loss.srcl.helper_init=zeros")


def test_a_cache_without_the_key_is_random_when_it_names_no_weights(tmp_path):
    """Caches written before ``helper_init`` existed: an open_clip helper without weights was random."""

    def meta_of(**meta):
        return HelperCache(torch.zeros(1, 2), torch.zeros(1, 2), {}, {}, meta, tmp_path).helper_init

    assert meta_of(kind="learned", helper="open_clip:ViT-B-16", pretrained=None) == "random"
    assert meta_of(kind="learned", helper="open_clip:ViT-B-16/openai", pretrained="openai") == "pretrained"
    assert meta_of(kind="learned", helper="/runs/helper", helper_step=100) == "pretrained"
    assert (
        meta_of(kind="learned", helper="open_clip:ViT-B-16", pretrained=None, helper_init="pretrained") == "pretrained"
    )


def test_a_run_uses_a_random_helpers_cache_only_with_the_opt_in(files, tmp_path):
    random_cache = run_cache_helper_features(
        f"open_clip:{files['config']}", [str(files["ann"])], tmp_path / "r", show_progress=False, helper_init="random"
    )
    cfg = srcl_config(files, tmp_path / "run", "null", f"loss.srcl.helper_features={random_cache}")
    with pytest.raises(ConfigError, match="randomly initialised helper.*loss.srcl.helper_init=random"):
        build_regulator(cfg)
    opted = srcl_config(
        files, tmp_path / "run", "null", f"loss.srcl.helper_features={random_cache}", "loss.srcl.helper_init=random"
    )
    assert build_regulator(opted)[1].path == random_cache
    weighted = run_cache_helper_features(files["spec"], [str(files["ann"])], tmp_path / "w", show_progress=False)
    wrong = srcl_config(
        files, tmp_path / "run", "null", f"loss.srcl.helper_features={weighted}", "loss.srcl.helper_init=random"
    )
    with pytest.raises(ConfigError, match="holds the features of a helper with weights"):
        build_regulator(wrong)


def test_a_run_uses_the_prebuilt_cache_of_its_own_helper(files, tmp_path, monkeypatch):
    """``loss.srcl.helper=open_clip:...`` with ``loss.srcl.helper_features`` = that helper's cache (the
    one ``vlp analyze helper`` calibrated delta on) reads it instead of building its own; the cache of
    another helper is refused. The spec may name the weights file by another path."""
    prebuilt = run_cache_helper_features(files["spec"], [str(files["ann"])], tmp_path / "pre", show_progress=False)
    monkeypatch.chdir(files["root"])
    relative = f"open_clip:{files['config']}/{files['weights'].name}"
    for spec in (files["spec"], relative):
        cfg = srcl_config(files, tmp_path / "run", spec, f"loss.srcl.helper_features={prebuilt}")
        reg, cache = build_regulator(cfg)
        assert reg is not None and cache is not None and cache.path == prebuilt
        assert not (tmp_path / "run" / OPEN_CLIP_CACHE).exists()
    other = run_cache_helper_features(
        f"open_clip:{files['config']}", [str(files["ann"])], tmp_path / "o", show_progress=False, helper_init="random"
    )
    cfg = srcl_config(files, tmp_path / "run", None, f"loss.srcl.helper_features={other}")
    with pytest.raises(ConfigError, match="'loss.srcl.helper_features'/'loss.srcl.helper'.*holds the features of"):
        build_regulator(cfg)


def test_a_file_named_otherwise_than_in_the_cache_is_named_in_the_error(files, tmp_path, monkeypatch):
    """An image's key starts with its annotation file's path as given: a run that names the file
    another way (relative here, absolute in the cache) is told so."""
    cache = HelperCache.load(
        run_cache_helper_features(files["spec"], [str(files["ann"])], tmp_path / "c", show_progress=False)
    )
    monkeypatch.chdir(files["root"])
    with pytest.raises(DataError) as e:
        cache.check_covers(load_pairs(["pretrain.json"]))
    msg = str(e.value)
    assert "lacks 4 images and 0 captions" in msg and f"It holds that image as {files['ann']}:img0" in msg, msg
    assert f"{files['ann']} to the cache and pretrain.json here; name the file the same way in both" in msg, msg


def test_weights_that_do_not_fit_the_architecture_are_refused(files, tmp_path):
    """open_clip loads a weights file strictly: a file missing a key of the architecture is refused."""
    state = torch.load(files["weights"], weights_only=True)
    state.pop("logit_scale")
    broken = tmp_path / "broken.pt"
    torch.save(state, broken)
    with pytest.raises(CheckpointError, match=r"cannot load the weights file .*broken.pt into tiny-oc-test"):
        OpenClipHelper.load(f"open_clip:{files['config']}/{broken}", "--helper", torch.device("cpu"))
