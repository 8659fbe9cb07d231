"""One accelerate-based training loop for every task.

A task is an ``nn.Module`` whose ``forward(batch, step=...)`` returns a dict of scalar tensors with
``loss``; it may define ``after_optimizer_step(step, skipped=None)`` (momentum updates, the LTD
multiplier; ``step`` counts optimizer steps, ``skipped`` is a 0-d bool device tensor: the step was
skipped and must leave no trace), ``unused_parameters()`` (names of parameters its configured
objective never reaches: frozen before the optimizer is built, so DDP needs no
``find_unused_parameters``) and ``extra_state()`` (tensors checkpointed next to the model).
The loop knows nothing else. Between two log steps it reads nothing back from the device
(:mod:`vlp.train.step_stats`).
"""

from __future__ import annotations

import contextlib
import itertools
from datetime import timedelta
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NoReturn, Optional

import torch
from accelerate import Accelerator, skip_first_batches
from accelerate.state import AcceleratorState
from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs, DistributedType, InitProcessGroupKwargs
from torch import nn
from torch.utils.data import DataLoader

from vlp.config import ConfigError, TrainConfig
from vlp.data.formats import DataError
from vlp.dist import all_gather_nograd, any_over_ranks
from vlp.eval.mode import evaluating
from vlp import hardware
from vlp.models.loading import CheckpointError
from vlp.train.checkpoint import (find_checkpoint, prune_checkpoints, publish, read_state, save_checkpoint,
                                  set_aside_checkpoints_after, staging, write_parts)
from vlp.train.loggers import open_loggers
from vlp.progress import progress
from vlp.train.logging import MetricsLog
from vlp.train.optim import build_optimizer, lr_at, trainable
from vlp.train.swa import WeightAverager
from vlp.train.step_stats import StepStats, Window
from vlp.train.train_state import TRAIN_STATE, load_train_state, save_train_state


def launched_with_deepspeed() -> bool:
    """``accelerate launch`` with a DeepSpeed config (it exports ``ACCELERATE_USE_DEEPSPEED``)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def make_accelerator(cfg: TrainConfig, find_unused_parameters: bool = False,
                     micro_batch: Optional[int] = None) -> Accelerator:
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
    acc = Accelerator(
        # under DeepSpeed, bf16 is DeepSpeed's torch autocast (parameters stay fp32), set below
        mixed_precision="bf16" if cfg.precision == "bf16" and not deepspeed else "no",
        cpu=not torch.cuda.is_available() and not deepspeed,
        gradient_accumulation_steps=cfg.grad_accum_steps if deepspeed else 1,
        # batches from pinned memory reach the GPU asynchronously
        dataloader_config=DataLoaderConfiguration(non_blocking=torch.cuda.is_available()),
        kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False,
                                                       find_unused_parameters=find_unused_parameters),
                         # DeepSpeed on CPU (tests): accelerate would otherwise count one process
                         InitProcessGroupKwargs(backend="gloo" if deepspeed and not torch.cuda.is_available() else None,
                                                timeout=timedelta(minutes=cfg.dist_timeout_minutes))],
    )
    if uses_deepspeed(acc):
        configure_deepspeed(acc.state.deepspeed_plugin.deepspeed_config, cfg, micro_batch)
    return acc


def uses_deepspeed(acc: Accelerator) -> bool:
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
        raise ConfigError(f"DeepSpeed config: zero_optimization.stage={zero}; vlp supports ZeRO stages 0-2 "
                          "(stage 3 shards the parameters the momentum update and the 4 fusion passes read)")
    for key in ("bf16", "fp16"):
        if ds.get(key, {}).get("enabled") is True:
            raise ConfigError(f"DeepSpeed config: {key}.enabled=true would cast the momentum twins to {key}; set it "
                              "to \"auto\" or false and choose the precision with train.precision (bf16 autocast)")
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
    regional compilation."""
    model = getattr(task, "model", None)
    for key, on, method in (("grad_checkpointing", cfg.grad_checkpointing, "set_grad_checkpointing"),
                            ("compile", cfg.compile, "compile_blocks")):
        if on and not hasattr(model, method):
            raise ConfigError(f"config key 'train.{key}': not available for {type(model).__name__} "
                              "(ALBEF-family models only)")
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    if cfg.compile:
        # a block that fails to compile is an error, not a silent fall-back to eager; when a block
        # hits torch's recompile limit (a new text length per batch: use data.text_padding=max_len),
        # torch logs "hit config.recompile_limit" and runs it eagerly
        import torch._dynamo

        torch._dynamo.config.suppress_errors = False
        model.compile_blocks(cfg.compile_backend)


def set_lr(optimizer: torch.optim.Optimizer, step: int, cfg: TrainConfig) -> float:
    """The scheduled learning rate of ``step`` (0-based) into every parameter group, times the
    group's ``lr_scale`` (``train.lr_scale``); returns the unscaled rate."""
    lr = lr_at(step, cfg)
    for g in optimizer.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    return lr


def clip_gradients(acc: Accelerator, params: list[torch.Tensor], cfg: TrainConfig) -> Optional[torch.Tensor]:
    """Clip to ``train.grad_clip``; returns the total gradient norm before clipping, or None under
    DeepSpeed (whose engine clips its own gradient partitions, inside ``acc.backward``)."""
    if uses_deepspeed(acc):
        return None
    if cfg.grad_clip:
        return acc.clip_grad_norm_(params, cfg.grad_clip)
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else None


def skips_on_device(optimizer: Any) -> bool:
    """Whether the optimizer (behind accelerate's wrapper) skips a step on a device flag: torch's
    fused Adam/AdamW read ``found_inf`` inside their kernel, with no host synchronisation."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return isinstance(inner, torch.optim.Adam | torch.optim.AdamW) and bool(inner.defaults.get("fused"))


def optimizer_step(acc: Accelerator, optimizer: torch.optim.Optimizer, inner: nn.Module,
                   params: list[torch.Tensor], step: int, cfg: TrainConfig, clipped: bool = False,
                   skipped: Optional[torch.Tensor] = None) -> None:
    """Clip (unless ``clipped``), step, clear every gradient of the task (the self-optimised LTD
    multiplier's too), then the task's post-step hook (momentum EMA, LTD multiplier).

    ``skipped`` (0-d bool on the device): the step must leave no trace. A fused optimizer skips on
    the device (``found_inf``); another reads the flag (a host synchronisation); under DeepSpeed
    the engine has already stepped inside ``backward`` and skips a non-finite gradient itself."""
    if not clipped:
        clip_gradients(acc, params, cfg)
    if skipped is None or uses_deepspeed(acc):
        optimizer.step()
    elif skips_on_device(optimizer):
        torch_opt = getattr(optimizer, "optimizer", optimizer)
        torch_opt.found_inf = skipped.to(torch.float32)
        try:
            optimizer.step()
        finally:
            del torch_opt.found_inf
    elif not bool(skipped):
        optimizer.step()
    if hasattr(inner, "after_optimizer_step"):  # before the gradients go: the LTD multiplier steps on its own
        inner.after_optimizer_step(step + 1, skipped=skipped)
    optimizer.zero_grad(set_to_none=True)
    inner.zero_grad(set_to_none=True)


@dataclass
class Validation:
    """Periodic validation: ``evaluate(task, step) -> metrics`` (the unwrapped task, eval mode, no
    grad) every ``every`` optimizer steps; the checkpoint with the highest ``metrics[select]`` is kept.

    ``evaluate`` runs on **every rank** (several processes): it may shard its work over the ranks
    (the retrieval, VQA and NLVR2 evaluators do, with collectives every rank must join). Rank 0
    logs, and its decision on the best checkpoint is the one every rank follows."""

    evaluate: Callable[[nn.Module, int], dict[str, float]]
    select: str
    every: int

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"validation every {self.every} steps: expected >= 1")


class DeviceLoader:
    """A loader that splits the data by rank itself (``splits_by_rank``, e.g. the webdataset
    stream) is not handed to accelerate; this moves its batches to the device instead."""

    def __init__(self, loader: Any, device: torch.device) -> None:
        self.loader, self.device = loader, device

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def set_position(self, epoch: int, batches: int) -> None:
        self.loader.set_position(epoch, batches)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            yield {k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


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
        if (".momentum." in f".{name}" or ".queue." in f".{name}") and t.is_floating_point() and t.dtype != torch.float32:
            raise RuntimeError(f"{name} is {t.dtype} after accelerate.prepare: momentum twins and queues must stay fp32")


def endless_batches(loader: Iterable, start: int = 0) -> Iterator[Any]:
    """Batches over epochs without end, from batch ``start`` of the whole sequence (resume): a
    loader with ``set_position`` seeks there itself, others skip the first batches of the epoch."""
    epoch, skip = divmod(start, len(loader)) if start else (0, 0)
    while True:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        source = loader
        if skip and hasattr(loader, "set_position"):
            loader.set_position(epoch, skip)
        elif skip:
            source = skip_first_batches(loader, skip) if isinstance(loader, DataLoader) else itertools.islice(loader, skip, None)
        skip = 0
        for batch in source:
            yield batch
        epoch += 1


STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: the bad-sample share is judged once this many samples were loaded (a few bad ones in the first
#: batches are not a trend)
BAD_SHARE_AFTER = 100


class Preempted(Exception):
    """The run was asked to stop (SIGTERM / SIGUSR1) and saved a checkpoint at a step boundary;
    the message says how to resume (``args[1]``: where it stopped, without the hint). ``vlp``
    prints it and exits with status 0."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def exit_status(main: Callable[[], Optional[int]], prog: str) -> int:
    """Run a script's ``main`` (the experiment scripts, which call the jobs in-process): a run
    stopped by SIGTERM / SIGUSR1 prints where it stopped and gives status 0, as ``vlp`` does;
    running the script again continues from its checkpoints."""
    try:
        return main() or 0
    except Preempted as e:
        where = e.args[1] if len(e.args) > 1 else str(e)
        print(f"{prog}: {where}. Run the same script command again to continue.", file=sys.stderr)
        return 0


@contextlib.contextmanager
def stop_signals() -> Iterator[list[int]]:
    """While training, SIGTERM and SIGUSR1 are recorded (in the returned list) instead of killing
    the process; the loop checkpoints at the next step boundary. Main thread only (elsewhere
    Python cannot install handlers, and the signals keep their default action)."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    old = {s: signal.signal(s, lambda signum, _frame: got.append(signum)) for s in STOP_SIGNALS}
    try:
        yield got
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


class NonFiniteError(RuntimeError):
    """``train.max_nonfinite_steps`` consecutive steps had a non-finite loss or gradient (or one did,
    under DeepSpeed, which cannot skip a step); a checkpoint of the last good state was saved."""


def non_finite(outs: list[dict[str, torch.Tensor]], norm: Optional[torch.Tensor]) -> torch.Tensor:
    """Whether a step's losses or its gradient norm are not finite (a 0-d bool tensor, no sync)."""
    vals = [o["loss"].detach().float().reshape(()) for o in outs] + ([norm.float().reshape(())] if norm is not None else [])
    return ~torch.isfinite(torch.stack(vals)).all()


def resume(acc: Accelerator, optimizer: Any, task: nn.Module, model: nn.Module, cfg: TrainConfig, run_dir: Path,
           log: MetricsLog) -> int:
    """Load ``train.resume``'s checkpoint (``auto``: the run directory's newest valid one) into the
    prepared task, optimizer and RNGs; returns its step. Records of later steps are dropped from
    the log (they are run again)."""
    ckpt = find_checkpoint(run_dir if cfg.resume == "auto" else cfg.resume, require=[f"{TRAIN_STATE}/rng_rank0.json"])
    saved = read_state(ckpt)
    if saved.get("world_size", acc.num_processes) != acc.num_processes:
        raise CheckpointError(f"config key 'train.resume': {ckpt} was written by {saved['world_size']} processes, this "
                              f"run has {acc.num_processes}; resume with the same number of processes")
    load_train_state(ckpt, optimizer, task, model, acc.process_index, acc.num_processes)
    step = int(saved["step"])
    if acc.is_main_process:
        log.truncate_after(step)
        print(f"resumed from {ckpt} at step {step} of {cfg.steps}")
        moved = set_aside_checkpoints_after(run_dir, step)
        if moved:
            print(f"moved {len(moved)} checkpoint(s) of the steps run again (or corrupted) to {moved[0].parent}: "
                  + ", ".join(p.name for p in moved))
    acc.wait_for_everyone()
    return step


def train(
    task: nn.Module,
    loader: Iterable,
    cfg: TrainConfig,
    run_dir: str | Path,
    state: Optional[dict[str, Any]] = None,
    accelerator: Optional[Accelerator] = None,
    checkpoint_module: Optional[Callable[[nn.Module], nn.Module]] = None,
    validation: Optional[Validation] = None,
    max_bad_fraction: Optional[float] = None,
) -> dict[str, float]:
    """Train ``task`` for ``cfg.steps`` steps; log to ``run_dir/metrics.jsonl``; checkpoint to
    ``run_dir/checkpoints/step_N``. ``state`` is stored in every checkpoint's ``state.json``;
    ``checkpoint_module`` picks what is saved from the unwrapped task (default: ``task.model``).
    ``validation``: evaluate every ``validation.every`` steps and at the end (on every rank, sharded;
    the main process decides), log to ``run_dir/val_metrics.jsonl`` and keep the best checkpoint in
    ``run_dir/checkpoints/best``. Returns the last logged record."""
    run_dir = Path(run_dir)
    acc = accelerator or make_accelerator(cfg)
    prep = prepare_training(acc, task, loader, cfg)
    from vlp.train.checkpoint import check_shared_filesystem  # every rank must see run_dir (checkpoints)
    check_shared_filesystem(run_dir, acc.device)
    task, optimizer, loader, inner, params = prep.task, prep.optimizer, prep.loader, prep.inner, prep.params
    to_save = (checkpoint_module or (lambda t: t.model))(inner)
    log = MetricsLog(run_dir / "metrics.jsonl", open_loggers(cfg.loggers, run_dir, acc.is_main_process, cfg.wandb_project,
                                                             (state or {}).get("config")))  # + TensorBoard / W&B
    averager = None
    if cfg.average.snapshots:
        epoch_steps = len(loader) if hasattr(loader, "__len__") else None
        averager = WeightAverager([p for _, p in trainable(inner)], cfg.average, cfg.steps, epoch_steps)

    def extra_state() -> Optional[dict[str, torch.Tensor]]:
        return inner.extra_state() if hasattr(inner, "extra_state") else None

    def saved_state(step: int, **info: Any) -> dict[str, Any]:
        averaged = {"averaged": averager.history} if averager is not None and averager.history else {}
        return {**(state or {}), "step": step, "world_size": acc.num_processes, **averaged, **info}

    def checkpoint(step: int) -> None:
        """Staged in step_N.tmp/ (main process: model, state; every rank: its train state), then
        published with a manifest by the main process, and old checkpoints pruned."""
        final = run_dir / "checkpoints" / f"step_{step:07d}"
        tmp = final.with_name(final.name + ".tmp")
        acc.wait_for_everyone()
        if acc.is_main_process:
            tmp = staging(final)
            with viewed_as(prep.scalars, ()):
                    write_parts(tmp, to_save, saved_state(step, data_position={"batches": step * micro}), extra_state())
        acc.wait_for_everyone()
        if cfg.save_state:  # optimizer, task state, RNG states: every rank writes its part
            with viewed_as(prep.scalars, ()):
                save_train_state(tmp / TRAIN_STATE, optimizer, inner, to_save, acc.process_index)
        acc.wait_for_everyone()
        if acc.is_main_process:
            publish(tmp, final)
            prune_checkpoints(run_dir, cfg.keep_last)
        acc.wait_for_everyone()

    best: dict[str, Any] = {}

    def validate(step: int) -> None:
        """Every rank evaluates (the evaluators shard the work over the ranks, no rank waits alone
        past the collective timeout); rank 0 logs and keeps the best checkpoint, and its decision
        is shared so that every rank tracks the same best."""
        acc.wait_for_everyone()
        with evaluating(task), torch.no_grad():  # eval mode; each module's own mode restored after
            metrics = validation.evaluate(inner, step)
        value = metrics[validation.select]
        improved = not best or value > best["value"]
        improved = bool(all_gather_nograd(torch.tensor([float(improved)], device=acc.device))[0] > 0)  # rank 0's
        if acc.is_main_process:
            MetricsLog(run_dir / "val_metrics.jsonl").write({"step": step, **metrics, "best": improved})
            log.sinks.log(metrics, step, prefix="val/")
            print(f"validation at step {step}: {validation.select} {value:.2f}"
                  + (" (best so far)" if improved else f" (best {best['value']:.2f} at step {best['step']})"))
        if improved:
            best.update(metric=validation.select, value=value, step=step)
            if acc.is_main_process:
                with viewed_as(prep.scalars, ()):
                    save_checkpoint(run_dir / "checkpoints" / "best", to_save,
                                    saved_state(step, best=dict(best), val=metrics), extra_state())
        acc.wait_for_everyone()

    micro = cfg.grad_accum_steps
    with viewed_as(prep.scalars, ()):
        start = resume(acc, optimizer, inner, to_save, cfg, run_dir, log) if cfg.resume else 0
    bar = progress(cfg.steps, "train", cfg.progress and acc.is_main_process)
    bar.update(start)
    batches = endless_batches(loader, start * micro)
    stats = StepStats(acc.device, cfg.max_nonfinite_steps, acc.num_processes)
    n_sum, pairs, t_window, data_time = 0, 0, time.perf_counter(), 0.0
    seen_total = bad_total = 0  # samples (all ranks) since the start of this process, bad ones among them
    undo = [m for m in inner.modules() if hasattr(m, "end_step")]  # feature queues: a skipped step leaves no trace
    record: dict[str, float] = {}
    task.train()
    deepspeed = uses_deepspeed(acc)  # DeepSpeed accumulates (and scales by 1/micro) itself; no no_sync under ZeRO-2
    one_process = acc.num_processes == 1

    def fail_nonfinite(at: int, what: str) -> NoReturn:
        checkpoint(at)
        bar.close()
        raise NonFiniteError(f"{what}; checkpoint {run_dir / 'checkpoints' / f'step_{at:07d}'} holds the last good "
                             "state (lower train.lr, set train.grad_clip or train.precision=fp32, then resume with "
                             "train.resume=auto)")

    def report_skips(window: Window) -> None:
        """The window's skipped steps, in the words of the step (read at the log step)."""
        for s in window.skipped:
            what = (f"step {s.step}: non-finite loss or gradient (loss {s.losses}, gradient norm "
                    f"{s.norm if s.norm is not None else 'n/a'}); step skipped")
            if window.halted_at == s.step:
                fail_nonfinite(s.step, f"{what}, {s.in_a_row} in a row (train.max_nonfinite_steps)")
            if acc.is_main_process:
                print(f"warning: {what} ({s.in_a_row} in a row; the run stops at {cfg.max_nonfinite_steps})",
                      file=sys.stderr)

    with stop_signals() as stop, log:  # SIGTERM / SIGUSR1: checkpoint at the next step boundary; log closes its sinks
        for step in range(start, cfg.steps):
            lr = set_lr(optimizer, step, cfg)
            for m in undo:
                m.begin_step()
            outs = []
            for m in range(micro):  # gradients of `micro` batches, one optimizer step (docs/training.md)
                t0 = time.perf_counter()
                batch = next(batches)
                data_time += time.perf_counter() - t0
                with acc.no_sync(task) if m < micro - 1 and not deepspeed else contextlib.nullcontext():
                    out = task(batch, step=step)
                    acc.backward(out["loss"] if deepspeed else out["loss"] / micro)
                outs.append(out)
                stats.add_bad_samples(batch.get("bad_samples"))
            norm = clip_gradients(acc, params, cfg)
            # no update when any rank saw a non-finite loss or gradient: weights, optimizer, momentum
            # twins, queues and LTD multiplier stay as they were; decided on the device, read at the log step
            skipped = stats.skip(any_over_ranks([non_finite(outs, norm)], device=acc.device)[0])
            done = step + 1
            optimizer_step(acc, optimizer, inner, params, step, cfg, clipped=True, skipped=skipped)
            for m in undo:
                m.end_step(skipped)
            if averager is not None:
                averager.after_step(step + 1)
            stats.add_step(done, outs, norm, skipped)
            n_sum += micro
            pairs += micro * len(batch["input_ids"]) * acc.num_processes
            log_step = done % cfg.log_every == 0 or done == cfg.steps
            # a stop signal: acted on at once on one process; several agree on it at log steps (one read each)
            stopping = bool(stop) if one_process else log_step and bool(any_over_ranks([bool(stop)], device=acc.device)[0])
            if log_step:
                dt = time.perf_counter() - t_window
                window = stats.read()
                report_skips(window)
                bad = window.bad_samples
                record = {"step": done, "lr": lr, **window.means, "pairs_per_s": pairs / dt,
                          "data_time": data_time / n_sum, "bad_samples": bad,
                          **({"skipped_steps": len(window.skipped)} if window.skipped else {})}
                if acc.is_main_process:
                    log.write(record)
                if "loss" in record:
                    bar.set_postfix(loss=f"{record['loss']:.3f}", pairs_s=f"{record['pairs_per_s']:.0f}")
                seen_total, bad_total = seen_total + pairs, bad_total + bad
                if max_bad_fraction is not None and seen_total >= BAD_SHARE_AFTER and bad_total > max_bad_fraction * seen_total:
                    checkpoint(done)
                    bar.close()
                    raise DataError(f"{bad_total} of the {seen_total} samples loaded so far were bad ({bad_total / seen_total:.1%}), "
                                    f"more than data.max_bad_fraction={max_bad_fraction:g}; `vlp data check` lists them")
                n_sum, pairs, data_time = 0, 0, 0.0
                t_window = time.perf_counter()
            bar.update(1)
            saved = bool(cfg.ckpt_every and done % cfg.ckpt_every == 0 and done != cfg.steps)
            if saved:
                checkpoint(done)
            if validation is not None and (done % validation.every == 0 or done == cfg.steps):
                validate(done)
            if done != cfg.steps and stopping:
                if not saved:
                    checkpoint(done)
                bar.close()
                names = ", ".join(sorted({signal.Signals(s).name for s in stop})) or "a stop signal on another rank"
                where = (f"stopped by {names} after step {done} of {cfg.steps}; checkpoint "
                         f"{run_dir / 'checkpoints' / f'step_{done:07d}'}")
                raise Preempted(f"{where}. Resume: run the same command with --resume auto (or train.resume=auto; "
                                f"the run's config: {run_dir / 'config.yaml'})", where)
    bar.close()
    checkpoint(cfg.steps)
    return record
