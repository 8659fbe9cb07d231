"""The run's checkpoints: ``checkpoints/step_N`` as the loop takes them (model, ``state.json``, the
task's extra state and, with ``train.save_state``, every rank's training state: :mod:`vlp.train.state`),
the best checkpoint of the validation (``checkpoints/best``), pruning to ``train.keep_last``, resuming
from ``train.resume`` (later step checkpoints set aside), and the shared-filesystem check of a
multi-node run.

The checkpoint format itself, both sides, lives in the floor (:mod:`vlp.weights`): the writer
(``save_checkpoint``: staged folder, fsync, manifest, atomic rename) and the reader (manifest
verification, newest valid checkpoint of a run).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
from accelerate import Accelerator
from torch import nn

from vlp import dist as vdist
from vlp.config import TrainConfig
from vlp.errors import CheckpointError, ConfigError
from vlp.train.logging import MetricsLog
from vlp.train.setup import Prepared, viewed_as
from vlp.train.state import TRAIN_STATE, load_train_state, save_train_state
from vlp.train.swa import WeightAverager
from vlp.weights import (
    find_checkpoint,
    publish,
    reached,
    read_state,
    save_checkpoint,
    staging,
    step_checkpoints,
    write_failure,
    write_parts,
)

logger = logging.getLogger(__name__)

SUPERSEDED = "superseded"
#: what a full disk while writing a training checkpoint advises (:func:`vlp.weights.write_failure`)
RESUME_ADVICE = "free some space (e.g. train.keep_last to keep fewer checkpoints) and resume"


def set_aside_checkpoints_after(run_dir: Path, step: int) -> list[Path]:
    """Move the step checkpoints after ``step`` to ``checkpoints/superseded/`` (a resumed run redoes
    those steps; they are kept, not deleted, and no longer count for resume or ``keep_last``)."""
    later = [p for p in step_checkpoints(run_dir) if int(p.name.split("_")[1]) > step]
    if not later:
        return []
    aside = run_dir / "checkpoints" / SUPERSEDED
    aside.mkdir(exist_ok=True)
    moved = []
    for p in later:
        target = aside / p.name
        shutil.rmtree(target, ignore_errors=True)
        os.replace(p, target)
        moved.append(target)
    return moved


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` step checkpoints (``best`` is never touched). A step
    folder that is a symbolic link is not the run's own: it is neither counted nor followed."""
    own = [p for p in step_checkpoints(run_dir) if not p.is_symlink()]
    old = own[:-keep] if keep > 0 else []
    for p in old:
        shutil.rmtree(p)
    return old


SHARED_FS_MARKER = ".vlp-shared-fs-check"


def _read_token(marker: Path, patience_s: float) -> int:
    """The token in ``marker``; 0 if it cannot be read within ``patience_s`` (a network filesystem
    may show a file created on another node a moment later)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return int(marker.read_text().strip())
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return 0
            time.sleep(0.25)


def check_shared_filesystem(run_dir: str | Path, device: torch.device, patience_s: float = 5.0) -> None:
    """With several processes, make sure every rank sees the run directory rank 0 sees: each rank
    writes its own training-state files into the checkpoint folders rank 0 publishes, so they must
    share one filesystem. Rank 0 writes ``run_dir/.vlp-shared-fs-check`` holding a random token
    (sent to the others by an all-reduce on ``device``, the run's); every rank reads it back (a stale
    marker of an earlier run holds another token); rank 0 removes it. If any rank could not read it,
    every rank raises :class:`ConfigError` naming the directory and those ranks. No-op on one process.
    Every rank must call it at the same point."""
    if not vdist.is_dist():
        return
    run_dir = Path(run_dir)
    marker, me, world = run_dir / SHARED_FS_MARKER, vdist.rank(), vdist.world_size()
    token = torch.zeros(1, dtype=torch.int64, device=device)
    if me == 0:
        value = secrets.randbits(62) + 1  # not from the seeded generators: the run's draws stay as they were
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            tmp = marker.with_name(marker.name + ".tmp")
            tmp.write_text(str(value))
            os.replace(tmp, marker)
        except OSError as e:  # then no rank reads it (rank 0 included): reported below with the others
            logger.warning(f"warning: could not write {marker}: {e}")
        token.fill_(value)
    vdist.all_reduce_(token, "max")
    vdist.barrier()
    missing = _read_token(marker, patience_s) != int(token.item())
    which = vdist.any_over_ranks([missing and r == me for r in range(world)], device=device).tolist()
    vdist.barrier()  # every rank has read it before it goes
    if me == 0:
        marker.unlink(missing_ok=True)
    blind = [r for r, b in enumerate(which) if b]
    if blind:
        ranks = f"rank {blind[0]}" if len(blind) == 1 else f"ranks {', '.join(map(str, blind))}"
        raise ConfigError(
            f"output_dir {run_dir}: {ranks} of {world} processes could not read the file {SHARED_FS_MARKER} "
            f"that rank 0 wrote there: the processes do not share this directory. Multi-process "
            f"checkpoints need a filesystem shared by every node (each rank writes its training state "
            f"into the checkpoint folders): put output_dir on shared storage that every node mounts at "
            f"the same path (see docs/training.md, 'Checkpoints need a shared filesystem')"
        )


class Checkpointer:
    """Saves and restores one run: ``module`` (what is saved of the unwrapped task, e.g. its model)
    and the prepared optimizer and task of ``prep``. ``state`` goes into every ``state.json``, with
    the step, the world size and the snapshot steps of ``averager``'s averages; ``files`` (name ->
    text, e.g. ``preprocessor.json``) into every checkpoint folder. Every rank calls :meth:`save` and
    :meth:`resume` at the same step."""

    def __init__(
        self,
        acc: Accelerator,
        cfg: TrainConfig,
        run_dir: Path,
        prep: Prepared,
        module: nn.Module,
        state: Optional[dict[str, Any]] = None,
        averager: Optional[WeightAverager] = None,
        files: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.acc, self.cfg, self.run_dir, self.files = acc, cfg, run_dir, files
        self.optimizer, self.task, self.scalars = prep.optimizer, prep.inner, prep.scalars
        self.module, self.run_state, self.averager = module, state, averager
        # the run's sample counts ({"seen": n, "bad": k}, as of the last log step) for every
        # state.json, and each rank's open log window for its train state (both set by the loop);
        # those of the checkpoint a resume started from
        self.samples: Optional[Callable[[], dict[str, int]]] = None
        self.window: Optional[Callable[[], dict[str, Any]]] = None
        self.resumed_samples: dict[str, int] = {"seen": 0, "bad": 0}
        self.resumed_window: Optional[dict[str, Any]] = None
        # the validation's state for every state.json (set by the loop: Validator.state), and the
        # resumed checkpoint's (None: none there)
        self.validation: Optional[Callable[[], dict[str, Any]]] = None
        self.resumed_validation: Optional[dict[str, Any]] = None
        self.loader = prep.loader  # a stream that knows its position (shards) has it checkpointed per rank
        self.resumed_stream: Optional[dict] = None

    def path(self, step: int) -> Path:
        """The folder of the checkpoint at ``step``: ``RUN/checkpoints/step_NNNNNNN`` (zero-padded to seven digits)."""
        return self.run_dir / "checkpoints" / f"step_{step:07d}"

    def extra_state(self) -> Optional[dict[str, torch.Tensor]]:
        """The task's tensors checkpointed next to the model (its ``extra_state()``); None when the task has none."""
        return self.task.extra_state() if hasattr(self.task, "extra_state") else None

    def state(self, step: int, **info: Any) -> dict[str, Any]:
        """``state.json`` of a checkpoint at ``step``, with ``info`` added."""
        averaged = {"averaged": self.averager.history} if self.averager is not None and self.averager.history else {}
        samples = {"samples": self.samples()} if self.samples is not None else {}
        validation = {"validation": self.validation()} if self.validation is not None else {}
        return {
            **(self.run_state or {}),
            "step": step,
            "world_size": self.acc.num_processes,
            **averaged,
            **samples,
            **validation,
            **info,
        }

    def save(self, step: int) -> None:
        """``checkpoints/step_N``: staged in step_N.tmp/ (main process: model, state; every rank: its
        train state), then published with a manifest by the main process, and old checkpoints pruned.
        If any rank fails to write its part (a full disk), the staging folder is removed and every
        rank raises: :class:`CheckpointError` naming the folder and its free space on the rank that
        failed (:func:`vlp.weights.write_failure`), and one saying so on the others."""
        acc = self.acc
        final = self.path(step)
        tmp = final.with_name(final.name + ".tmp")

        def main_parts() -> None:
            staging(final)
            with viewed_as(self.scalars, ()):
                state = self.state(step, data_position={"batches": step * self.cfg.grad_accum_steps})
                write_parts(tmp, self.module, state, self.extra_state(), self.files)

        def rank_parts() -> None:  # optimizer, task state, RNG states: every rank writes its part
            with viewed_as(self.scalars, ()):
                position = getattr(self.loader, "position", None)
                save_train_state(
                    tmp / TRAIN_STATE,
                    self.optimizer,
                    self.task,
                    self.module,
                    acc.process_index,
                    position() if position is not None else None,
                    self.window() if self.window is not None else None,
                )
            reached("train_state", tmp)

        def publish_parts() -> None:
            publish(tmp, final)
            prune_checkpoints(self.run_dir, self.cfg.keep_last)
            reached("pruned", final)

        acc.wait_for_everyone()
        self._together(main_parts if acc.is_main_process else None, tmp, final)
        self._together(rank_parts if self.cfg.save_state else None, tmp, final)
        self._together(publish_parts if acc.is_main_process else None, tmp, final)

    def _together(self, work: Optional[Callable[[], None]], tmp: Path, final: Path) -> None:
        """Run this rank's ``work`` (None: nothing to do), then learn from every rank whether one
        failed (one all-reduce, also the barrier between the phases); if so, remove ``tmp`` (main
        process) and raise on every rank."""
        failure: Optional[Exception] = None
        if work is not None:
            try:
                work()
            except Exception as e:
                failure = e
        if not bool(vdist.any_over_ranks([failure is not None], device=self.acc.device).item()):
            return
        if self.acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        if failure is None:
            raise CheckpointError(f"checkpoint {final}: another process failed to write its part (its error says why)")
        raised = write_failure(failure, final, RESUME_ADVICE)
        if raised is failure:
            raise failure
        raise raised from None

    def save_best(self, step: int, best: dict[str, Any], metrics: dict[str, Any]) -> None:
        """``checkpoints/best`` (main process): the weights at ``step``, with the validation's
        ``best`` and ``metrics`` in its state."""
        with viewed_as(self.scalars, ()):
            save_checkpoint(
                self.run_dir / "checkpoints" / "best",
                self.module,
                self.state(step, best=dict(best), val=metrics),
                self.extra_state(),
                self.files,
                RESUME_ADVICE,
            )

    def resume(self, logs: Sequence[MetricsLog]) -> int:
        """Load ``train.resume``'s checkpoint (``auto``: the run directory's newest valid one) into the
        prepared task, optimizer and RNGs; returns its step. Records of later steps are dropped from
        the ``logs`` (``metrics.jsonl``, ``val_metrics.jsonl``: they are run again), and later
        checkpoints set aside. Its validation state: :attr:`resumed_validation`."""
        acc, cfg, run_dir = self.acc, self.cfg, self.run_dir
        if cfg.resume == "auto" and not step_checkpoints(run_dir):  # killed before its first checkpoint
            if acc.is_main_process:
                for log in logs:
                    log.truncate_after(0)
                logger.info(f"train.resume=auto: no checkpoint in {run_dir} yet; starting from step 0")
            acc.wait_for_everyone()
            return 0
        with viewed_as(self.scalars, ()):
            ckpt = find_checkpoint(
                run_dir if cfg.resume == "auto" else cfg.resume, require=[f"{TRAIN_STATE}/rng_rank0.json"]
            )
            saved = read_state(ckpt)
            if saved.get("world_size", acc.num_processes) != acc.num_processes:
                raise CheckpointError(
                    f"config key 'train.resume': {ckpt} was written by {saved['world_size']} processes, "
                    f"this run has {acc.num_processes}; resume with the same number of processes"
                )
            rank_state = load_train_state(
                ckpt, self.optimizer, self.task, self.module, acc.process_index, acc.num_processes
            )
            self.resumed_stream, self.resumed_window = rank_state["stream"], rank_state["window"]
            step = int(saved["step"])
            counts = saved.get("samples")
            if isinstance(counts, dict):  # checkpoints from before the counts were saved start from 0
                self.resumed_samples = {k: int(counts.get(k, 0)) for k in ("seen", "bad")}
            self.resumed_validation = saved.get("validation")  # None: written before it was saved
            if acc.is_main_process:
                for log in logs:
                    log.truncate_after(step)
                logger.info(f"resumed from {ckpt} at step {step} of {cfg.steps}")
                moved = set_aside_checkpoints_after(run_dir, step)
                if moved:
                    logger.info(
                        f"moved {len(moved)} checkpoint(s) of the steps run again (or corrupted) to {moved[0].parent}: "
                        + ", ".join(p.name for p in moved)
                    )
            acc.wait_for_everyone()
        return step
