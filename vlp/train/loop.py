"""One accelerate-based training loop for every task.

A task is an ``nn.Module`` whose ``forward(batch, step=...)`` returns a dict of scalar tensors with
``loss`` and whose ``batch_report(batch)`` says what a batch holds (:class:`TrainTask`); it may
define ``after_optimizer_step(step, skipped=None)`` (momentum updates, the LTD multiplier; ``step``
counts optimizer steps, ``skipped`` is a 0-d bool device tensor: the step was skipped and must
leave no trace), ``unused_parameters()`` (names of parameters its configured objective never
reaches: frozen before the optimizer is built, so DDP needs no ``find_unused_parameters``) and
``extra_state()`` (tensors checkpointed next to the model) and ``log_warnings(record)`` (messages
about a log record, printed by the main process: e.g. SRCL that hardly regulates). The loop knows
nothing else. Between
two log steps it reads nothing back from the device (:mod:`vlp.train.step_stats`).

Set-up is :mod:`vlp.train.setup`, checkpoints :mod:`vlp.train.checkpoints`, validation
:mod:`vlp.train.validation`, the log window :mod:`vlp.train.step_stats`, the log
:mod:`vlp.train.logging`, stop signals :mod:`vlp.train.preemption`.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, NoReturn, Optional, Protocol, cast

import torch
from accelerate import Accelerator, skip_first_batches
from torch import nn
from torch.utils.data import DataLoader

from vlp.config import TrainConfig
from vlp.errors import DataError
from vlp.errors import NonFiniteError as NonFiniteError  # raised here, caught by vlp.cli
from vlp.train.checkpoints import Checkpointer, check_shared_filesystem
from vlp.train.compile_watch import CompileWatch
from vlp.train.logging import MetricsLog, open_loggers
from vlp.train.post_step import PostStep, compiled_post_step
from vlp.train.preemption import StopRequest, how_to_resume, preempted, stop_agreed, stop_signals, stopped_at
from vlp.train.setup import make_accelerator, prepare_training, warn_if_cuda_graphs_skipped
from vlp.train.step import stateful_modules, train_step
from vlp.train.step_stats import Reporter
from vlp.train.swa import WeightAverager, snapshot_averager
from vlp.train.validation import Validation, Validator

logger = logging.getLogger(__name__)

#: the bad-sample share is judged once this many samples were loaded (a few bad ones in the first
#: batches are not a trend)
BAD_SHARE_AFTER = 100


class TrainTask(Protocol):
    """What the loop calls on a task besides the optional hooks of the module docstring."""

    def __call__(self, batch: dict[str, Any], step: int = 0) -> dict[str, torch.Tensor]: ...

    def batch_report(self, batch: dict[str, Any]) -> tuple[int, Optional[torch.Tensor | int]]:
        """``(pairs, bad_samples)``: the batch's pairs on this rank, and the bad loads its items
        replaced (a 0-d tensor or an int; None: not counted), read without a device sync."""
        ...


def endless_batches(loader: Iterable, start: int = 0, stream: Optional[dict[str, Any]] = None) -> Iterator[Any]:
    """Batches over epochs without end, from batch ``start`` of the whole sequence (resume): a
    loader with ``set_position`` seeks there itself (with its checkpointed ``stream`` position,
    when there is one: its readers' units and the bad samples they met), others skip the first batches of the epoch."""
    epoch, skip = divmod(start, len(loader)) if start else (0, 0)
    while True:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        source = loader
        if skip and hasattr(loader, "set_position"):
            units, bad = (stream or {}).get("reader_units"), (stream or {}).get("reader_bad")
            same = stream is not None and (stream.get("epoch"), stream.get("batches_done")) == (epoch, skip)
            loader.set_position(epoch, skip, *([units, bad] if same and units else []))
        elif skip:
            source = (
                skip_first_batches(loader, skip)
                if isinstance(loader, DataLoader)
                else itertools.islice(loader, skip, None)
            )
        skip = 0
        yield from source
        epoch += 1


def stop_run(rep: Reporter, checkpointer: Checkpointer, step: int, error: Exception, saved: bool = False) -> NoReturn:
    """End the run after ``step``: checkpoint it (unless ``saved`` already), close the progress bar,
    raise ``error``."""
    if not saved:
        checkpointer.save(step)
    rep.bar.close()
    raise error


def stop_on_data_error(
    run: _Run, stop: StopRequest, step: int, steps: int, saved_at: int, error: Exception
) -> NoReturn:
    """End the run whose optimizer step ``step`` (0-based) failed to get its data (``error``: a
    :class:`~vlp.errors.DataError` or an ``OSError``: shards gone, unreadable, bad under
    ``data.on_bad_sample=raise``). The half-begun step is undone (queues, gradients). A run that
    trained a step since it started checkpoints step ``step`` first (unless ``saved_at``, its newest
    checkpoint's step, is that one), as a stop signal does, and raises a :class:`DataError` with
    ``error``'s message, where it stopped and how to resume (:func:`~vlp.train.preemption.stopped_at`).
    With several processes the others are inside a step (a collective no save can join): no checkpoint,
    and the message says to resume from the last one. Before any step: ``error`` as it is."""
    for m in run.undo:
        cast(Any, m).discard_step()
    run.optimizer.zero_grad(set_to_none=True)
    run.inner.zero_grad(set_to_none=True)
    run.rep.bar.close()
    if step == run.start:
        raise error
    stop.acting()  # a stop signal now waits for the checkpoint (no watchdog)
    if run.acc.num_processes > 1:
        last = (
            f"resume from its last checkpoint (step {saved_at}): {how_to_resume()}" if saved_at else "no checkpoint yet"
        )
        raise DataError(
            f"{one_line(error)}; the run stopped after step {step} of {steps} without a checkpoint (the other "
            f"processes were inside a step); {last}"
        ) from error
    if saved_at != step:
        run.ckpt.save(step)
    raise DataError(f"{one_line(error)}; {stopped_at(step, steps, run.ckpt.path(step))}") from error


def one_line(error: Exception) -> str:
    """``error``'s message; of an error a data loader worker raised (``Caught X in DataLoader worker
    process N`` and the worker's traceback), the original message, its last line."""
    text = str(error)
    if not (text.startswith("Caught ") and "Original Traceback" in text):
        return text
    last = text.strip().splitlines()[-1]  # "vlp.errors.DataError: the message"
    return last.split(": ", 1)[1] if ": " in last else last


def log_step(
    rep: Reporter, checkpointer: Checkpointer, step: int, lr: float, cfg: TrainConfig, max_bad_fraction: Optional[float]
) -> dict[str, float]:
    """The log step after optimizer step ``step``: read the window back (its one device read), warn
    of its skipped steps, write its record (returned). The run stops with a checkpoint of the last
    good state once ``train.max_nonfinite_steps`` steps in a row were skipped
    (:class:`NonFiniteError`), or once more than ``max_bad_fraction`` of the samples loaded so far
    were bad (:class:`~vlp.errors.DataError`)."""
    window = rep.read()
    for s in window.skipped:
        what = (
            f"step {s.step}: non-finite loss or gradient (loss {s.losses}, gradient norm "
            f"{s.norm if s.norm is not None else 'n/a'}); step skipped"
        )
        if window.halted_at == s.step:
            stop_run(
                rep,
                checkpointer,
                s.step,
                NonFiniteError(
                    f"{what}, {s.in_a_row} in a row (train.max_nonfinite_steps); checkpoint {checkpointer.path(s.step)} "
                    "holds the last good state (lower train.lr, set train.grad_clip or train.precision=fp32, naming "
                    f"them in train.resume_allow_changes; resume: {how_to_resume()})"
                ),
            )
        if rep.main:
            logger.warning(f"warning: {what} ({s.in_a_row} in a row; the run stops at {cfg.max_nonfinite_steps})")
    record = rep.write(step, lr, window)
    seen, bad = rep.seen_total, rep.bad_total
    if max_bad_fraction is not None and seen >= BAD_SHARE_AFTER and bad > max_bad_fraction * seen:
        stop_run(
            rep,
            checkpointer,
            step,
            DataError(
                f"{bad} of the {seen} samples loaded so far were bad ({bad / seen:.1%}), more than "
                f"data.max_bad_fraction={max_bad_fraction:g}; `vlp data check` lists them; "
                + stopped_at(step, cfg.steps, checkpointer.path(step))
            ),
        )
    rep.next_window()
    return record


def open_log(run_dir: Path, cfg: TrainConfig, main_process: bool, state: Optional[dict[str, Any]]) -> MetricsLog:
    """``run_dir/metrics.jsonl`` with the sinks of ``train.loggers`` (TensorBoard, W&B) behind it."""
    sinks = open_loggers(cfg.loggers, run_dir, main_process, cfg.wandb_project, (state or {}).get("config"))
    return MetricsLog(run_dir / "metrics.jsonl", sinks)


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
    files: Optional[Mapping[str, str]] = None,
) -> dict[str, float]:
    """Train ``task`` for ``cfg.steps`` steps; log to ``run_dir/metrics.jsonl``; checkpoint to
    ``run_dir/checkpoints/step_N``. ``state`` is stored in every checkpoint's ``state.json``; ``checkpoint_module``
    picks what is saved from the unwrapped task (default: ``task.model``); ``files`` (name -> text, e.g.
    ``preprocessor.json``) are written into every checkpoint folder. ``validation``: evaluate every
    ``validation.every`` steps and at the end (on every rank, sharded; the main process decides), before
    that step's checkpoint, log to ``run_dir/val_metrics.jsonl`` and keep the best checkpoint in
    ``run_dir/checkpoints/best`` (fine-tuning), or log to ``metrics.jsonl`` (pretraining's ``train.eval_every``:
    :mod:`vlp.train.validation`). Returns the last logged record."""
    run_dir = Path(run_dir)
    run = _set_up(task, loader, cfg, run_dir, state, accelerator, checkpoint_module, validation, files)
    acc, rep, ckpt, micro = run.acc, run.rep, run.ckpt, cfg.grad_accum_steps
    record: dict[str, float] = {}
    run.task.train()
    # SIGTERM / SIGUSR1: checkpoint at the next step boundary; the watch: what torch.compile did
    saved_at = run.start  # the step of the newest checkpoint of this run (the resumed one's)
    with stop_signals(cfg.stop_grace_s) as stop, run.log, CompileWatch() as compiled:
        for step in range(run.start, cfg.steps):
            # forward, backward, clip, non-finite check, optimizer, EMA, queues, statistics: no host read
            try:
                result = train_step(
                    acc,
                    run.task,
                    run.inner,
                    run.optimizer,
                    run.params,
                    lambda: rep.fetch(run.batches),
                    step,
                    cfg,
                    rep.stats,
                    undo=run.undo,
                    post=run.post,
                )
            except (DataError, OSError) as e:  # the data failed (gone, unreadable, bad past its policy)
                stop_on_data_error(run, stop, step, cfg.steps, saved_at, e)
            done = step + 1
            if step == run.start:
                warn_if_cuda_graphs_skipped(cfg, compiled.record())
            if run.averager is not None:  # weight averaging
                run.averager.after_step(done)
            # pairs: the last micro-batch's size, times the micro-steps and the processes
            rep.add_step(micro, micro * result.pairs * acc.num_processes)
            # log: one read of the device per window; several processes agree on a stop signal here
            is_log_step = done % cfg.log_every == 0 or done == cfg.steps
            stopping = stop_agreed(stop, is_log_step, acc.num_processes, acc.device)  # the step's phase ends
            if is_log_step:
                record = _log_and_warn(run, done, result.lr, cfg, max_bad_fraction)
            rep.bar.update(1)
            # validate (every rank; rank 0 keeps checkpoints/best), before the step's checkpoint: a run
            # resumed from it has every evaluation up to its step logged; not in the window's time
            if run.validate is not None and run.validate.due(done):
                with rep.paused():
                    run.validate(done)
                stop.phase_done()  # after a stop signal, the validation had train.stop_grace_s
            saved = bool(cfg.ckpt_every and done % cfg.ckpt_every == 0 and done != cfg.steps)  # checkpoint
            if saved:
                ckpt.save(done)
                saved_at = done
            stop.phase_done()  # after a stop signal, the save had train.stop_grace_s
            # stop on a signal: at this step boundary, with a checkpoint to resume from
            if done != cfg.steps and stopping:
                stop_run(rep, ckpt, done, preempted(stop, done, cfg.steps, ckpt.path(done)), saved=saved)
        rep.bar.close()
        stop.acting()  # the last checkpoint: a stop signal now is held until it is written (no watchdog)
        ckpt.save(cfg.steps)
    return record


@dataclass
class _Run:
    """What :func:`train` sets up before its first step: the accelerator, the prepared task
    (``task``; ``inner`` unwrapped), optimizer and trainable ``params``, the metrics log, the
    weight averager (or None), the checkpointer, the validator (or None), the step to start from
    (``start``: 0, or the resumed step), the log window's reporter, the endless batch stream, the
    task's optional ``log_warnings`` hook, the modules a skipped step must undo and the compiled
    post-step (or None)."""

    acc: Accelerator
    task: nn.Module
    inner: nn.Module
    optimizer: torch.optim.Optimizer
    params: list[torch.Tensor]
    log: MetricsLog
    averager: Optional[WeightAverager]
    ckpt: Checkpointer
    validate: Optional[Validator]
    start: int
    rep: Reporter
    batches: Iterator[Any]
    log_warnings: Optional[Callable[[dict[str, float]], Iterable[str]]]
    undo: list[nn.Module]
    post: Optional[PostStep]


def _set_up(
    task: nn.Module,
    loader: Iterable,
    cfg: TrainConfig,
    run_dir: Path,
    state: Optional[dict[str, Any]],
    accelerator: Optional[Accelerator],
    checkpoint_module: Optional[Callable[[nn.Module], nn.Module]],
    validation: Optional[Validation],
    files: Optional[Mapping[str, str]],
) -> _Run:
    """The set-up of :func:`train` (its arguments): accelerator, prepared task / optimizer / loader,
    logs, checkpoints, validation; resume from the last checkpoint under ``train.resume``. Returns
    the :class:`_Run`."""
    acc, micro = accelerator or make_accelerator(cfg), cfg.grad_accum_steps
    prep = prepare_training(acc, task, loader, cfg)
    check_shared_filesystem(run_dir, acc.device)  # every rank must see run_dir (checkpoints)
    log = open_log(run_dir, cfg, acc.is_main_process, state)  # metrics.jsonl + TensorBoard / W&B
    averager = snapshot_averager(prep.inner, prep.loader, cfg)
    saved_module = (checkpoint_module or (lambda t: t.model))(prep.inner)
    ckpt = Checkpointer(acc, cfg, run_dir, prep, saved_module, state, averager, files)
    validate = Validator(validation, acc, prep.task, prep.inner, cfg.steps, run_dir, log, ckpt) if validation else None
    val_log = validate.val_log if validate is not None else None
    if validate is not None and val_log is not None:  # the best so far, in every state.json
        ckpt.validation = validate.state
    start = ckpt.resume([log, *([val_log] if val_log is not None else [])]) if cfg.resume else 0
    if validate is not None and start:  # the validation as the uninterrupted run has it at `start`
        validate.resumed(ckpt.resumed_validation, start)
    rep = Reporter(acc, cfg, log, start, ckpt.resumed_samples, ckpt.resumed_window)
    ckpt.samples, ckpt.window = rep.sample_counts, rep.window_state  # into state.json / each rank's train state
    batches = endless_batches(prep.loader, start * micro, ckpt.resumed_stream)
    log_warnings = getattr(prep.inner, "log_warnings", None)  # the task's optional hook
    undo = stateful_modules(prep.inner)  # feature queues: a skipped step leaves no trace
    # train.compile=full: the post-step is one more graph
    post = compiled_post_step(acc, prep.optimizer, prep.inner, prep.params, undo, cfg)
    return _Run(
        acc=acc,
        task=prep.task,
        inner=prep.inner,
        optimizer=prep.optimizer,
        params=prep.params,
        log=log,
        averager=averager,
        ckpt=ckpt,
        validate=validate,
        start=start,
        rep=rep,
        batches=batches,
        log_warnings=log_warnings,
        undo=undo,
        post=post,
    )


def _log_and_warn(
    run: _Run, step: int, lr: float, cfg: TrainConfig, max_bad_fraction: Optional[float]
) -> dict[str, float]:
    """The log step after optimizer step ``step`` (:func:`log_step`), then the task's warnings about
    its record, printed by the main process. Returns the record."""
    record = log_step(run.rep, run.ckpt, step, lr, cfg, max_bad_fraction)
    for msg in run.log_warnings(record) if run.rep.main and run.log_warnings is not None else []:
        logger.warning(f"warning: {msg}")
    return record
