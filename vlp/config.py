"""Typed run configuration: dataclass schema, YAML files and dotted command-line overrides.

A config is built as ``defaults <- YAML file <- overrides`` where overrides look like
``train.steps=50 model.vision.depth=2``. Unknown keys and wrong types raise
:class:`ConfigError` naming the offending key and where it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")


class ConfigError(ValueError):
    """A user mistake in a config file or an override; the message names the key."""


def _choice(key: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ConfigError(f"config key '{key}': got {value!r}, expected one of {list(allowed)}")


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
    # None: random init. Otherwise a local weights file (.safetensors/.pth/.bin) or a timm hub tag
    # such as "deit_base_patch16_224.fb_in1k"; the position embedding is resized to img_size.
    pretrained: Optional[str] = None

    def __post_init__(self) -> None:
        _choice("model.vision.preset", self.preset, VISION_PRESETS)


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

    def __post_init__(self) -> None:
        _choice("model.text.preset", self.preset, TEXT_PRESETS)


VISION_PRESETS: dict[str, dict[str, Any]] = {
    # CPU-sized: 64 px, 8 px patches -> 64 patch tokens + CLS.
    "tiny": dict(arch="vit_tiny_patch16_224", img_size=64, patch_size=8, width=192, depth=4, heads=3),
    "small": dict(arch="vit_small_patch16_224", img_size=224, patch_size=16, width=384, depth=12, heads=6),
    # ALBEF: ViT-B/16 at 256 px, DeiT-B initialisation.
    "base": dict(arch="vit_base_patch16_224", img_size=256, patch_size=16, width=768, depth=12, heads=12),
}

TEXT_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden=192, layers=2, fusion_layers=2, heads=4, intermediate=768, init="random"),
    # all-MiniLM-L6-v2: layers 0-2 -> text tower, layers 3-5 -> fusion block (new cross-attention).
    "small": dict(hidden=384, layers=3, fusion_layers=3, heads=12, intermediate=1536, init="minilm"),
    # ALBEF: bert-base-uncased, layers 0-5 text, 6-11 fusion.
    "base": dict(hidden=768, layers=6, fusion_layers=6, heads=12, intermediate=3072, init="bert-base-uncased"),
}


@dataclass
class ModelConfig:
    vision: VisionConfig = field(default_factory=VisionConfig)
    text: TextConfig = field(default_factory=TextConfig)
    embed_dim: int = 256
    temp: float = 0.07
    queue_size: int = 65536
    momentum: float = 0.995
    # Linear ramp of the EMA momentum from 0 to `momentum` over these optimizer steps. 0 = ALBEF
    # (constant). From-scratch towers need it: a lagging twin of a random model gives collapsed
    # targets and queue entries, and ITC never starts (see docs/training.md).
    momentum_warmup_steps: int = 0


# ----------------------------------------------------------------------------- data


@dataclass
class ImageConfig:
    """Train-time augmentation (ALBEF §8). Test time is always Resize((res, res), bicubic)."""

    crop_scale: Optional[list[float]] = field(default_factory=lambda: [0.2, 1.0])  # None: no crop
    hflip: bool = True
    randaugment: bool = True
    mean: list[float] = field(default_factory=lambda: [0.48145466, 0.4578275, 0.40821073])
    std: list[float] = field(default_factory=lambda: [0.26862954, 0.26130258, 0.27577711])


@dataclass
class DataConfig:
    # Annotation files (ALBEF pretraining format, or Karpathy retrieval-train format).
    train: list[str] = field(default_factory=list)
    # Directory that relative image paths are resolved against; None: each file's directory.
    image_root: Optional[str] = None
    batch_size: int = 64
    num_workers: int = 0
    image: ImageConfig = field(default_factory=ImageConfig)
    # Optional zero-shot retrieval evaluation after training (Karpathy val/test format).
    eval: Optional[str] = None
    relevance: Optional[str] = None


# ----------------------------------------------------------------------------- losses, training, eval


@dataclass
class SRCLConfig:
    """Similarity-regulated ITC (docs/methods.md): per-negative weights from a frozen helper's and
    the live model's cross-modal similarity. Used when ``loss.regulation`` is ``srcl`` or ``removal``."""

    # Norm over each anchor's negatives: softmax (scaled to mean 1; delta = sharpness) or mean.
    norm: str = "softmax"
    # Sharpness of the softmax norm, calibrated on the paper's statistics (docs/methods.md).
    delta: float = 1.0
    tau_w: float = 1.0  # temperature inside s = exp(cos / tau_w); the paper has none (1.0)
    # alpha_h (helper share) falls linearly 1 -> 0 over these optimizer steps; None: the whole run.
    helper_span: Optional[int] = None
    # Removal variant (ALBEF++): negatives with weight < threshold are dropped from the contrast.
    threshold: float = 0.2
    # Removal variant: keep SRCL weights on the surviving negatives (renormalised to mean 1)
    # instead of leaving them unweighted (the paper's ALBEF++).
    removal_reweight: bool = False
    # Where helper features come from (one of the two while alpha_h > 0):
    helper_features: Optional[str] = None  # cache folder from `vlp cache-helper-features` (no helper tax)
    helper: Optional[str] = None  # helper checkpoint run live on each batch (augmented inputs)

    def __post_init__(self) -> None:
        _choice("loss.srcl.norm", self.norm, ["softmax", "mean"])
        if self.delta < 0 or self.tau_w <= 0:
            raise ConfigError(f"config keys 'loss.srcl.delta'/'loss.srcl.tau_w': got {self.delta}/{self.tau_w}, "
                              "expected delta >= 0 and tau_w > 0")
        if self.helper_span is not None and self.helper_span < 0:
            raise ConfigError(f"config key 'loss.srcl.helper_span': got {self.helper_span}, expected >= 0 or null")


@dataclass
class LossConfig:
    itc: float = 1.0
    itm: float = 1.0
    mlm: float = 1.0
    distill: bool = True
    alpha: float = 0.4  # momentum-distillation weight
    alpha_ramp_steps: int = 1000  # alpha ramps linearly from 0 over these steps (ALBEF: epoch 0)
    # Which bank columns are ITC positives: the own pair (ALBEF pretraining) or every entry with
    # the same image id (ALBEF retrieval fine-tuning).
    itc_positives: str = "pair"
    mlm_probability: float = 0.15
    # ITC regulation: none (ALBEF), srcl (weighted negatives) or removal (ALBEF++: drop negatives
    # whose SRCL weight is below loss.srcl.threshold).
    regulation: str = "none"
    srcl: SRCLConfig = field(default_factory=SRCLConfig)

    def __post_init__(self) -> None:
        _choice("loss.itc_positives", self.itc_positives, ["pair", "image"])
        _choice("loss.regulation", self.regulation, ["none", "srcl", "removal"])
        if not 0.0 <= self.mlm_probability <= 1.0:
            raise ConfigError(f"config key 'loss.mlm_probability': got {self.mlm_probability}, expected [0, 1]")


@dataclass
class TrainConfig:
    steps: int = 1000
    lr: float = 1e-4
    min_lr: float = 1e-5
    warmup_steps: int = 100
    warmup_lr: float = 1e-5
    weight_decay: float = 0.02
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: Optional[float] = None
    precision: str = "fp32"  # fp32 | bf16 (autocast; momentum, queues stay fp32)
    seed: int = 42
    log_every: int = 10
    ckpt_every: int = 0  # 0: only at the end
    progress: bool = True

    def __post_init__(self) -> None:
        _choice("train.precision", self.precision, ["fp32", "bf16"])
        if self.steps < 1:
            raise ConfigError(f"config key 'train.steps': got {self.steps}, expected >= 1")


@dataclass
class EvalConfig:
    k_test: int = 128  # candidates re-ranked by the ITM head per query
    # itm: ITM match logit only (ALBEF). itm+itc: ITM logit + ITC cosine (LAVIS/BLIP). itc: no re-rank.
    score: str = "itm"
    batch_size: int = 128

    def __post_init__(self) -> None:
        _choice("eval.score", self.score, ["itm", "itm+itc", "itc"])
        if self.k_test < 1:
            raise ConfigError(f"config key 'eval.k_test': got {self.k_test}, expected >= 1")


@dataclass
class PretrainConfig:
    output_dir: str = "runs/pretrain"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


# ----------------------------------------------------------------------------- loading


def _merge(base: Any, other: Any, source: str) -> Any:
    try:
        return OmegaConf.merge(base, other)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        reason = str(e).splitlines()[0]
        raise ConfigError(f"{source}: config key '{key}': {reason}") from None


def _parse_overrides(overrides: Sequence[str]) -> Any:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"command-line override {item!r}: expected key=value, e.g. train.steps=50")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as e:
        raise ConfigError(f"command-line overrides: {str(e).splitlines()[0]}") from None


def load_config(schema: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Build a ``schema`` instance from defaults, an optional YAML file and dotted overrides."""
    cfg = OmegaConf.structured(schema)
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = OmegaConf.load(path)
        except Exception as e:  # yaml.YAMLError and friends
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        cfg = _merge(cfg, data, str(path))
    if overrides:
        cfg = _merge(cfg, _parse_overrides(overrides), "command-line override")
    try:
        return OmegaConf.to_object(cfg)  # type: ignore[return-value]
    except ConfigError:
        raise
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise ConfigError(f"config key '{key}': {str(e).splitlines()[0]}") from None


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML (what is written to ``run_dir/config.yaml``)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_dict(schema: type[T], data: dict) -> T:
    """Rebuild a config object from a plain dict (e.g. read back from a checkpoint)."""
    return OmegaConf.to_object(_merge(OmegaConf.structured(schema), OmegaConf.create(data), "saved config"))


def apply_overrides(cfg: T, overrides: Sequence[str]) -> T:
    """A copy of the config object ``cfg`` with dotted overrides applied (same checks as loading)."""
    if not overrides:
        return cfg
    merged = _merge(OmegaConf.structured(cfg), _parse_overrides(overrides), "command-line override")
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


def to_dict(cfg: Any) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))  # type: ignore[return-value]


def resolved(cfg: Any, presets: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Fill the ``None`` fields of a vision/text config from its preset."""
    out = dict(presets[cfg.preset])
    for k, v in vars(cfg).items():
        if v is not None or k not in out:
            out[k] = v
    return out
