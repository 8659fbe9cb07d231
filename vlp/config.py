"""Typed run configuration: dataclass schema, YAML files and dotted command-line overrides.

A config is built as ``defaults <- YAML file <- overrides`` where overrides look like
``train.steps=50 model.vision.depth=2``. Unknown keys and wrong types raise
:class:`ConfigError` naming the offending key and where it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, TypeVar

import yaml
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
        _choice("model.vision.preset", self.preset, VISION_PRESETS)
        if self.init is not None:
            _choice("model.vision.init", self.init, ["none", "timm", "deit", "clip", "open_clip"])
        if self.init == "none" and self.pretrained is not None:
            raise ConfigError(f"config keys 'model.vision.init'/'model.vision.pretrained': init=none loads no weights, "
                              f"got pretrained={self.pretrained!r}")


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

    def __post_init__(self) -> None:
        for key in ("img_size", "word_dim", "gru_hidden", "gru_layers", "proj_hidden"):
            if getattr(self, key) < 1:
                raise ConfigError(f"config key 'model.dual.{key}': got {getattr(self, key)}, expected >= 1")


@dataclass
class ModelConfig:
    # albef: ViT + BERT + fusion (ITC/ITM/MLM). dual: contrastive dual encoder (model.dual).
    arch: str = "albef"
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
        _choice("model.arch", self.arch, ["albef", "dual"])


# ----------------------------------------------------------------------------- data


@dataclass
class ImageConfig:
    """Train-time augmentation (ALBEF §8). Test time is always Resize((res, res), bicubic)."""

    crop_scale: Optional[list[float]] = field(default_factory=lambda: [0.2, 1.0])  # None: no crop
    hflip: bool = True
    randaugment: bool = True
    mean: list[float] = field(default_factory=lambda: [0.48145466, 0.4578275, 0.40821073])
    std: list[float] = field(default_factory=lambda: [0.26862954, 0.26130258, 0.27577711])
    # Training loader ships uint8 images, normalised on the device (pretraining; evaluation
    # transforms always normalise in the loader).
    uint8: bool = False


@dataclass
class BadSampleConfig:
    """Samples whose image cannot be used at training time (docs/data.md, "Bad samples at training
    time"); the keys of both ``data`` sections (pretraining and fine-tuning). Evaluation data is
    never skipped: every image must load."""

    # skip: a bad sample (missing, unreadable, truncated or over max_image_pixels) is replaced by
    # another one drawn with the item's seed and counted (metrics.jsonl "bad_samples"); raise: the
    # first one stops the run, naming the entry, the file and the reason.
    on_bad_sample: str = "skip"  # skip | raise
    # skip only: a run stops (or is refused up front, for missing image files) when more than this
    # share of its samples is bad.
    max_bad_fraction: float = 0.05
    # Images with more pixels are bad samples (decompression-bomb guard, Pillow's limit); 0: no limit.
    max_image_pixels: int = 89_478_485
    # Images whose shorter side is below this are upscaled to it (bicubic, aspect kept) before the transforms.
    min_image_side: int = 16

    def check_bad_sample_keys(self) -> None:
        """Validate the keys above (called by the subclasses' ``__post_init__``)."""
        _choice("data.on_bad_sample", self.on_bad_sample, ["skip", "raise"])
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ConfigError(f"config key 'data.max_bad_fraction': got {self.max_bad_fraction}, expected 0 <= x <= 1")
        if self.max_image_pixels < 0:
            raise ConfigError(f"config key 'data.max_image_pixels': got {self.max_image_pixels}, expected >= 0 "
                              "(0: no limit)")
        if self.min_image_side < 1:
            raise ConfigError(f"config key 'data.min_image_side': got {self.min_image_side}, expected >= 1")


@dataclass
class DataConfig(BadSampleConfig):
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
    graded_relevance: Optional[str] = None  # captions x images .npy for nDCG (docs/data.md)
    # Captions drawn per image and step. 1: caption-level batches. k > 1: image-level batches of
    # B images x k captions (the ECIR SmoothAP protocol; model.arch=dual only).
    captions_per_image: int = 1
    # Text padding: to each batch's longest caption, or every batch to model.text.max_len (needed
    # across processes by loss.itm_negatives=global / loss.mlm_masking=global: a gather of text
    # needs the same shape on every rank). The losses are the same either way.
    text_padding: str = "longest"
    # json: data.train holds annotation files (map-style dataset). webdataset: data.train holds
    # shard folders written by `vlp make-shards` (streamed; docs/data.md, "Streaming shards").
    format: str = "json"  # json | webdataset
    # webdataset only: per-worker sample shuffle buffer, in items (held as undecoded bytes).
    shuffle_buffer: int = 1000
    # webdataset only: expand = one pair per caption (ALBEF's pair-level epoch); sample = one
    # random caption (or captions_per_image of them) per image and epoch.
    caption_mode: str = "expand"  # expand | sample

    def __post_init__(self) -> None:
        self.check_bad_sample_keys()
        if self.captions_per_image < 1:
            raise ConfigError(f"config key 'data.captions_per_image': got {self.captions_per_image}, expected >= 1")
        _choice("data.text_padding", self.text_padding, ["longest", "max_len"])
        _choice("data.format", self.format, ["json", "webdataset"])
        _choice("data.caption_mode", self.caption_mode, ["expand", "sample"])
        if self.shuffle_buffer < 1:
            raise ConfigError(f"config key 'data.shuffle_buffer': got {self.shuffle_buffer}, expected >= 1")
        if self.format == "webdataset" and self.captions_per_image > 1 and self.caption_mode != "sample":
            raise ConfigError(f"config key 'data.caption_mode': data.captions_per_image={self.captions_per_image} "
                              "needs image-level items; with data.format=webdataset set data.caption_mode=sample")


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


CONTRASTIVE_LOSSES = ("infonce", "triplet", "triplet_sh", "smoothap")


@dataclass
class ContrastiveConfig:
    """The contrastive term (docs/methods.md, loss zoo). ALBEF's ITC is InfoNCE with momentum
    distillation; the other losses take the same similarities and positives."""

    name: str = "infonce"  # infonce | triplet | triplet_sh | smoothap
    tau: Optional[float] = None  # InfoNCE temperature; None: the model's learned one (ALBEF)
    margin: float = 0.2  # triplet, triplet_sh
    smoothap_tau: float = 0.01  # sigmoid temperature of SmoothAP

    def __post_init__(self) -> None:
        _choice("loss.contrastive.name", self.name, CONTRASTIVE_LOSSES)
        if self.tau is not None and self.tau <= 0 or self.smoothap_tau <= 0:
            raise ConfigError(f"config keys 'loss.contrastive.tau'/'smoothap_tau': got {self.tau}/{self.smoothap_tau}, "
                              "expected > 0")


@dataclass
class MultiplierConfig:
    """The Lagrange multiplier of LTD's constraint: SGD ascent, projected into [0, max]."""

    init: float = 1.0
    lr: float = 5e-3
    momentum: float = 0.9
    dampening: float = 0.9
    max: float = 100.0
    # Reproduce the reference: clamp only the value used (straight-through), never the parameter.
    straight_through: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.init <= self.max or self.lr <= 0:
            raise ConfigError(f"config keys 'loss.ltd.multiplier.init'/'max'/'lr': got {self.init}/{self.max}/{self.lr}, "
                              "expected 0 <= init <= max and lr > 0")


@dataclass
class LTDConfig:
    """Latent target decoding (and its ITD baseline) on the text embedding (docs/methods.md)."""

    mode: str = "off"  # off | constraint (L_con + lambda (L_rec / eta - 1)) | dual (L_con + beta L_rec)
    decoder: str = "latent"  # latent: MLP -> sentence-encoder target (LTD); tokens: GRU -> caption (ITD)
    eta: float = 0.2  # constraint bound on L_rec (LTD cosine scale; ITD uses 0.5-6)
    beta: float = 1.0  # dual-mode weight
    hidden: int = 1024  # LTD decoder hidden size
    targets: Optional[str] = None  # file from `vlp make-targets` (decoder=latent)
    encoder: Optional[str] = None  # if set, the targets file must come from this encoder
    multiplier: MultiplierConfig = field(default_factory=MultiplierConfig)
    itd_word_dim: int = 300
    # Reproduce the reference ITD bug: log-softmax over the time axis (padding included).
    itd_time_axis_bug: bool = False

    def __post_init__(self) -> None:
        _choice("loss.ltd.mode", self.mode, ["off", "constraint", "dual"])
        _choice("loss.ltd.decoder", self.decoder, ["latent", "tokens"])
        if self.eta <= 0:
            raise ConfigError(f"config key 'loss.ltd.eta': got {self.eta}, expected > 0 (the bound divides L_rec)")
        if self.beta < 0 or self.hidden < 1:
            raise ConfigError(f"config keys 'loss.ltd.beta'/'hidden': got {self.beta}/{self.hidden}, expected >= 0 / >= 1")


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
    # The in-batch part of the ITC bank: this rank's momentum features (ALBEF) or every rank's
    # ("global": the loss no longer depends on how the global batch is split across processes).
    itc_bank: str = "local"
    # Where ITM hard negatives come from: this rank's batch (ALBEF) or the global batch ("global":
    # text states and image tokens gathered with gradient, negatives drawn identically on every rank,
    # the loss normalised by the global pair count). Across processes it needs data.text_padding=max_len.
    itm_negatives: str = "local"
    # MLM masks: drawn per rank and averaged per rank (ALBEF), or "global": drawn for the global batch
    # identically on every rank and normalised by the global masked-token count. Needs
    # data.text_padding=max_len across processes. Both global modes: the run equals one process
    # with the global batch (docs/training.md, Multi-process).
    mlm_masking: str = "local"
    mlm_probability: float = 0.15
    # ITC regulation: none (ALBEF), srcl (weighted negatives) or removal (ALBEF++: drop negatives
    # whose SRCL weight is below loss.srcl.threshold).
    regulation: str = "none"
    srcl: SRCLConfig = field(default_factory=SRCLConfig)
    contrastive: ContrastiveConfig = field(default_factory=ContrastiveConfig)
    ltd: LTDConfig = field(default_factory=LTDConfig)

    def __post_init__(self) -> None:
        _choice("loss.itc_positives", self.itc_positives, ["pair", "image"])
        _choice("loss.regulation", self.regulation, ["none", "srcl", "removal"])
        _choice("loss.itc_bank", self.itc_bank, ["local", "global"])
        _choice("loss.itm_negatives", self.itm_negatives, ["local", "global"])
        _choice("loss.mlm_masking", self.mlm_masking, ["local", "global"])
        if self.itc_bank == "global" and self.regulation != "none":
            raise ConfigError(f"config keys 'loss.itc_bank'/'loss.regulation': itc_bank=global with regulation="
                              f"{self.regulation} is not supported (SRCL weights a per-rank bank); use itc_bank=local")
        if not 0.0 <= self.mlm_probability <= 1.0:
            raise ConfigError(f"config key 'loss.mlm_probability': got {self.mlm_probability}, expected [0, 1]")


@dataclass
class AverageConfig:
    """Checkpoint averaging (SWA as in the LTD paper): equal-weight mean of ``snapshots`` copies
    of the trainable weights taken evenly over the last ``fraction`` of the run (or of each epoch)."""

    snapshots: int = 0  # 0: off
    fraction: float = 0.1
    # Per epoch (the LTD reference): average the last fraction of every epoch and continue
    # training from the average. Otherwise once, at the end of the run.
    per_epoch: bool = False

    def __post_init__(self) -> None:
        if self.snapshots < 0 or not 0.0 < self.fraction <= 1.0:
            raise ConfigError(f"config keys 'train.average.snapshots'/'fraction': got {self.snapshots}/{self.fraction}, "
                              "expected >= 0 and (0, 1]")


@dataclass
class TrainConfig:
    steps: int = 1000
    # Fine-tuning: run this many passes over the training data instead (steps = epochs x batches
    # per epoch; warm-up and the alpha ramp stay in steps).
    epochs: Optional[int] = None
    lr: float = 1e-4
    # Per-module multipliers of the scheduled lr: module path (dotted components of the parameter
    # names, e.g. "vision", "model.vision", "text") -> factor; the longest matching path wins.
    # SRCL's recipe: {vision: 0.1} (ViT 1e-5, BERT 1e-4).
    lr_scale: dict[str, float] = field(default_factory=dict)
    min_lr: float = 1e-5
    warmup_steps: int = 100
    warmup_lr: float = 1e-5
    weight_decay: float = 0.02
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: Optional[float] = None
    precision: str = "fp32"  # fp32 | bf16 (autocast; momentum, queues stay fp32)
    # fp32 matmuls and convolutions in TF32 on CUDA (Ampere and later: ~2x fp32 matmul throughput,
    # 10-bit mantissa inputs, fp32 accumulation); no effect on CPU or on bf16 autocast regions.
    tf32: bool = True
    # Process-group timeout: how long a collective may wait for the slowest rank before the job is
    # killed (NCCL's default is 10 min; validation at COCO size, checkpoint writes or a slow first
    # compile on one rank can exceed it).
    dist_timeout_minutes: float = 60.0
    seed: int = 42
    log_every: int = 10
    ckpt_every: int = 0  # 0: only at the end
    # Recompute the activations of the ViT blocks, text layers and fusion layers in the backward
    # pass instead of keeping them (non-reentrant checkpointing): less memory, one more forward.
    grad_checkpointing: bool = False
    # Batches whose gradients are summed (each loss / this) before one optimizer step. Each
    # micro-batch draws its ITC in-batch negatives and ITM hard negatives from itself; the queue
    # receives every micro-batch (docs/training.md, "Gradient accumulation").
    grad_accum_steps: int = 1
    # torch.compile each transformer block (ViT blocks, text layers, fusion layers; the momentum
    # twins' too) - regional compilation: one compiled graph per block type, reused by every layer.
    compile: bool = False
    compile_backend: str = "inductor"  # any torch.compile backend ("eager": capture only, no codegen)
    # With every checkpoint, the training state (optimizer, task tensors outside the model, RNG
    # states of every rank; JSON + safetensors, no pickle) in checkpoints/step_N/train_state/,
    # which train.resume continues from.
    save_state: bool = True
    # Keep only the newest N step checkpoints (0: keep all; `best` is never deleted). Keep >= 2 so
    # that train.resume=auto can fall back past a corrupted newest one.
    keep_last: int = 0
    # A step whose loss or gradient is not finite is skipped (no update; logged with its step);
    # this many consecutive ones save a checkpoint and stop the run with an error.
    max_nonfinite_steps: int = 5
    resume: Optional[str] = None  # a checkpoint folder or run directory, or "auto": this run's newest
    progress: bool = True
    average: AverageConfig = field(default_factory=AverageConfig)
    # Extra metric sinks next to metrics.jsonl (always written): tensorboard (RUN/tb/), wandb.
    loggers: list[str] = field(default_factory=list)
    wandb_project: Optional[str] = None  # None: "vlp"

    def __post_init__(self) -> None:
        _choice("train.precision", self.precision, ["fp32", "bf16"])
        for name in self.loggers:
            _choice("train.loggers", name, ["tensorboard", "wandb"])
        if self.steps < 1:
            raise ConfigError(f"config key 'train.steps': got {self.steps}, expected >= 1")
        for path, scale in self.lr_scale.items():
            if not scale > 0:
                raise ConfigError(f"config key 'train.lr_scale.{path}': got {scale}, expected a factor > 0")
        if self.grad_accum_steps < 1:
            raise ConfigError(f"config key 'train.grad_accum_steps': got {self.grad_accum_steps}, expected >= 1")
        if self.epochs is not None and self.epochs < 1:
            raise ConfigError(f"config key 'train.epochs': got {self.epochs}, expected >= 1 or null")
        if self.dist_timeout_minutes <= 0:
            raise ConfigError(f"config key 'train.dist_timeout_minutes': got {self.dist_timeout_minutes}, expected > 0")
        if self.keep_last < 0 or self.max_nonfinite_steps < 1:
            raise ConfigError(f"config keys 'train.keep_last'/'train.max_nonfinite_steps': got {self.keep_last}/"
                              f"{self.max_nonfinite_steps}, expected >= 0 / >= 1")
        if self.resume and self.average.snapshots:
            raise ConfigError("config keys 'train.resume'/'train.average.snapshots': resuming a run that averages "
                              "weights is not supported (the snapshots taken before the checkpoint are not saved)")


@dataclass
class EvalConfig:
    k_test: int = 128  # candidates re-ranked by the ITM head per query
    # itm: ITM match logit only (ALBEF). itm+itc: ITM logit + ITC cosine (LAVIS/BLIP). itc: no re-rank.
    score: str = "itm"
    batch_size: int = 128  # images / captions per encoder batch
    itm_batch_size: Optional[int] = None  # (image, caption) pairs per fusion batch; None: eval.batch_size
    # auto | fp32 | bf16: autocast for encoders and ITM, ITM inputs kept in that dtype; similarities
    # and metrics in fp32/fp64. auto: bf16 on CUDA, fp32 elsewhere.
    precision: str = "auto"
    num_workers: Optional[int] = None  # image-decoding loader workers of evaluation; None: min(4, CPU cores)
    # where the ITM inputs wait between encoding and re-ranking: none (on the device) | images (image
    # tokens in host memory, pinned on CUDA, each batch's images copied over) | all (text states too).
    # auto: images on CUDA, none elsewhere.
    offload: str = "auto"

    def __post_init__(self) -> None:
        _choice("eval.score", self.score, ["itm", "itm+itc", "itc"])
        _choice("eval.precision", self.precision, ["auto", "fp32", "bf16"])
        _choice("eval.offload", self.offload, ["auto", "none", "images", "all"])
        if self.k_test < 1:
            raise ConfigError(f"config key 'eval.k_test': got {self.k_test}, expected >= 1")
        for key in ("batch_size", "itm_batch_size"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"config key 'eval.{key}': got {value}, expected >= 1")
        if self.num_workers is not None and self.num_workers < 0:
            raise ConfigError(f"config key 'eval.num_workers': got {self.num_workers}, expected >= 0 (or null: automatic)")

    @property
    def pair_batch(self) -> int:
        """Pairs per fusion batch: ``itm_batch_size``, or ``batch_size`` when it is unset."""
        return self.itm_batch_size or self.batch_size

    def resolved_precision(self, device: Any) -> str:
        """``fp32`` or ``bf16``: ``precision``, with ``auto`` = bf16 on a CUDA device, else fp32."""
        if self.precision != "auto":
            return self.precision
        return "bf16" if getattr(device, "type", str(device)) == "cuda" else "fp32"

    def resolved_offload(self, device: Any) -> str:
        """``none``, ``images`` or ``all``: ``offload``, with ``auto`` = images on a CUDA device, else none."""
        if self.offload != "auto":
            return self.offload
        return "images" if getattr(device, "type", str(device)) == "cuda" else "none"

    def resolved_workers(self) -> int:
        """Loader workers: ``num_workers``, or min(4, the CPU cores this process may use)."""
        import os

        if self.num_workers is not None:
            return self.num_workers
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return min(4, cores)


@dataclass
class PretrainConfig:
    output_dir: str = "runs/pretrain"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        """Cross-section rules; each names the keys to change."""
        c, arch = self.loss, self.model.arch
        wrong: list[str] = []
        if arch == "dual":
            wrong += [f"loss.{k}={getattr(c, k)} (the dual encoder has no fusion, ITM or MLM)" for k in ("itm", "mlm")
                      if getattr(c, k) != 0]
            wrong += ["loss.distill=true (the dual encoder has no momentum twin)"] if c.distill else []
            wrong += [f"eval.score={self.eval.score} (no ITM head: use itc)"] if self.eval.score != "itc" else []
            if c.contrastive.name == "infonce" and c.contrastive.tau is None:
                wrong.append("loss.contrastive.tau unset (the dual encoder has no learned temperature; LTD uses 0.05)")
        elif self.data.captions_per_image > 1:
            wrong.append(f"data.captions_per_image={self.data.captions_per_image} (image-level batches need model.arch=dual)")
        if c.regulation != "none" and (arch == "dual" or c.contrastive.name != "infonce"):
            wrong.append(f"loss.regulation={c.regulation} (SRCL regulates ALBEF's InfoNCE ITC only)")
        if arch == "albef" and c.contrastive.name != "infonce" and c.distill:
            wrong.append(f"loss.distill=true (momentum distillation applies to InfoNCE, not {c.contrastive.name})")
        if c.ltd.mode != "off" and c.ltd.decoder == "latent" and not c.ltd.targets:
            wrong.append("loss.ltd.targets unset (LTD needs a file from `vlp make-targets`)")
        if wrong:
            raise ConfigError("config keys: " + "; ".join(wrong))


# ----------------------------------------------------------------------------- fine-tuning

FINETUNE_TASKS = ("retrieval", "vqa", "nlvr2", "nlvr-ta")


@dataclass
class FinetuneDataConfig(BadSampleConfig):
    """Downstream data (docs/data.md): annotation files in the ALBEF formats; the bad-sample keys
    (:class:`BadSampleConfig`) apply to the training split."""

    # retrieval: Karpathy train files (one entry per caption, with image_id); vqa: VQA v2 / VG-QA
    # question files; nlvr2: nlvr_train.json; nlvr-ta: pretraining files.
    train: list[str] = field(default_factory=list)
    val: Optional[str] = None  # validated after every epoch; the best checkpoint is kept
    test: Optional[str] = None  # evaluated once at the end with the best checkpoint
    image_root: Optional[str] = None  # relative image paths (default: each file's folder)
    vg_root: Optional[str] = None  # VQA: images of "dataset": "vg" entries (default: image_root)
    answer_list: Optional[str] = None  # VQA: candidate answers (JSON list of strings)
    batch_size: int = 32
    eval_batch_size: int = 64
    num_workers: int = 0
    image: ImageConfig = field(default_factory=lambda: ImageConfig(crop_scale=[0.5, 1.0]))
    max_len: int = 30  # text tokens (retrieval 30, VQA questions 25, NLVR2 sentences 40)
    # Retrieval / NLVR2-TA captions: pad to each batch's longest or to max_len (see DataConfig).
    text_padding: str = "longest"

    def __post_init__(self) -> None:
        self.check_bad_sample_keys()
        _choice("data.text_padding", self.text_padding, ["longest", "max_len"])


@dataclass
class VQAConfig:
    k_test: int = 128  # candidates re-scored by their full-sequence likelihood
    answer_max_len: int = 10

    def __post_init__(self) -> None:
        if self.k_test < 1 or self.answer_max_len < 3:
            raise ConfigError(f"config keys 'vqa.k_test'/'vqa.answer_max_len': got {self.k_test}/{self.answer_max_len}, "
                              "expected >= 1 / >= 3")


@dataclass
class NLVRConfig:
    flip: bool = False  # left/right flip augmentation: swap the images and the words left/right (LAVIS)
    # Baseline: every image replaced by a constant, so the model sees only the sentence.
    text_only: bool = False


@dataclass
class FinetuneConfig:
    """``vlp finetune retrieval|vqa|nlvr2`` and ``vlp pretrain nlvr-ta``. The model is the
    ``pretrained`` checkpoint's architecture (its config), changed only by ``image_size`` (the
    position embedding is interpolated) and ``model_overrides``."""

    task: str = "retrieval"
    output_dir: str = "runs/finetune"
    pretrained: Optional[str] = None  # vlp checkpoint folder or run directory
    image_size: Optional[int] = None  # fine-tuning resolution; None: the checkpoint's
    model_overrides: list[str] = field(default_factory=list)  # dotted model keys, e.g. [queue_size=0]
    data: FinetuneDataConfig = field(default_factory=FinetuneDataConfig)
    # Retrieval: ITC with positives by image id (+ queue of ids) + ITM; loss.alpha / distill /
    # alpha_ramp_steps also drive VQA and NLVR2 distillation.
    loss: LossConfig = field(default_factory=lambda: LossConfig(mlm=0.0, itc_positives="image"))
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    vqa: VQAConfig = field(default_factory=VQAConfig)
    nlvr: NLVRConfig = field(default_factory=NLVRConfig)
    eval_every: int = 0  # optimizer steps between validations; 0: once per epoch

    def __post_init__(self) -> None:
        _choice("task", self.task, FINETUNE_TASKS)
        wrong: list[str] = []
        if self.task == "retrieval":
            wrong += [f"loss.mlm={self.loss.mlm} (the retrieval model has no MLM head)"] if self.loss.mlm else []
            wrong += [f"loss.itc_positives={self.loss.itc_positives} (retrieval positives are by image id: image)"] \
                if self.loss.itc_positives != "image" else []
        if self.loss.regulation != "none" and self.task != "retrieval":
            wrong.append(f"loss.regulation={self.loss.regulation} (SRCL regulates ITC: retrieval only)")
        if self.image_size is not None and self.image_size < 1:
            wrong.append(f"image_size={self.image_size} (expected >= 1 or null)")
        if self.eval_every < 0:
            wrong.append(f"eval_every={self.eval_every} (expected >= 0)")
        if self.data.image.uint8:
            wrong.append("data.image.uint8=true (uint8 images normalised on the device: pretraining only)")
        if wrong:
            raise ConfigError("config keys: " + "; ".join(wrong))


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
    except (OmegaConfBaseException, yaml.YAMLError) as e:
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
