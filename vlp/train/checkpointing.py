"""The run's checkpoints, as the loop takes them: ``checkpoints/step_N`` (model, ``state.json``, the
task's extra state and, with ``train.save_state``, every rank's training state), the best
checkpoint of the validation (``checkpoints/best``), pruning to ``train.keep_last``, and resuming
from ``train.resume``. The files themselves are written by :mod:`vlp.train.checkpoint` and
:mod:`vlp.train.train_state`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch
from accelerate import Accelerator
from torch import nn

from vlp import dist as vdist
from vlp.config import TrainConfig
from vlp.errors import CheckpointError
from vlp.train.checkpoint import (
    prune_checkpoints,
    publish,
    save_checkpoint,
    set_aside_checkpoints_after,
    staging,
    write_parts,
)
from vlp.train.logging import MetricsLog
from vlp.train.setup import Prepared, viewed_as
from vlp.train.swa import WeightAverager
from vlp.train.train_state import TRAIN_STATE, load_train_state, save_train_state
from vlp.weights import find_checkpoint, read_state, step_checkpoints, write_failure


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
        # the run's sample counts ({"seen": n, "bad": k}) for every state.json (set by the loop), and
        # those of the checkpoint a resume started from
        self.samples: Optional[Callable[[], dict[str, int]]] = None
        self.resumed_samples: dict[str, int] = {"seen": 0, "bad": 0}
        self.loader = prep.loader  # a stream that knows its position (shards) has it checkpointed per rank
        self.resumed_stream: Optional[dict] = None

    def path(self, step: int) -> Path:
        return self.run_dir / "checkpoints" / f"step_{step:07d}"

    def extra_state(self) -> Optional[dict[str, torch.Tensor]]:
        return self.task.extra_state() if hasattr(self.task, "extra_state") else None

    def state(self, step: int, **info: Any) -> dict[str, Any]:
        """``state.json`` of a checkpoint at ``step``, with ``info`` added."""
        averaged = {"averaged": self.averager.history} if self.averager is not None and self.averager.history else {}
        samples = {"samples": self.samples()} if self.samples is not None else {}
        return {
            **(self.run_state or {}),
            "step": step,
            "world_size": self.acc.num_processes,
            **averaged,
            **samples,
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
                )

        def publish_parts() -> None:
            publish(tmp, final)
            prune_checkpoints(self.run_dir, self.cfg.keep_last)

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
        raised = write_failure(failure, final)
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
            )

    def resume(self, log: MetricsLog) -> int:
        """Load ``train.resume``'s checkpoint (``auto``: the run directory's newest valid one) into the
        prepared task, optimizer and RNGs; returns its step. Records of later steps are dropped from
        the log (they are run again), and later checkpoints set aside."""
        acc, cfg, run_dir = self.acc, self.cfg, self.run_dir
        if cfg.resume == "auto" and not step_checkpoints(run_dir):  # killed before its first checkpoint
            if acc.is_main_process:
                log.truncate_after(0)
                print(f"train.resume=auto: no checkpoint in {run_dir} yet; starting from step 0")
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
            self.resumed_stream = load_train_state(
                ckpt, self.optimizer, self.task, self.module, acc.process_index, acc.num_processes
            )
            step = int(saved["step"])
            counts = saved.get("samples")
            if isinstance(counts, dict):  # checkpoints from before the counts were saved start from 0
                self.resumed_samples = {k: int(counts.get(k, 0)) for k in ("seen", "bad")}
            if acc.is_main_process:
                log.truncate_after(step)
                print(f"resumed from {ckpt} at step {step} of {cfg.steps}")
                moved = set_aside_checkpoints_after(run_dir, step)
                if moved:
                    print(
                        f"moved {len(moved)} checkpoint(s) of the steps run again (or corrupted) to {moved[0].parent}: "
                        + ", ".join(p.name for p in moved)
                    )
            acc.wait_for_everyone()
        return step
