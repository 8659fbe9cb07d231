"""The one preset registry (issue 43, item 3): a name -> architecture, released weights,
preprocessing; ``list_models``, ``create_model_and_transforms``, the zoo, ``vlp zoo list`` and the
tower presets all read it. The old tables' values are written out here: the registry must give
each name what the three tables gave it."""

import pytest
import torch
from PIL import Image

import vlp
from vlp.checkpoint import preprocessor_of
from vlp.config import (
    PRESETS,
    TEXT_PRESETS,
    VISION_PRESETS,
    FinetuneConfig,
    Preprocessing,
    Preset,
    PretrainConfig,
    preset_model_config,
    resolved,
)
from vlp.config.presets import albef_release
from vlp.errors import ConfigError
from vlp.factory import model_config, preset_preprocessor
from vlp.interop import zoo
from vlp.kinds import is_finetuned
from vlp.models.albef import ALBEF
from vlp.registry import UnknownName

CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
URL = "https://storage.googleapis.com/sfr-pcl-data-research/ALBEF/"

# The old tables: factory.MODELS' towers as config.model's VISION_PRESETS / TEXT_PRESETS resolved them.
OLD_VISION = {
    "tiny": dict(arch="vit_tiny_patch16_224", img_size=64, patch_size=8, width=192, depth=4, heads=3),
    "small": dict(arch="vit_small_patch16_224", img_size=224, patch_size=16, width=384, depth=12, heads=6),
    "base": dict(arch="vit_base_patch16_224", img_size=256, patch_size=16, width=768, depth=12, heads=12),
}
OLD_TEXT = {
    "tiny": dict(hidden=192, layers=2, fusion_layers=2, heads=4, intermediate=768, init="random"),
    "small": dict(hidden=384, layers=3, fusion_layers=3, heads=12, intermediate=1536, init="minilm"),
    "base": dict(hidden=768, layers=6, fusion_layers=6, heads=12, intermediate=3072, init="bert-base-uncased"),
}
# interop/zoo's _ENTRIES: tag -> (file, kind, image size, about)
OLD_ZOO = {
    "albef-14m": ("ALBEF.pth", "pretrain", 256, "pretrained on 14M image-text pairs"),
    "albef-4m": ("ALBEF_4M.pth", "pretrain", 256, "pretrained on 4M image-text pairs"),
    "albef-retrieval-coco": ("mscoco.pth", "retrieval", 384, "fine-tuned for COCO retrieval"),
    "albef-retrieval-flickr": ("flickr30k.pth", "retrieval", 384, "fine-tuned for Flickr30k retrieval"),
    "albef-vqa": ("vqa.pth", "vqa", 384, "fine-tuned for VQA v2 (+ VG QA)"),
    "albef-nlvr-ta": (
        "pretrain_model_nlvr.pth",
        "nlvr",
        256,
        "after NLVR2 text-assignment pretraining (vlp task nlvr-ta; fine-tune it on NLVR2)",
    ),
    "albef-grounding-refcoco": (
        "refcoco.pth",
        "retrieval",
        384,
        "fine-tuned for weakly supervised grounding on RefCOCO+ (the retrieval layout; vlp evaluate grounding)",
    ),
}
#: the vlp checkpoint kind a converted file of each ALBEF layout gets (no NLVR2 head: nlvr-ta)
VLP_KIND = {"pretrain": "pretrain", "retrieval": "retrieval", "vqa": "vqa", "nlvr": "nlvr-ta"}


@pytest.fixture
def mini():
    """A preset registered from the suite: a 1-layer tiny ALBEF normalising with mean 0.5, std 0.25."""
    preset = Preset(
        "test-mini",
        {"vision": {"preset": "tiny", "depth": 1}, "text": {"preset": "tiny", "layers": 1, "fusion_layers": 1}},
        Preprocessing(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), max_len=12),
        about="registered by a test",
    )
    with PRESETS.registered("test-mini", preset):
        yield preset


def test_a_registered_preset_is_listed_and_built(mini):
    assert "test-mini" in vlp.list_models() and "test-mini" not in [t for _, t in vlp.list_pretrained()]
    vm, _, transform = vlp.create_model_and_transforms("test-mini", device="cpu")
    model = vm.model
    assert isinstance(model, ALBEF) and len(model.vision.blocks) == 1 and len(model.fusion.layer) == 1
    pixels = transform(Image.new("RGB", (70, 50), (255, 0, 0)))
    assert pixels.shape == (3, 64, 64)  # the tiny tower's resolution
    assert torch.allclose(pixels[:, 0, 0], torch.tensor([2.0, -2.0, -2.0]))  # (1 - 0.5) / 0.25, (0 - 0.5) / 0.25
    assert preset_preprocessor("test-mini").max_len == 12
    with pytest.raises(ValueError, match="registered already"):
        PRESETS.register("test-mini", mini)
    PRESETS.unregister("test-mini")
    assert "test-mini" not in vlp.list_models()
    PRESETS.register("test-mini", mini)  # the fixture removes it again


def test_a_registered_release_is_a_zoo_tag(capsys):
    PRESETS.register(
        "test-release", albef_release("test-release", "http://mirror.local/t.pth", "retrieval", 384, "a test's weights")
    )
    try:
        assert vlp.list_pretrained()[-1] == ("albef-base", "test-release") and "test-release" not in vlp.list_models()
        e = zoo.pretrained_entry("test-release")
        assert (e.url, e.kind, e.image_size, e.filename, e.sha256) == (
            "http://mirror.local/t.pth",
            "retrieval",
            384,
            "t.pth",
            None,
        )
        from vlp.cli import main

        assert main(["zoo", "list"]) == 0
        assert "test-release" in capsys.readouterr().out
    finally:
        PRESETS.unregister("test-release")
    assert "test-release" not in zoo.PRETRAINED and len(zoo.PRETRAINED) == len(OLD_ZOO)
    with pytest.raises(KeyError):  # the zoo's view removes released presets only
        del zoo.PRETRAINED["albef-tiny"]
    assert "albef-tiny" in vlp.list_models()


def test_a_bad_preset_is_refused():
    with pytest.raises(ConfigError, match="model.vision.preset"):
        Preset("x", {"vision": {"preset": "huge"}})
    with pytest.raises(ConfigError, match="kind 'grounding'"):
        albef_release("x", "http://x/x.pth", "grounding", 384, "a layout the converter does not read")
    with pytest.raises(ConfigError, match="caption_cleaning"):
        Preprocessing(caption_cleaning="lower")
    with PRESETS.registered("test-bad", Preset("test-bad", {"vision": {"depht": 2}})):
        with pytest.raises(ConfigError, match="preset 'test-bad'.*depht"):
            vlp.create_model_and_transforms("test-bad", device="cpu")


def test_an_unknown_preset_is_one_error_naming_the_known_ones():
    with pytest.raises(UnknownName, match=r"unknown preset 'albef-huge'; known: \['albef-tiny', 'albef-small'") as e:
        preset_model_config("albef-huge")
    assert isinstance(e.value, ConfigError) and "albef-14m" in str(e.value)
    assert "albef-tiny" in PRESETS and "albef-huge" not in PRESETS
    with pytest.raises(ConfigError, match=r"unknown model 'albef-huge'; vlp.list_models\(\) has"):
        model_config("albef-huge")


@pytest.mark.parametrize("name", ["albef-tiny", "albef-small", "albef-base", "dual-resnet18"])
def test_model_presets_keep_their_architecture_and_preprocessing(name):
    cfg = model_config(name)
    pre = preset_preprocessor(name)
    assert (pre.mean, pre.std, pre.max_len, pre.caption_cleaning) == (CLIP_MEAN, CLIP_STD, 30, "pre_caption")
    if name == "dual-resnet18":
        assert cfg.arch == "dual" and cfg.dual.image == "resnet18" and pre.image_size == 224
        return
    size = name.removeprefix("albef-")
    assert cfg.arch == "albef" and (cfg.vision.preset, cfg.text.preset) == (size, size)
    vision, text = resolved(cfg.vision, VISION_PRESETS), resolved(cfg.text, TEXT_PRESETS)
    assert {k: vision[k] for k in OLD_VISION[size]} == OLD_VISION[size]
    assert {k: text[k] for k in OLD_TEXT[size]} == OLD_TEXT[size]
    assert pre.image_size == OLD_VISION[size]["img_size"]


@pytest.mark.parametrize("tag", list(OLD_ZOO))
def test_released_tags_keep_their_weights_resolution_and_preprocessing(tag):
    file, kind, image_size, about = OLD_ZOO[tag]
    e = zoo.pretrained_entry(tag)
    assert (e.url, e.kind, e.image_size, e.about, e.sha256, e.size) == (URL + file, kind, image_size, about, None, None)
    # the architecture: ALBEF's ViT-B/16 at that resolution, BERT-base 6 + 6 in ALBEF's tokenizer mode
    cfg = preset_model_config(tag)
    vision, text = resolved(cfg.vision, VISION_PRESETS), resolved(cfg.text, TEXT_PRESETS)
    assert (vision["img_size"], vision["patch_size"], vision["width"], vision["depth"]) == (image_size, 16, 768, 12)
    fusion = 3 if kind == "nlvr" else 6  # vlp's NLVR model doubles its fusion layers
    assert (text["hidden"], text["layers"], text["fusion_layers"], text["albef_compat"]) == (768, 6, fusion, True)
    # the preprocessing: what the converted checkpoint's own preprocessor says
    vlp_kind = VLP_KIND[kind]
    run = FinetuneConfig(task=vlp_kind) if is_finetuned(vlp_kind) else PretrainConfig(model=cfg)
    assert preset_preprocessor(tag) == preprocessor_of(vlp_kind, run, cfg)
    assert list(zoo.PRETRAINED) == list(OLD_ZOO)
