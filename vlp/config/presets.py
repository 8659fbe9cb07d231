"""The one preset registry: a name maps to its architecture (the ``model`` config section), its
released weights if any (URL, SHA-256 and size where published, the ALBEF layout the converter
reads) and its preprocessing (image mean/std, text length and cleaning), as timm's
``register_model`` + ``default_cfgs`` tie a name to all three once.

Every table of names reads it: :func:`vlp.list_models` (the presets without weights: an
architecture, randomly initialised), :func:`vlp.list_pretrained` and :mod:`vlp.interop.zoo` (the
presets with released weights), ``vlp zoo list``, :func:`vlp.create_model_and_transforms`, and the
tower presets of the config (``model.vision.preset``, ``model.text.preset``:
:data:`VISION_PRESETS`, :data:`TEXT_PRESETS`), which a preset's architecture names and which fill
the towers' unset fields (:func:`vlp.config.load.resolved`).

Add one without editing vlp::

    from vlp.config.presets import PRESETS, Preset
    PRESETS.register("albef-mini", Preset("albef-mini", {"vision": {"preset": "tiny", "depth": 2}}, about="..."))

The image resolution is the architecture's (``model.vision.img_size`` or its tower preset's,
``model.dual.img_size`` for the dual encoder): :func:`vlp.config.model.preset_model_config`
builds the typed config of a preset.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from vlp.config.data import ImageConfig
from vlp.config.load import check_choice
from vlp.errors import ConfigError
from vlp.kinds import NLVR, PRETRAIN, RETRIEVAL, VQA, albef_formats, of_albef_format
from vlp.registry import Registry

# ----------------------------------------------------------------------------- tower presets

#: ``model.vision.preset`` -> the ViT tower's sizes (fills the unset fields of ``model.vision``)
VISION_PRESETS: dict[str, dict[str, Any]] = {
    # CPU-sized: 64 px, 8 px patches -> 64 patch tokens + CLS.
    "tiny": dict(arch="vit_tiny_patch16_224", img_size=64, patch_size=8, width=192, depth=4, heads=3),
    "small": dict(arch="vit_small_patch16_224", img_size=224, patch_size=16, width=384, depth=12, heads=6),
    # ALBEF: ViT-B/16 at 256 px, DeiT-B initialisation.
    "base": dict(arch="vit_base_patch16_224", img_size=256, patch_size=16, width=768, depth=12, heads=12),
}

#: ``model.text.preset`` -> the BERT tower's sizes and initialisation (fills ``model.text``)
TEXT_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden=192, layers=2, fusion_layers=2, heads=4, intermediate=768, init="random"),
    # all-MiniLM-L6-v2: layers 0-2 -> text tower, layers 3-5 -> fusion block (new cross-attention).
    "small": dict(hidden=384, layers=3, fusion_layers=3, heads=12, intermediate=1536, init="minilm"),
    # ALBEF: bert-base-uncased, layers 0-5 text, 6-11 fusion.
    "base": dict(hidden=768, layers=6, fusion_layers=6, heads=12, intermediate=3072, init="bert-base-uncased"),
}

#: how texts are cleaned before tokenizing (:mod:`vlp.preprocess.text`)
CAPTION_CLEANINGS = ("pre_caption", "pre_question")

# ----------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class Weights:
    """Released weights of a preset. ``url``: the official download; ``kind``: the ALBEF layout the
    converter reads (one of :func:`vlp.kinds.albef_formats`); ``sha256`` / ``size``: of the file (bytes),
    ``None`` where not published."""

    url: str
    kind: str
    sha256: Optional[str] = None
    size: Optional[int] = None

    def __post_init__(self) -> None:
        if self.kind not in albef_formats():
            raise ConfigError(f"weights {self.url}: kind {self.kind!r}, expected one of {list(albef_formats())}")
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ConfigError(f"weights {self.url}: sha256 must be 64 lower-case hex digits")

    @property
    def filename(self) -> str:
        """The file name of the URL (also the name under a mirror and in the zoo's cache)."""
        return self.url.rsplit("/", 1)[-1]


def _default_mean() -> tuple[float, ...]:
    """The image mean of the run configs' default (:class:`vlp.config.ImageConfig`): 3 floats."""
    return tuple(ImageConfig().mean)


def _default_std() -> tuple[float, ...]:
    """The image std of the run configs' default (:class:`vlp.config.ImageConfig`): 3 floats."""
    return tuple(ImageConfig().std)


@dataclass(frozen=True)
class Preprocessing:
    """How a preset's inputs are prepared, as :class:`vlp.checkpoint.Preprocessor` does (the image
    size is the architecture's): images normalised with ``mean`` / ``std``; texts cleaned with
    ``caption_cleaning`` (``pre_caption``, or ALBEF's ``pre_question`` for VQA questions) and cut at
    ``max_len`` tokens (``None``: the architecture's ``model.text.max_len``); VQA answers at
    ``answer_max_len`` (VQA only)."""

    mean: tuple[float, ...] = field(default_factory=_default_mean)
    std: tuple[float, ...] = field(default_factory=_default_std)
    max_len: Optional[int] = None
    caption_cleaning: str = "pre_caption"
    answer_max_len: Optional[int] = None

    def __post_init__(self) -> None:
        check_choice("preprocessing.caption_cleaning", self.caption_cleaning, CAPTION_CLEANINGS)
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ConfigError(f"preprocessing: mean/std must be 3 values each, std > 0; got {self.mean}/{self.std}")


@dataclass(frozen=True)
class Preset:
    """One name. ``model``: its architecture, the ``model`` config section (nested dicts; unset
    fields: the defaults and the tower presets); ``preprocessing``: how its inputs are prepared;
    ``weights``: its released weights, ``None`` for an architecture (randomly initialised);
    ``about``: what it is, in a line."""

    name: str
    model: Mapping[str, Any]
    preprocessing: Preprocessing = field(default_factory=Preprocessing)
    weights: Optional[Weights] = None
    about: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise ConfigError(f"preset {self.name!r}: a name is letters, digits, '.', '_' and '-'")
        for tower, table in (("vision", VISION_PRESETS), ("text", TEXT_PRESETS)):
            section = self.model.get(tower, {})
            if "preset" in section:
                check_choice(f"preset {self.name}: model.{tower}.preset", section["preset"], table)


# ----------------------------------------------------------------------------- the registry

#: name -> preset, in registration order (:class:`vlp.registry.Registry`: ``PRESETS.get(name)``, an
#: unknown name one :class:`~vlp.registry.UnknownName` naming the known ones; ``name in PRESETS``;
#: ``PRESETS.register(name, preset)``; ``PRESETS.unregister(name)``)
PRESETS: Registry[Preset] = Registry("preset")


def list_presets(released: Optional[bool] = None) -> list[Preset]:
    """The registered presets in registration order; ``released``: only those with (``True``) or
    without (``False``) released weights."""
    return [p for _, p in PRESETS.items() if released is None or (p.weights is not None) == released]


# ----------------------------------------------------------------------------- vlp's presets

ALBEF_RELEASE = "https://storage.googleapis.com/sfr-pcl-data-research/ALBEF/"


def albef_release(
    name: str,
    url: str,
    kind: str,
    image_size: int,
    about: str,
    sha256: Optional[str] = None,
    size: Optional[int] = None,
) -> Preset:
    """A released official ALBEF checkpoint as a preset: ViT-B/16 at ``image_size`` px and BERT-base
    6 + 6 layers in ALBEF's tokenizer mode (``text.albef_compat``; vlp's NLVR model doubles the
    fusion layers, so an ``nlvr`` file has half as many configured), the weights converted from the
    ``kind`` layout at ``url``; VQA questions cleaned with ``pre_question``, answers cut at 10
    tokens (what a converted checkpoint's preprocessor says)."""
    text: dict[str, Any] = {"preset": "base", "init": "random", "albef_compat": True}
    if kind == NLVR:
        text["fusion_layers"] = TEXT_PRESETS["base"]["fusion_layers"] // 2
    weights = Weights(url, kind, sha256, size)  # a layout no kind converts from: one ConfigError
    entry = of_albef_format(kind)  # its text cleaning and whether answers are ranked from a list
    return Preset(
        name,
        {"vision": {"preset": "base", "img_size": image_size}, "text": text},
        Preprocessing(caption_cleaning=entry.text_cleaning, answer_max_len=10 if entry.candidate_answers else None),
        weights,
        about,
    )


def _register_vlp_presets() -> None:
    """The architectures (``vlp.list_models()``), then the ALBEF release (``vlp.list_pretrained()``,
    github.com/salesforce/ALBEF README, "Download"). Checksums and exact sizes are not published
    (ALBEF.pth: about 3.25 GiB, a third-party Content-Length reading); ALBEF released no SNLI-VE or
    fine-tuned NLVR2 weights."""
    for size, about in (
        ("tiny", "the demo's: ViT 4 layers at 64 px, BERT 2 + 2 layers of width 192"),
        ("small", "ViT-S/16 at 224 px, MiniLM-sized text 3 + 3 layers"),
        ("base", "ALBEF's: ViT-B/16 at 256 px, BERT-base 6 + 6 layers"),
    ):
        PRESETS.register(
            f"albef-{size}",
            Preset(f"albef-{size}", {"vision": {"preset": size}, "text": {"preset": size}}, about=about),
        )
    PRESETS.register(
        "dual-resnet18",
        Preset(
            "dual-resnet18",
            {"arch": "dual"},  # vlp.config.model.ARCH_DUAL: vlp.config.model imports this module
            about="the resource-constrained dual encoder: ResNet-18 and a bi-GRU (docs/methods.md)",
        ),
    )
    for name, file, kind, image_size, about in (
        ("albef-14m", "ALBEF.pth", PRETRAIN, 256, "pretrained on 14M image-text pairs"),
        ("albef-4m", "ALBEF_4M.pth", PRETRAIN, 256, "pretrained on 4M image-text pairs"),
        ("albef-retrieval-coco", "mscoco.pth", RETRIEVAL, 384, "fine-tuned for COCO retrieval"),
        ("albef-retrieval-flickr", "flickr30k.pth", RETRIEVAL, 384, "fine-tuned for Flickr30k retrieval"),
        ("albef-vqa", "vqa.pth", VQA, 384, "fine-tuned for VQA v2 (+ VG QA)"),
        (
            "albef-nlvr-ta",
            "pretrain_model_nlvr.pth",
            NLVR,
            256,
            "after NLVR2 text-assignment pretraining (vlp task nlvr-ta; fine-tune it on NLVR2)",
        ),
        # ALBEF's Grounding.py fine-tunes its retrieval model (models.model_retrieval.ALBEF) and
        # saves its state dict: the grounding checkpoint has the retrieval layout.
        (
            "albef-grounding-refcoco",
            "refcoco.pth",
            RETRIEVAL,
            384,
            "fine-tuned for weakly supervised grounding on RefCOCO+ (the retrieval layout; vlp evaluate grounding)",
        ),
    ):
        PRESETS.register(name, albef_release(name, ALBEF_RELEASE + file, kind, image_size, about))


_register_vlp_presets()
