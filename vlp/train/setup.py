"""Setting a run up: the accelerator (single process, DDP, or DeepSpeed ZeRO-1/2 with vlp's train
config filled into its JSON), the model-side train options, freezing what the objective never
reaches, the optimizer, and ``accelerate.prepare`` of task, optimizer and loader
(:func:`prepare_training`, shared by the loop and ``vlp bench``).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable, Iterator, Optional, cast

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import (
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    InitProcessGroupKwargs,
)
from torch import nn

from vlp import hardware
from vlp.config import TrainConfig
from vlp.errors import ConfigError
from vlp.preprocess.device_decode import DeviceBatch
from vlp.train.compile_watch import CompileRecord, cuda_graph_status
from vlp.train.optim import build_optimizer


def launched_with_deepspeed() -> bool:
    """``accelerate launch`` with a DeepSpeed config (it exports ``ACCELERATE_USE_DEEPSPEED``)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def make_accelerator(
    cfg: TrainConfig, find_unused_parameters: bool = False, micro_batch: Optional[int] = None
) -> Accelerator:
    """Single process on CPU, or whatever ``accelerate launch`` set up (DDP, or DeepSpeed ZeRO-1/2:
    see :func:`configure_deepspeed`). Queues are not re-broadcast. ``find_unused_parameters``: DDP
    tolerates parameters the loss does not reach (a head whose loss weight is 0). ``micro_batch``:
    pairs per process per forward, for DeepSpeed's config.

    accelerate keeps its precision settings in a process-wide singleton; it is cleared here (the
    process-group state is kept) so that jobs run one after another in one process - demo, tests,
    notebooks - may each choose their own ``train.precision``.
    """
    AcceleratorState._reset_state()
    deepspeed = launched_with_deepspeed()
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cfg.tf32
    if cfg.precision == "bf16" and not torch.cuda.is_available():
        hardware.warn_if_bf16_is_emulated("train.precision=bf16")
    warn_if_launch_precision_differs(cfg)
    acc = Accelerator(
        # under DeepSpeed, bf16 is DeepSpeed's torch autocast (parameters stay fp32), set below
        mixed_precision="bf16" if cfg.precision == "bf16" and not deepspeed else "no",
        cpu=not torch.cuda.is_available() and not deepspeed,
        gradient_accumulation_steps=cfg.grad_accum_steps if deepspeed else 1,
        # batches from pinned memory reach the GPU asynchronously
        dataloader_config=DataLoaderConfiguration(non_blocking=torch.cuda.is_available()),
        kwargs_handlers=[
            DistributedDataParallelKwargs(broadcast_buffers=False, find_unused_parameters=find_unused_parameters),
            # DeepSpeed on CPU (tests): accelerate would otherwise count one process
            InitProcessGroupKwargs(
                backend="gloo" if deepspeed and not torch.cuda.is_available() else None,
                timeout=timedelta(minutes=cfg.dist_timeout_minutes),
            ),
        ],
    )
    if uses_deepspeed(acc):
        configure_deepspeed(acc.state.deepspeed_plugin.deepspeed_config, cfg, micro_batch)
    return acc


#: what ``accelerate launch`` exports from its config file's ``mixed_precision`` (or ``--mixed_precision``)
LAUNCH_PRECISION = "ACCELERATE_MIXED_PRECISION"


def warn_if_launch_precision_differs(cfg: TrainConfig) -> Optional[str]:
    """``train.precision`` rules: vlp hands it to accelerate itself. One warning (returned too)
    when ``accelerate launch`` was given another ``mixed_precision`` than ``no`` (its default,
    which the shipped launch configs keep), e.g. ``bf16`` with ``train.precision=fp32``."""
    launched = os.environ.get(LAUNCH_PRECISION, "no")
    wanted = "bf16" if cfg.precision == "bf16" else "no"
    if launched in ("no", wanted):
        return None
    message = (
        f"accelerate launch's mixed_precision={launched} (its --config_file or --mixed_precision) differs from "
        f"train.precision={cfg.precision}; train.precision rules, the run trains in {cfg.precision}. Set the "
        "precision with train.precision (and leave mixed_precision: 'no' in the launch config)"
    )
    warnings.warn(message, stacklevel=2)
    return message


def uses_deepspeed(acc: Accelerator) -> bool:
    """Whether ``acc`` runs under DeepSpeed."""
    return acc.distributed_type == DistributedType.DEEPSPEED


def configure_deepspeed(ds: dict[str, Any], cfg: TrainConfig, micro_batch: Optional[int]) -> None:
    """Fill the DeepSpeed config from vlp's train config (in place, before ``prepare``).

    Parameters stay fp32 in the engine: ``train.precision=bf16`` becomes DeepSpeed's
    ``torch_autocast`` (the same autocast DDP runs under), never its ``bf16`` mode, which casts
    every parameter of the wrapped module - the momentum twins included, whose EMA would then stall
    in bf16. Clipping and micro-batches are vlp's keys; the learning rate stays vlp's schedule.
    """
    zero = ds.get("zero_optimization", {}).get("stage", 0)
    if zero not in (0, 1, 2):
        raise ConfigError(
            f"DeepSpeed config: zero_optimization.stage={zero}; vlp supports ZeRO stages 0-2 "
            "(stage 3 shards the parameters the momentum update and the 4 fusion passes read)"
        )
    for key in ("bf16", "fp16"):
        if ds.get(key, {}).get("enabled") is True:
            raise ConfigError(
                f"DeepSpeed config: {key}.enabled=true would cast the momentum twins to {key}; set it "
                'to "auto" or false and choose the precision with train.precision (bf16 autocast)'
            )
        ds[key] = {"enabled": False}
    # DeepSpeed's autocast marks Linear/Conv weights "lower-precision safe" and reduces their
    # gradients in bf16; DDP reduces fp32 gradients. No module is marked, so ZeRO reduces in fp32 too.
    ds["torch_autocast"] = {"enabled": cfg.precision == "bf16", "dtype": "bfloat16", "lower_precision_safe_modules": []}
    ds["communication_data_type"] = "fp32"
    ds["gradient_clipping"] = float(cfg.grad_clip or 0.0)
    ds["gradient_accumulation_steps"] = cfg.grad_accum_steps
    if micro_batch is not None and ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        ds["train_micro_batch_size_per_gpu"] = micro_batch
    ds.pop("train_batch_size", None)  # derived by DeepSpeed from the two above and the world size


def apply_train_options(task: nn.Module, cfg: TrainConfig) -> None:
    """Model-side switches of the train config (before ``prepare``): activation checkpointing,
    compilation (``train.compile``: regional, or the whole step's forward)."""
    model = getattr(task, "model", None)
    for key, on, owner, method in (
        ("grad_checkpointing", cfg.grad_checkpointing, model, "set_grad_checkpointing"),
        ("compile=blocks", cfg.compile == "blocks", model, "compile_blocks"),
        ("compile=full", cfg.compile == "full", task, "compile_full"),
    ):
        if on and not hasattr(owner, method):
            what = "ALBEF-family models" if owner is model else "pretraining"
            raise ConfigError(f"config key 'train.{key}': not available for {type(owner).__name__} ({what} only)")
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    if cfg.compile != "off":
        # a graph that fails to compile is an error, not a silent fall-back to eager; when a block
        # hits torch's recompile limit (a new text length per batch: use data.text_padding=max_len),
        # torch logs "hit config.recompile_limit" and runs it eagerly
        import torch._dynamo

        torch._dynamo.config.suppress_errors = False
    if cfg.compile == "blocks":
        model.compile_blocks(cfg.compile_backend)
    elif cfg.compile == "full":
        cast(Any, task).compile_full(cfg.compile_backend, cuda_graph_mode(cfg))


def cuda_graph_mode(cfg: TrainConfig) -> Optional[str]:
    """torch.compile's mode for ``train.cuda_graphs``: ``reduce-overhead`` (CUDA graph trees) when
    CUDA is there, else None after one warning (the run goes on without CUDA graphs)."""
    if not cfg.cuda_graphs:
        return None
    if not torch.cuda.is_available():
        warnings.warn(
            "train.cuda_graphs: CUDA graphs need a CUDA device; running the compiled step without them", stacklevel=2
        )
        return None
    return "reduce-overhead"


def warn_if_cuda_graphs_skipped(cfg: TrainConfig, record: CompileRecord) -> bool:
    """After the first compiled step (``record``: what torch.compile did in it): one warning, with
    inductor's reasons, when ``train.cuda_graphs`` is on but torch did not capture (part of) the
    step as CUDA graphs - it then runs those graphs without them. Returns whether it warned."""
    status = cuda_graph_status(cfg.cuda_graphs, "cuda", record)
    if status is None or status == "captured":
        return False
    warnings.warn(
        f"train.cuda_graphs: {record.cudagraph_skips} graph(s) of the step run without CUDA graphs ({status})",
        stacklevel=2,
    )
    return True


class DeviceLoader:
    """A loader that splits the data by rank itself (``splits_by_rank``, e.g. the webdataset
    stream) is not handed to accelerate; this moves its batches to the device instead."""

    def __init__(self, loader: Any, device: torch.device) -> None:
        self.loader, self.device = loader, device

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """The wrapped loader's ``set_epoch``."""
        self.loader.set_epoch(epoch)

    def set_position(self, epoch: int, batches: int, *stream: Any) -> None:
        """The wrapped loader's ``set_position`` (e.g. :meth:`vlp.data.shards.ShardLoader.set_position`)."""
        self.loader.set_position(epoch, batches, *stream)

    def position(self) -> Optional[dict[str, Any]]:
        """The wrapped loader's ``position()`` (where its stream is); None when it has no such method."""
        position = getattr(self.loader, "position", None)
        return position() if position is not None else None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            yield {k: v.to(self.device, non_blocking=True) if _movable(v) else v for k, v in batch.items()}


def _movable(v: Any) -> bool:
    """A batch value the device copy moves: a tensor, or the images of ``data.image.decode=device``."""
    return torch.is_tensor(v) or isinstance(v, DeviceBatch)


@dataclass
class Prepared:
    """What :func:`prepare_training` returns: the wrapped task, optimizer and loader, the unwrapped
    task, the parameters to clip and the 0-d parameters."""

    task: nn.Module
    optimizer: torch.optim.Optimizer
    loader: Iterable
    inner: nn.Module
    params: list[torch.Tensor]
    scalars: list[torch.Tensor]  # 0-d parameters an engine may view as [1] (see viewed_as)


def prepare_training(acc: Accelerator, task: nn.Module, loader: Iterable, cfg: TrainConfig) -> Prepared:
    """Train options, optimizer and ``accelerate.prepare`` (shared by the loop and ``vlp bench``).

    A loader with ``splits_by_rank`` is left alone (accelerate would re-shard or broadcast it) and
    wrapped in a :class:`DeviceLoader`. After preparing, the non-trained state (momentum twins,
    feature queues) is checked to be fp32, whatever the engine."""
    apply_train_options(task, cfg)
    freeze_unused(task)
    optimizer = build_optimizer(task, cfg, fused=not uses_deepspeed(acc))
    scalars = [p for p in task.parameters() if p.dim() == 0] if uses_deepspeed(acc) else []
    with viewed_as(scalars, (1,)):
        if getattr(loader, "splits_by_rank", False):
            task, optimizer = acc.prepare(task, optimizer)
            loader = DeviceLoader(loader, acc.device)
        else:
            task, optimizer, loader = acc.prepare(task, optimizer, loader)
    inner = acc.unwrap_model(task)
    check_fp32_state(inner)
    params = [p for g in optimizer.param_groups for p in g["params"]]  # lambda is not among them
    return Prepared(task, optimizer, loader, inner, params, scalars)


@contextlib.contextmanager
def viewed_as(params: list[torch.Tensor], shape: tuple[int, ...]) -> Iterator[None]:
    """View ``params`` with ``shape`` inside the block, and with their former shapes after it (over
    whatever storage they hold then).

    DeepSpeed needs it for 0-d parameters (the ITC temperature): its initial broadcast views every
    parameter as bytes, which a 0-d tensor cannot be, so they are [1] while it sets up; and after
    each step ZeRO re-points them to [1] views of its flat buffer, so checkpoints are written and
    read with the declared 0-d shape."""
    shapes = [p.shape for p in params]
    for p in params:
        p.data = p.data.reshape(shape)
    try:
        yield
    finally:
        for p, s in zip(params, shapes):
            p.data = p.data.reshape(s)


def freeze_unused(task: nn.Module) -> list[str]:
    """Freeze the parameters the task's configured objective never reaches
    (``task.unused_parameters()``: a fixed temperature, a zoo loss's unused temperature, the head of
    a zero-weight loss). DDP would otherwise wait for their gradients and fail at step 2; freezing
    them is cheaper than ``find_unused_parameters``. Returns their names."""
    names = sorted(task.unused_parameters()) if hasattr(task, "unused_parameters") else []
    params = dict(task.named_parameters())
    for n in names:
        params[n].requires_grad_(False)
    return names


def check_fp32_state(task: nn.Module) -> None:
    """Momentum twins and queues must be fp32 after ``prepare`` (an engine that casts them breaks the EMA)."""
    for name, t in [*task.named_parameters(), *task.named_buffers()]:
        if (
            (".momentum." in f".{name}" or ".queue." in f".{name}")
            and t.is_floating_point()
            and t.dtype != torch.float32
        ):
            raise RuntimeError(
                f"{name} is {t.dtype} after accelerate.prepare: momentum twins and queues must stay fp32"
            )
