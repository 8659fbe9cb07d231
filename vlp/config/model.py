"""Model configs: the ViT image tower, the BERT text tower (+ fusion), the dual encoder; the tower
presets that fill the towers' unset fields (:func:`vlp.config.load.resolved`) are the preset
registry's (:mod:`vlp.config.presets`, re-exported here), and :func:`preset_model_config` is the
model config of a registered preset."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional

from vlp.config.load import check_choice, from_dict
from vlp.config.presets import PRESETS, TEXT_PRESETS, VISION_PRESETS, Preset
from vlp.errors import ConfigError

# ----------------------------------------------------------------------------- model


@dataclass
class VisionConfig:
    """ViT image tower (timm). ``None`` fields are filled from the preset."""

    preset: str = "tiny"  # tiny | small | base
    arch: Optional[str] = None  # timm architecture name
    img_size: Optional[int] = None
    patch_size: Optional[int] = None
    width: Optional[int] = None
    depth: Optional[int] = None
    heads: Optional[int] = None
    mlp_ratio: float = 4.0
    drop_path: float = 0.0
    # None: random init. Otherwise a local weights file (.safetensors/.pth/.bin, open_clip .pt state
    # dict) or a timm hub tag such as "deit_base_patch16_224.fb_in1k" (needs network); the position
    # embedding is resized to img_size.
    pretrained: Optional[str] = None
    # What `pretrained` holds (docs/training.md, "Initialising the image tower"): none | timm | deit |
    # clip | open_clip. None: "timm" when pretrained is set, else "none". clip / open_clip build the
    # CLIP ViT layout (arch vit_base_patch16_clip_quickgelu_224 / vit_base_patch16_clip_224: pre-norm,
    # LayerNorm eps 1e-5, QuickGELU for clip); preset base matches ViT-B/16.
    init: Optional[str] = None
    # Tower keys the weights may lack (fnmatch patterns); any other missing key is an error.
    init_allow_missing: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_choice("model.vision.preset", self.preset, VISION_PRESETS)
        if self.init is not None:
            check_choice("model.vision.init", self.init, ["none", "timm", "deit", "clip", "open_clip"])
        if self.init == "none" and self.pretrained is not None:
            raise ConfigError(
                f"config keys 'model.vision.init'/'model.vision.pretrained': init=none loads no weights, "
                f"got pretrained={self.pretrained!r}"
            )


@dataclass
class TextConfig:
    """BERT text tower (transformers) + our fusion block. ``None`` fields come from the preset."""

    preset: str = "tiny"  # tiny | small | base
    hidden: Optional[int] = None
    layers: Optional[int] = None  # unimodal text layers
    fusion_layers: Optional[int] = None  # fusion layers (self-attn, cross-attn, FFN)
    heads: Optional[int] = None
    intermediate: Optional[int] = None
    # None: the preset's choice. "random": random init. "minilm": the offline all-MiniLM-L6-v2
    # package. Otherwise a hub name (bert-base-uncased) or a local BERT checkpoint directory.
    init: Optional[str] = None
    # Tokenizer directory or hub name; None uses the bert-base-uncased vocabulary shipped
    # with the offline MiniLM package.
    tokenizer: Optional[str] = None
    max_len: int = 30
    dropout: float = 0.1
    # ALBEF's forked tokenizer: a single text is encoded "[CLS] text" with NO trailing [SEP] (ALBEF#91,
    # albef.md §9). Set by `vlp convert albef`; the official checkpoints need it.
    albef_compat: bool = False

    def __post_init__(self) -> None:
        check_choice("model.text.preset", self.preset, TEXT_PRESETS)


@dataclass
class DualConfig:
    """Resource-constrained dual encoder (``model.arch: dual``): a timm CNN/ViT image tower and a
    GRU text tower, each with a bias-free 2-layer projection head, trained with the contrastive
    loss only - the spirit of the LTD paper's ResNet-50 + bi-GRU (docs/methods.md)."""

    image: str = "resnet18"  # any timm model name (random init unless image_pretrained)
    # Extra timm constructor arguments, e.g. {channels: [32, 64, 128, 256]} for a slim ResNet.
    image_kwargs: dict[str, Any] = field(default_factory=dict)
    image_pretrained: Optional[str] = None  # local weights file or timm hub tag
    img_size: int = 224
    word_dim: int = 300  # word embeddings (random init; the vocabulary is the tokenizer's)
    gru_hidden: int = 512  # per direction
    gru_layers: int = 1
    bidirectional: bool = True
    proj_hidden: int = 1024  # projection heads: feature -> proj_hidden -> embed_dim, no biases
    # BatchNorm1d(embed_dim) after each tower's projection head, before the L2 norm (the LTD
    # reference's triplet runs). Statistics per process (no SyncBatchNorm); off: no extra keys.
    batchnorm: bool = False

    def __post_init__(self) -> None:
        for key in ("img_size", "word_dim", "gru_hidden", "gru_layers", "proj_hidden"):
            if getattr(self, key) < 1:
                raise ConfigError(f"config key 'model.dual.{key}': got {getattr(self, key)}, expected >= 1")


#: the ``model.arch`` values: ALBEF (ViT + BERT + fusion: ITC / ITM / MLM) and the contrastive dual
#: encoder (its settings: ``model.dual``)
ARCH_ALBEF, ARCH_DUAL = "albef", "dual"
ARCHS: tuple[str, ...] = (ARCH_ALBEF, ARCH_DUAL)


@dataclass
class ModelConfig:
    # see ARCHS
    arch: str = ARCH_ALBEF
    vision: VisionConfig = field(default_factory=VisionConfig)
    text: TextConfig = field(default_factory=TextConfig)
    dual: DualConfig = field(default_factory=DualConfig)
    embed_dim: int = 256
    temp: float = 0.07
    queue_size: int = 65536
    momentum: float = 0.995
    # Linear ramp of the EMA momentum from 0 to `momentum` over these optimizer steps. 0 = ALBEF
    # (constant). From-scratch towers need it: a lagging twin of a random model gives collapsed
    # targets and queue entries, and ITC never starts (see docs/training.md).
    momentum_warmup_steps: int = 0

    def __post_init__(self) -> None:
        check_choice("model.arch", self.arch, ARCHS)


def preset_model_config(preset: Preset | str) -> ModelConfig:
    """The :class:`ModelConfig` of a registered preset (or its name in
    :data:`vlp.config.presets.PRESETS`), a fresh copy; :class:`ConfigError` naming the preset if its architecture is not a valid ``model``
    section."""
    entry = PRESETS.get(preset) if isinstance(preset, str) else preset
    try:
        return from_dict(ModelConfig, copy.deepcopy(dict(entry.model)))
    except ConfigError as e:
        raise ConfigError(f"preset {entry.name!r}: its architecture is not a valid model section: {e}") from None


def architecture_differences(want: ModelConfig, got: ModelConfig) -> list[str]:
    """How ``got``'s architecture differs from ``want``'s (a preset's): its ``arch`` and, for ALBEF,
    its tower presets (``vision.preset``, ``text.preset``), each as ``"key: got (the preset has
    want)"``; empty when they match (resolution, text length and the like may differ)."""
    pairs = [("arch", want.arch, got.arch)]
    if want.arch == ARCH_ALBEF:
        pairs += [("vision.preset", want.vision.preset, got.vision.preset)]
        pairs += [("text.preset", want.text.preset, got.text.preset)]
    return [f"{key}: {b!r} (the preset has {a!r})" for key, a, b in pairs if a != b]
