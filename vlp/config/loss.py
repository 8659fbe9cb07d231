"""Loss configs: ITC/ITM/MLM weights and modes, the contrastive loss zoo, SRCL regulation, LTD/ITD
reconstruction and its Lagrange multiplier."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol

from vlp.config.load import SAVED_MIGRATIONS, USER_CHECKS, check_choice
from vlp.errors import ConfigError

#: ``loss.srcl.helper_init`` / ``--helper-init``: how the SRCL helper got its weights
HELPER_INITS = ("pretrained", "random")


@dataclass
class SRCLConfig:
    """Similarity-regulated ITC (docs/methods.md): per-negative weights from a frozen helper's and
    the live model's cross-modal similarity. Used when ``loss.regulation`` is ``srcl`` or ``removal``."""

    # Norm over each anchor's negatives: softmax (scaled to mean 1; delta = sharpness; vlp's
    # reinterpretation of the paper's Eq. 9, whose mean Norm as written cancels delta) or mean
    # (w = u / mean(u), u = 1/s: delta cancels, and no weight falls below exp(-1/tau_w) / mean(u),
    # about 0.4-0.5 for negatives at cosines 0.1-0.3, so mean cannot reach the paper's example 0.12).
    norm: str = "softmax"
    # Sharpness of the softmax norm. No default: the weights a delta gives depend on the helper's
    # cosines, the batch and the queue (in a simulated row, delta 1 leaves false negatives at
    # 0.72-0.81, nearly ALBEF), so a softmax-norm run refuses to start until it is calibrated:
    # `vlp analyze helper --cache HELPER_FEATURES --data TRAIN.json --batch-size B --queue Q --out DIR`
    # prints the line to paste (docs/methods.md, "Calibrating delta").
    delta: Optional[float] = None
    tau_w: float = 1.0  # temperature inside s = exp(cos / tau_w); the paper has none (1.0)
    # alpha_h (helper share) falls linearly 1 -> alpha_h_end over these optimizer steps; None: the whole run.
    helper_span: Optional[int] = None
    # alpha_h after the span (a floor): 0 = the paper's fade-out; 1 = the helper alone all run (an oracle).
    alpha_h_end: float = 0.0
    # Momentum distillation: False = weights only in the student's logits (ALBEF/paper); True = the
    # soft targets also come from the weighted momentum logits (docs/methods.md: the optimum shift).
    weight_targets: bool = False
    # Removal variant (ALBEF++): negatives with weight < threshold are dropped from the contrast.
    threshold: float = 0.2
    # Removal variant: keep SRCL weights on the surviving negatives (renormalised to mean 1)
    # instead of leaving them unweighted (the paper's ALBEF++).
    removal_reweight: bool = False
    # Where helper features come from (one of the two while alpha_h > 0):
    helper_features: Optional[str] = None  # cache folder from `vlp cache-helper-features` (no helper tax)
    # A vlp helper checkpoint run live on each batch (augmented inputs), or a frozen open_clip model
    # open_clip:ARCH/PRETRAINED: that one cannot run live (the batch carries BERT token ids and
    # vlp-transformed images), so it is cached once into <output_dir>/helper_features_open_clip,
    # unless helper_features names a cache of it (`vlp cache-helper-features`, before calibrating delta).
    helper: Optional[str] = None
    # How the helper got its weights: "pretrained" (an open_clip tag or weights file, a vlp checkpoint)
    # or "random", the opt-in for an open_clip:ARCH with no weights (tests only: a random helper
    # weights negatives by noise). Refused either way round: weights given with random, none without.
    helper_init: str = "pretrained"

    def __post_init__(self) -> None:
        check_choice("loss.srcl.norm", self.norm, ["softmax", "mean"])
        check_choice("loss.srcl.helper_init", self.helper_init, HELPER_INITS)
        if self.delta is not None and self.delta < 0 or self.tau_w <= 0:
            raise ConfigError(
                f"config keys 'loss.srcl.delta'/'loss.srcl.tau_w': got {self.delta}/{self.tau_w}, "
                "expected delta >= 0 and tau_w > 0"
            )
        if self.helper_span is not None and self.helper_span < 0:
            raise ConfigError(f"config key 'loss.srcl.helper_span': got {self.helper_span}, expected >= 0 or null")
        if not 0.0 <= self.alpha_h_end <= 1.0:
            raise ConfigError(
                f"config key 'loss.srcl.alpha_h_end': got {self.alpha_h_end}, expected a number in [0, 1]"
            )

    def require_delta(self, regulation: str) -> None:
        """A run with ``loss.regulation`` ``srcl`` or ``removal`` in softmax norm needs
        ``loss.srcl.delta``: one :class:`ConfigError` naming the key and the calibration command."""
        if regulation != "none" and self.norm == "softmax" and self.delta is None:
            raise ConfigError(
                f"config key 'loss.srcl.delta' is not set, and loss.regulation={regulation} needs it: no default "
                "suits every helper (in a simulated row of 65,600 negatives at cosines 0.1-0.3, delta 1 gives false "
                "negatives at cosines 0.5-0.7 weights of 0.72-0.81, nearly plain ITC). "
                "Calibrate it on the features of the model that computes the weights, at the run's batch and "
                "queue size: `vlp analyze helper --cache HELPER_FEATURES --data TRAIN.json --batch-size B "
                "--queue Q --out DIR` (a vlp or open_clip helper: `vlp cache-helper-features` first) prints "
                "the line to pass, loss.srcl.delta=VALUE (docs/methods.md, 'Calibrating delta')"
            )


class LossTraits(Protocol):
    """What the cross-section rules need to know of a contrastive loss (its class's flags,
    :class:`vlp.losses.protocol.ContrastiveLoss`)."""

    @property
    def uses_tau(self) -> bool:
        """Takes the temperature (a fixed loss.contrastive.tau or the model's learned one)."""
        ...

    @property
    def log_weights(self) -> bool:
        """Takes per-negative log-weights (SRCL, loss.regulation)."""
        ...

    @property
    def soft_targets(self) -> bool:
        """Takes soft targets (momentum distillation, loss.distill)."""
        ...


#: The losses' own check, installed by :mod:`vlp.losses.registry` when it is imported (the config
#: layer cannot import the losses): ``check(config)`` returns the built loss, or raises ConfigError
#: for an unknown ``loss.contrastive.name`` or a bad ``loss.contrastive.params`` key. In a process
#: that never imported the losses the config is not checked here: building the loss checks it.
_LOSS_CHECKS: list[Callable[[ContrastiveConfig], LossTraits]] = []


def install_loss_check(check: Callable[[ContrastiveConfig], LossTraits]) -> None:
    """Make ``check`` the check of :func:`loss_traits`; returns nothing."""
    _LOSS_CHECKS[:] = [check]


def loss_traits(config: ContrastiveConfig) -> Optional[LossTraits]:
    """The traits of the loss ``config`` names, checked (:func:`install_loss_check`: an unknown name or
    a bad ``params`` key raises ConfigError); None while no check is installed."""
    return _LOSS_CHECKS[0](config) if _LOSS_CHECKS else None


def known_loss_traits(config: ContrastiveConfig) -> Optional[LossTraits]:
    """:func:`loss_traits`, or None where the loss does not check: a saved config (a checkpoint's) may
    name a loss this process has not registered, which matters only to whoever builds that loss."""
    try:
        return loss_traits(config)
    except ConfigError:
        return None


@dataclass
class ContrastiveConfig:
    """The contrastive term (docs/methods.md, loss zoo). ALBEF's ITC is InfoNCE with momentum
    distillation; the other losses take the same similarities and positives. The name is any
    registered loss (:data:`vlp.losses.registry.LOSSES`), checked with its ``params`` when a pretraining
    config is loaded (:meth:`vlp.config.PretrainConfig.check_given`) and when the loss is built."""

    name: str = "infonce"  # infonce | triplet | triplet_sh | smoothap | any registered loss
    tau: Optional[float] = None  # InfoNCE temperature; None: the model's learned one (ALBEF)
    # The loss's own hyperparameters, checked against its typed Params when it is built:
    # loss.contrastive.params.margin=0.3 (triplet, triplet_sh), loss.contrastive.params.tau=0.02 (smoothap)
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tau is not None and self.tau <= 0:
            raise ConfigError(f"config key 'loss.contrastive.tau': got {self.tau}, expected > 0")


#: Keys of ``loss.contrastive`` that became a loss's own hyperparameter (issue 53): old key ->
#: (the built-in losses that took it, its ``loss.contrastive.params`` key).
MOVED_TO_PARAMS: dict[str, tuple[tuple[str, ...], str]] = {
    "smoothap_tau": (("smoothap",), "tau"),
    "margin": (("triplet", "triplet_sh"), "margin"),
}


def migrate_saved_contrastive(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a saved run config ``config`` (the nested dict of a checkpoint's ``state.json`` or a
    run's ``config.yaml``) with the :data:`MOVED_TO_PARAMS` keys of ``loss.contrastive`` moved into
    ``loss.contrastive.params`` for a loss that takes them (the value the run was trained with, unless
    ``params`` sets it), and dropped for any other (they never reached it). A config without them is
    returned as it is (copied)."""
    out = copy.deepcopy(dict(config))
    c = out.get("loss", {}).get("contrastive") if isinstance(out.get("loss"), Mapping) else None
    if not isinstance(c, dict):
        return out
    for old, (losses, new) in MOVED_TO_PARAMS.items():
        if old in c:
            value = c.pop(old)
            if c.get("name", "infonce") in losses:
                c["params"] = {new: value, **(c.get("params") or {})}
    return out


def refuse_moved_contrastive(config: Mapping[str, Any], source: str) -> None:
    """One :class:`ConfigError` naming the new key where a user's config ``config`` (a YAML file's
    tree or the overrides', ``source``) sets a :data:`MOVED_TO_PARAMS` key; returns nothing otherwise."""
    loss = config.get("loss")
    c = loss.get("contrastive") if isinstance(loss, Mapping) else None
    for old, (losses, new) in MOVED_TO_PARAMS.items():
        if isinstance(c, Mapping) and old in c:
            raise ConfigError(
                f"{source}: config key 'loss.contrastive.{old}' is now a hyperparameter of its loss: set "
                f"loss.contrastive.params.{new} (it applies to {'/'.join(losses)} only)"
            )


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
    # Anti-windup: lambda stays at `init` for the first optimizer steps (no ascent, no momentum), while
    # the randomly initialised decoder learns; 0 = the reference. The violation of those steps
    # (L_rec / eta - 1 up to 1/eta - 1) would otherwise be integrated into a lambda that needs as
    # many satisfied steps to come down (the fall is at most lr per step), docs/methods.md.
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.init <= self.max or self.lr <= 0:
            raise ConfigError(
                f"config keys 'loss.ltd.multiplier.init'/'max'/'lr': got {self.init}/{self.max}/{self.lr}, "
                "expected 0 <= init <= max and lr > 0"
            )
        if self.warmup_steps < 0:
            raise ConfigError(f"config key 'loss.ltd.multiplier.warmup_steps': got {self.warmup_steps}, expected >= 0")


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
        check_choice("loss.ltd.mode", self.mode, ["off", "constraint", "dual"])
        check_choice("loss.ltd.decoder", self.decoder, ["latent", "tokens"])
        if self.eta <= 0:
            raise ConfigError(f"config key 'loss.ltd.eta': got {self.eta}, expected > 0 (the bound divides L_rec)")
        if self.beta < 0 or self.hidden < 1:
            raise ConfigError(
                f"config keys 'loss.ltd.beta'/'hidden': got {self.beta}/{self.hidden}, expected >= 0 / >= 1"
            )


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
    # ITM hard negatives are drawn with probability softmax(itm_hardness * ITC logits): 1 = ALBEF's
    # hard-negative mining, 0 = uniform random negatives. Where many ITC-hard negatives are true
    # matches (generic captions, the shapes world), hard mining labels matches as non-matches and
    # ITM stays at its prior (docs/training.md); a softer mining gives it cleaner labels.
    itm_hardness: float = 1.0
    # MLM masks: drawn per rank and averaged per rank (ALBEF), or "global": drawn for the global batch
    # identically on every rank and normalised by the global masked-token count. Needs
    # data.text_padding=max_len across processes. Both global modes: the run equals one process
    # with the global batch (docs/training.md, Multi-process).
    mlm_masking: str = "local"
    mlm_probability: float = 0.15
    # How the masked tokens reach the MLM head (the loss is the same either way). "fixed": gathered
    # into a fixed number of slots (p n + 8 sigma + 8 of the batch's n token positions), with no
    # device synchronisation; the head runs on about twice the masked tokens, which a GPU does not
    # notice but a CPU does (+35% step time on the tiny demo). "exact": boolean indexing, one
    # device sync per step. "auto": fixed on CUDA, exact elsewhere.
    mlm_slots: str = "auto"
    # ITC regulation: none (ALBEF), srcl (weighted negatives) or removal (ALBEF++: drop negatives
    # whose SRCL weight is below loss.srcl.threshold).
    regulation: str = "none"
    srcl: SRCLConfig = field(default_factory=SRCLConfig)
    contrastive: ContrastiveConfig = field(default_factory=ContrastiveConfig)
    ltd: LTDConfig = field(default_factory=LTDConfig)

    def __post_init__(self) -> None:
        check_choice("loss.itc_positives", self.itc_positives, ["pair", "image"])
        check_choice("loss.regulation", self.regulation, ["none", "srcl", "removal"])
        check_choice("loss.itc_bank", self.itc_bank, ["local", "global"])
        check_choice("loss.itm_negatives", self.itm_negatives, ["local", "global"])
        check_choice("loss.mlm_masking", self.mlm_masking, ["local", "global"])
        check_choice("loss.mlm_slots", self.mlm_slots, ["auto", "fixed", "exact"])
        if self.itm_hardness < 0:
            raise ConfigError(f"config key 'loss.itm_hardness': got {self.itm_hardness}, expected >= 0")
        if self.itc_bank == "global" and self.regulation != "none":
            raise ConfigError(
                f"config keys 'loss.itc_bank'/'loss.regulation': itc_bank=global with regulation="
                f"{self.regulation} is not supported (SRCL weights a per-rank bank); use itc_bank=local"
            )
        if not 0.0 <= self.mlm_probability <= 1.0:
            raise ConfigError(f"config key 'loss.mlm_probability': got {self.mlm_probability}, expected [0, 1]")


SAVED_MIGRATIONS.append(migrate_saved_contrastive)
USER_CHECKS.append(refuse_moved_contrastive)
