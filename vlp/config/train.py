"""Training and evaluation configs: optimisation, precision, checkpoints, weight averaging, and
zero-shot retrieval evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from vlp.config.load import check_choice
from vlp.errors import ConfigError


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
            raise ConfigError(
                f"config keys 'train.average.snapshots'/'fraction': got {self.snapshots}/{self.fraction}, "
                "expected >= 0 and (0, 1]"
            )


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
    # Pretraining: zero-shot retrieval on data.eval every this many optimizer steps and at the last
    # step (0: off, data.eval only after training), into metrics.jsonl as eval/<metric>; it leaves
    # the training as it was (docs/training.md, "Zero-shot retrieval while pretraining").
    eval_every: int = 0
    # Recompute the activations of the ViT blocks, text layers and fusion layers in the backward
    # pass instead of keeping them (non-reentrant checkpointing): less memory, one more forward.
    grad_checkpointing: bool = False
    # Batches whose gradients are summed (each loss / this) before one optimizer step. Each
    # micro-batch draws its ITC in-batch negatives and ITM hard negatives from itself; the queue
    # receives every micro-batch (docs/training.md, "Gradient accumulation").
    grad_accum_steps: int = 1
    # torch.compile: "off"; "blocks" (or true) each transformer block (ViT blocks, text layers,
    # fusion layers; the momentum twins' too) - regional compilation, one compiled graph per block
    # type, reused by every layer; "full" the pretraining step's whole forward (online and twin
    # encoders, losses, queue writes) as one graph, with its random draws made before it (needs
    # data.text_padding=max_len). docs/performance.md, "A step that compiles whole".
    compile: str = "off"
    compile_backend: str = "inductor"  # any torch.compile backend ("eager": capture only, no codegen)
    # Replay the compiled step as CUDA graphs (train.compile=full with torch.compile's
    # "reduce-overhead" mode): one launch per graph instead of one per kernel. Without CUDA, or
    # when torch cannot capture the step, the run goes on without them, after one warning.
    cuda_graphs: bool = False
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
    # After SIGTERM / SIGUSR1 the run saves at the next step boundary; a run that does not end its
    # step (or checkpoint save, or validation) within this many seconds - blocked, e.g. waiting for
    # data - exits without a checkpoint, status 128 + the signal (docs/training.md, "Runs that survive").
    stop_grace_s: float = 60.0
    resume: Optional[str] = None  # a checkpoint folder or run directory, or "auto": this run's newest
    # Config keys (or sections, e.g. model.text) a resume may change although that alters the run
    # (batch size, seed, model shape, steps, ...); any other such change is refused, listing them
    # (vlp.config.resume; logging, checkpoint cadence, speed knobs and eval.* may always change).
    resume_allow_changes: list[str] = field(default_factory=list)
    progress: bool = True
    average: AverageConfig = field(default_factory=AverageConfig)
    # Extra metric sinks next to metrics.jsonl (always written): tensorboard (RUN/tb/), wandb.
    loggers: list[str] = field(default_factory=list)
    # The same as Hugging Face's and accelerate's name for it: [tensorboard, wandb] or [none]
    # (None: train.loggers decides; both given and different is an error). Sets train.loggers.
    report_to: Optional[list[str]] = None
    wandb_project: Optional[str] = None  # None: "vlp"

    def __post_init__(self) -> None:
        check_choice("train.precision", self.precision, ["fp32", "bf16"])
        self.compile = {"true": "blocks", "false": "off"}.get(str(self.compile).lower(), str(self.compile))
        check_choice("train.compile", self.compile, ["off", "blocks", "full"])
        if self.cuda_graphs and self.compile != "full":
            raise ConfigError(
                f"config keys 'train.cuda_graphs'/'train.compile': CUDA graphs replay the compiled step: "
                f"set train.compile=full (got {self.compile!r})"
            )
        self._check_cuda_graphs()
        for name in self.loggers:
            check_choice("train.loggers", name, ["tensorboard", "wandb"])
        if self.report_to is not None:
            self.loggers = self._reported()
        if self.steps < 1:
            raise ConfigError(f"config key 'train.steps': got {self.steps}, expected >= 1")
        for path, scale in self.lr_scale.items():
            if not scale > 0:
                raise ConfigError(f"config key 'train.lr_scale.{path}': got {scale}, expected a factor > 0")
        if self.eval_every < 0:
            raise ConfigError(f"config key 'train.eval_every': got {self.eval_every}, expected >= 0 (0: off)")
        if self.grad_accum_steps < 1:
            raise ConfigError(f"config key 'train.grad_accum_steps': got {self.grad_accum_steps}, expected >= 1")
        if self.epochs is not None and self.epochs < 1:
            raise ConfigError(f"config key 'train.epochs': got {self.epochs}, expected >= 1 or null")
        if self.dist_timeout_minutes <= 0:
            raise ConfigError(f"config key 'train.dist_timeout_minutes': got {self.dist_timeout_minutes}, expected > 0")
        if self.keep_last < 0 or self.max_nonfinite_steps < 1:
            raise ConfigError(
                f"config keys 'train.keep_last'/'train.max_nonfinite_steps': got {self.keep_last}/"
                f"{self.max_nonfinite_steps}, expected >= 0 / >= 1"
            )
        if not self.stop_grace_s > 0:
            raise ConfigError(f"config key 'train.stop_grace_s': got {self.stop_grace_s}, expected seconds > 0")
        if self.resume and self.average.snapshots:
            raise ConfigError(
                "config keys 'train.resume'/'train.average.snapshots': resuming a run that averages "
                "weights is not supported (the snapshots taken before the checkpoint are not saved)"
            )

    def _check_cuda_graphs(self) -> None:
        """Refuse what ``train.cuda_graphs`` cannot do (raises :class:`ConfigError`, returns None):
        accumulation (each micro-batch starts a new CUDA-graph step, whose replay overwrites the
        earlier micro-batches' outputs that the non-finite check and the statistics read after the
        last one) and a backend other than inductor (which would drop ``reduce-overhead`` silently)."""
        if not self.cuda_graphs:
            return
        if self.grad_accum_steps > 1:
            raise ConfigError(
                f"config keys 'train.cuda_graphs'/'train.grad_accum_steps': CUDA graphs replay one step per "
                f"micro-batch and would overwrite the earlier micro-batches' outputs: set train.cuda_graphs=false "
                f"or train.grad_accum_steps=1 (got {self.grad_accum_steps})"
            )
        if self.compile_backend != "inductor":
            raise ConfigError(
                f"config keys 'train.cuda_graphs'/'train.compile_backend': CUDA graphs are inductor's "
                f"reduce-overhead mode, which the backend {self.compile_backend!r} would drop: set "
                "train.compile_backend=inductor or train.cuda_graphs=false"
            )

    def _reported(self) -> list[str]:
        """``train.report_to`` as the sinks of ``train.loggers`` (checked against it when both are set)."""
        names = list(self.report_to or [])
        for name in names:
            check_choice("train.report_to", name, ["tensorboard", "wandb", "none"])
        if not names or ("none" in names and len(names) > 1):
            raise ConfigError(
                f"config key 'train.report_to': got {names}, expected some of [tensorboard, wandb], or [none]"
            )
        chosen = [n for n in names if n != "none"]
        if self.loggers and sorted(set(self.loggers)) != sorted(set(chosen)):
            raise ConfigError(
                f"config keys 'train.report_to'/'train.loggers': {names} and {self.loggers} disagree; "
                "set one of them (train.loggers is the older name of train.report_to)"
            )
        return chosen


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
        check_choice("eval.score", self.score, ["itm", "itm+itc", "itc"])
        check_choice("eval.precision", self.precision, ["auto", "fp32", "bf16"])
        check_choice("eval.offload", self.offload, ["auto", "none", "images", "all"])
        if self.k_test < 1:
            raise ConfigError(f"config key 'eval.k_test': got {self.k_test}, expected >= 1")
        for key in ("batch_size", "itm_batch_size"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"config key 'eval.{key}': got {value}, expected >= 1")
        if self.num_workers is not None and self.num_workers < 0:
            raise ConfigError(
                f"config key 'eval.num_workers': got {self.num_workers}, expected >= 0 (or null: automatic)"
            )

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
