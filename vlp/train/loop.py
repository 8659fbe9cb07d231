"""One accelerate-based training loop for every task.

A task is an ``nn.Module`` whose ``forward(batch, step=...)`` returns a dict of scalar tensors with
``loss``; it may define ``after_optimizer_step(step)`` (momentum updates, the LTD multiplier;
``step`` counts optimizer steps) and ``extra_state()`` (tensors checkpointed next to the model).
The loop knows nothing else.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedDataParallelKwargs
from torch import nn

from vlp.config import ConfigError, TrainConfig
from vlp.dist import mean_over_ranks
from vlp.train.checkpoint import save_checkpoint
from vlp.train.logging import MetricsLog, progress
from vlp.train.optim import build_optimizer, lr_at, trainable
from vlp.train.swa import WeightAverager


def make_accelerator(cfg: TrainConfig, find_unused_parameters: bool = False) -> Accelerator:
    """Single process on CPU, or whatever ``accelerate launch`` set up. Queues are not re-broadcast.
    ``find_unused_parameters``: DDP tolerates parameters the loss does not reach (a head whose loss
    weight is 0).

    accelerate keeps its precision settings in a process-wide singleton; it is cleared here (the
    process-group state is kept) so that jobs run one after another in one process - demo, tests,
    notebooks - may each choose their own ``train.precision``.
    """
    AcceleratorState._reset_state()
    return Accelerator(
        mixed_precision="bf16" if cfg.precision == "bf16" else "no",
        cpu=not torch.cuda.is_available(),
        kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False,
                                                       find_unused_parameters=find_unused_parameters)],
    )


def apply_train_options(task: nn.Module, cfg: TrainConfig) -> None:
    """Model-side switches of the train config (before ``prepare``): activation checkpointing."""
    if cfg.grad_checkpointing:
        model = getattr(task, "model", None)
        if not hasattr(model, "set_grad_checkpointing"):
            raise ConfigError(f"config key 'train.grad_checkpointing': not available for {type(model).__name__} "
                              "(ALBEF-family models only)")
        model.set_grad_checkpointing(True)


def set_lr(optimizer: torch.optim.Optimizer, step: int, cfg: TrainConfig) -> float:
    """The scheduled learning rate of ``step`` (0-based) into every parameter group."""
    lr = lr_at(step, cfg)
    for g in optimizer.param_groups:
        g["lr"] = lr
    return lr


def optimizer_step(acc: Accelerator, optimizer: torch.optim.Optimizer, inner: nn.Module,
                   params: list[torch.Tensor], step: int, cfg: TrainConfig) -> None:
    """Clip, step, clear gradients, then the task's post-step hook (momentum EMA, LTD multiplier)."""
    if cfg.grad_clip:
        acc.clip_grad_norm_(params, cfg.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if hasattr(inner, "after_optimizer_step"):
        inner.after_optimizer_step(step + 1)


@dataclass
class Validation:
    """Periodic validation: ``evaluate(task, step) -> metrics`` (the unwrapped task, eval mode, no
    grad) every ``every`` optimizer steps; the checkpoint with the highest ``metrics[select]`` is kept."""

    evaluate: Callable[[nn.Module, int], dict[str, float]]
    select: str
    every: int

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"validation every {self.every} steps: expected >= 1")


def endless_batches(loader: Iterable) -> Iterator[Any]:
    epoch = 0
    while True:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        for batch in loader:
            yield batch
        epoch += 1


def train(
    task: nn.Module,
    loader: Iterable,
    cfg: TrainConfig,
    run_dir: str | Path,
    state: Optional[dict[str, Any]] = None,
    accelerator: Optional[Accelerator] = None,
    checkpoint_module: Optional[Callable[[nn.Module], nn.Module]] = None,
    validation: Optional[Validation] = None,
) -> dict[str, float]:
    """Train ``task`` for ``cfg.steps`` steps; log to ``run_dir/metrics.jsonl``; checkpoint to
    ``run_dir/checkpoints/step_N``. ``state`` is stored in every checkpoint's ``state.json``;
    ``checkpoint_module`` picks what is saved from the unwrapped task (default: ``task.model``).
    ``validation``: evaluate every ``validation.every`` steps and at the end (main process; the
    others wait), log to ``run_dir/val_metrics.jsonl`` and keep the best checkpoint in
    ``run_dir/checkpoints/best``. Returns the last logged record."""
    run_dir = Path(run_dir)
    acc = accelerator or make_accelerator(cfg)
    apply_train_options(task, cfg)
    optimizer = build_optimizer(task, cfg)
    task, optimizer, loader = acc.prepare(task, optimizer, loader)
    inner = acc.unwrap_model(task)
    to_save = (checkpoint_module or (lambda t: t.model))(inner)
    log = MetricsLog(run_dir / "metrics.jsonl")
    params = [p for g in optimizer.param_groups for p in g["params"]]  # lambda is not among them
    averager = None
    if cfg.average.snapshots:
        epoch_steps = len(loader) if hasattr(loader, "__len__") else None
        averager = WeightAverager([p for _, p in trainable(inner)], cfg.average, cfg.steps, epoch_steps)

    def save(step: int, name: Optional[str] = None, info: Optional[dict] = None) -> None:  # main process only
        extra = inner.extra_state() if hasattr(inner, "extra_state") else None
        info = dict(info or {})
        if averager is not None and averager.history:
            info["averaged"] = averager.history
        save_checkpoint(run_dir / "checkpoints" / (name or f"step_{step:07d}"), to_save,
                        {**(state or {}), "step": step, **info}, extra)

    def checkpoint(step: int) -> None:
        acc.wait_for_everyone()
        if acc.is_main_process:
            save(step)

    best: dict[str, Any] = {}

    def validate(step: int) -> None:
        acc.wait_for_everyone()
        if acc.is_main_process:
            task.eval()
            with torch.no_grad():
                metrics = validation.evaluate(inner, step)
            task.train()
            value = metrics[validation.select]
            improved = not best or value > best["value"]
            MetricsLog(run_dir / "val_metrics.jsonl").write({"step": step, **metrics, "best": improved})
            print(f"validation at step {step}: {validation.select} {value:.2f}"
                  + (" (best so far)" if improved else f" (best {best['value']:.2f} at step {best['step']})"))
            if improved:
                best.update(metric=validation.select, value=value, step=step)
                save(step, "best", {"best": dict(best), "val": metrics})
        acc.wait_for_everyone()

    bar = progress(cfg.steps, "train", cfg.progress and acc.is_main_process)
    batches = endless_batches(loader)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    n_sum, pairs, t_window, data_time = 0, 0, time.perf_counter(), 0.0
    record: dict[str, float] = {}
    task.train()
    micro = cfg.grad_accum_steps
    for step in range(cfg.steps):
        lr = set_lr(optimizer, step, cfg)
        outs = []
        for m in range(micro):  # gradients of `micro` batches, one optimizer step (docs/training.md)
            t0 = time.perf_counter()
            batch = next(batches)
            data_time += time.perf_counter() - t0
            with acc.no_sync(task) if m < micro - 1 else contextlib.nullcontext():
                out = task(batch, step=step)
                acc.backward(out["loss"] / micro)
            outs.append(out)
        optimizer_step(acc, optimizer, inner, params, step, cfg)
        if averager is not None:
            averager.after_step(step + 1)

        for out in outs:
            for k, v in out.items():
                x = float(v.detach())
                sums.setdefault(k, 0.0), counts.setdefault(k, 0)
                if x == x:  # NaN = "not measured this step" (e.g. no same-image negatives): not averaged
                    sums[k], counts[k] = sums[k] + x, counts[k] + 1
        n_sum += micro
        pairs += micro * len(batch["input_ids"]) * acc.num_processes
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            dt = time.perf_counter() - t_window
            means = mean_over_ranks({k: v / counts[k] if counts[k] else float("nan") for k, v in sums.items()})
            means = {k: v for k, v in means.items() if v == v}  # measured by no rank in the window: not logged
            record = {"step": done, "lr": lr, **means, "pairs_per_s": pairs / dt, "data_time": data_time / n_sum}
            if acc.is_main_process:
                log.write(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", pairs_s=f"{record['pairs_per_s']:.0f}")
            sums, counts, n_sum, pairs, data_time, t_window = {}, {}, 0, 0, 0.0, time.perf_counter()
        bar.update(1)
        if cfg.ckpt_every and done % cfg.ckpt_every == 0 and done != cfg.steps:
            checkpoint(done)
        if validation is not None and (done % validation.every == 0 or done == cfg.steps):
            validate(done)
    bar.close()
    checkpoint(cfg.steps)
    return record
