"""What the training loop learns about its steps between two log steps (the log window): on the
run's device (:class:`StepStats`), and on the host (:class:`Reporter`: wall time, pairs, time spent
waiting for data, the record written to ``metrics.jsonl`` and the sinks at a log step, the progress
bar, and the run's running count of samples and bad samples, the bad-sample budget).

A checkpoint taken between two log steps carries the open window (:meth:`Reporter.window_state`:
the host counters and this rank's device sums, read once at the checkpoint, itself a sync point),
so that after a resume the next log record and the run's counts are an uninterrupted run's.

A GPU runs ahead of the host only while the host never waits for a result. So nothing a step
produces is read back during the step: losses are summed on the device, the skip decision for a
non-finite step is a device tensor the optimizer and the stateful modules obey
(:func:`vlp.train.step.optimizer_step`), and the window is read with one transfer at the log step
(:meth:`StepStats.read`).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch
from accelerate import Accelerator

from vlp.config import TrainConfig
from vlp.dist import mean_over_ranks
from vlp.progress import progress
from vlp.train.logging import MetricsLog


@dataclass
class SkippedStep:
    """A step skipped for a non-finite loss or gradient (this rank's values)."""

    step: int
    losses: list[float]
    norm: Optional[float]  # None: not measured (DeepSpeed clips inside its engine)
    in_a_row: int


@dataclass
class Window:
    """The steps since the last log step, read once: means over the ranks, bad samples summed over
    the ranks, the skipped steps, and the step at which ``max_nonfinite`` skips in a row were reached."""

    means: dict[str, float]
    bad_samples: int
    skipped: list[SkippedStep] = field(default_factory=list)
    halted_at: Optional[int] = None


class StepStats:
    """Device-side accumulators of one log window (and the run of consecutive skipped steps, which
    spans windows). Once ``max_nonfinite`` steps in a row were skipped the run has *halted*: every
    later step is skipped too (:meth:`skip`), so the state stays the last good one until the log
    step reports it."""

    def __init__(self, device: torch.device, max_nonfinite: int, processes: int = 1) -> None:
        self.device, self.max_nonfinite, self.processes = device, max_nonfinite, processes
        self.in_a_row = torch.zeros((), dtype=torch.float64, device=device)
        self.halted_step = torch.full((), -1.0, dtype=torch.float64, device=device)
        self._reset()

    def _reset(self) -> None:
        # per set of output keys (in their order): [sum, count] vectors over those keys, so that a
        # micro-batch's outputs are added by a handful of vector ops, not a few ops per key
        self.sums: dict[tuple[str, ...], list[torch.Tensor]] = {}
        self.bad = torch.zeros((), dtype=torch.float64, device=self.device)
        self.records: list[
            tuple[int, bool, torch.Tensor]
        ] = []  # (step, norm measured, [skipped, in_a_row, norm, losses...])

    def skip(self, nonfinite: torch.Tensor) -> torch.Tensor:
        """The step's skip flag (0-d bool on the device): ``nonfinite`` (already agreed over the
        ranks) or the run has halted."""
        return nonfinite | (self.halted_step >= 0)

    def add_bad_samples(self, n: Optional[torch.Tensor | int]) -> None:
        """A batch's ``bad_samples`` count (a tensor or an int; None: none)."""
        if n is not None:
            self.bad = self.bad + torch.as_tensor(n, device=self.device).to(torch.float64)

    def add_step(
        self, step: int, outs: list[dict[str, torch.Tensor]], norm: Optional[torch.Tensor], skipped: torch.Tensor
    ) -> None:
        """Step ``step`` (1-based) with its micro-batches' outputs ``outs`` (0-d tensors; NaN = not
        measured), its gradient norm and its skip flag. A skipped step adds nothing to the means."""
        self.prepare(outs)
        self.record(step, norm is not None, self.update(float(step), outs, norm, skipped))

    def prepare(self, outs: list[dict[str, torch.Tensor]]) -> None:
        """Create the accumulators of ``outs``' key sets that the window lacks (its first step), so
        that :meth:`update` only reads and replaces tensors: a compiled post-step graph
        (:mod:`vlp.train.post_step`) then sees the same structure at every step."""
        for out in outs:
            if tuple(out) not in self.sums:
                zeros = torch.zeros(len(out), dtype=torch.float64, device=self.device)
                self.sums[tuple(out)] = [zeros, zeros.clone()]

    def update(
        self,
        step: float | torch.Tensor,
        outs: list[dict[str, torch.Tensor]],
        norm: Optional[torch.Tensor],
        skipped: torch.Tensor,
    ) -> torch.Tensor:
        """The device-side part of :meth:`add_step` (after :meth:`prepare`): the skip run, the
        halt, the sums; returns the step's record ``[skipped, in_a_row, norm (NaN: not measured),
        losses...]`` (fp64). ``step``: 1-based, a number or a 0-d tensor (no host value inside a
        compiled graph)."""
        newly_halted = skipped & (self.in_a_row + 1 >= self.max_nonfinite) & (self.halted_step < 0)
        self.in_a_row = (self.in_a_row + 1) * skipped
        self.halted_step = torch.where(newly_halted, step, self.halted_step)
        keep = ~skipped
        losses = []
        for out in outs:
            keys = tuple(out)
            vals = torch.stack([self._here(v) for v in out.values()]).to(torch.float64)  # [K]
            ok = keep & ~torch.isnan(vals)
            acc = self.sums[keys]
            acc[0] = acc[0] + torch.where(ok, vals, 0.0)
            acc[1] = acc[1] + ok
            losses.append(vals[keys.index("loss") : keys.index("loss") + 1])
        head = [skipped, self.in_a_row] + ([norm.detach().reshape(())] if norm is not None else [])
        rec = torch.cat([torch.stack(head).to(torch.float64), *losses])
        if norm is None:  # [skipped, in_a_row, NaN, losses...]
            rec = torch.cat([rec[:2], rec.new_full((1,), math.nan), rec[2:]])
        return rec

    def record(self, step: int, measured: bool, rec: torch.Tensor) -> None:
        """Keep step ``step``'s record (from :meth:`update`; ``measured``: it holds a gradient norm)
        until the window is read."""
        self.records.append((step, measured, rec))

    def state(self) -> dict[str, Any]:
        """This rank's open window and run of skipped steps, for a checkpoint (:meth:`load_state`
        restores it): the sum and count vectors of each key set, the bad samples, the skip run, the
        halt and the step records, as the device tensors themselves (saved exactly, fp64)."""
        return {
            "sums": [[list(keys), total, n] for keys, (total, n) in self.sums.items()],
            "bad": self.bad,
            "in_a_row": self.in_a_row,
            "halted_step": self.halted_step,
            "records": [[step, measured, rec] for step, measured, rec in self.records],
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue the window :meth:`state` saved (its tensors moved to this run's device)."""
        dev = self.device
        self.sums = {tuple(keys): [total.to(dev), n.to(dev)] for keys, total, n in state["sums"]}
        self.bad, self.in_a_row, self.halted_step = (state[k].to(dev) for k in ("bad", "in_a_row", "halted_step"))
        self.records = [(int(step), bool(measured), rec.to(dev)) for step, measured, rec in state["records"]]

    def _here(self, v: torch.Tensor) -> torch.Tensor:
        """An output as a 0-d tensor on the run's device: a host scalar (e.g. a 0-d CPU tensor among
        CUDA outputs) is filled in by value, never copied from pageable memory."""
        v = v.detach().reshape(())
        if v.device.type == "cpu" and self.device.type != "cpu":
            return torch.full((), float(v), dtype=torch.float64, device=self.device)
        return v

    def _means(self) -> dict[str, torch.Tensor]:
        """The window's mean of each output key (0-d, NaN when never measured): sums and counts of
        every key set, added per key."""
        sums: dict[str, torch.Tensor] = {}
        counts: dict[str, torch.Tensor] = {}
        for keys, (total, n) in self.sums.items():
            for k, t, c in zip(keys, total.unbind(), n.unbind()):
                sums[k], counts[k] = (sums[k] + t, counts[k] + c) if k in sums else (t, c)
        return {k: sums[k] / counts[k] for k in sums}

    def read(self) -> Window:
        """Reduce over the ranks and read the window back (the one host transfer of the window);
        starts the next window."""
        means = mean_over_ranks({**self._means(), "bad_samples": self.bad}, device=self.device)
        keys = sorted(means)
        flat = torch.cat(
            [torch.stack([means[k] for k in keys]), self.halted_step.reshape(1), *[rec for _, _, rec in self.records]]
        ).tolist()
        values = dict(zip(keys, flat[: len(keys)]))
        halted = int(flat[len(keys)])
        at = len(keys) + 1
        skipped = []
        for step, measured, rec in self.records:
            row, at = flat[at : at + len(rec)], at + len(rec)
            if row[0] and not (0 <= halted < step):  # steps skipped only because the run had halted: not reported
                skipped.append(SkippedStep(step, row[3:], row[2] if measured else None, int(row[1])))
        bad = round(values.pop("bad_samples") * self.processes)
        self._reset()
        return Window({k: v for k, v in values.items() if v == v}, bad, skipped, halted if halted >= 0 else None)


class Reporter:
    """The log of a run that starts at step ``start``: ``stats`` (device side) and the host-side
    counters of the current window, the progress bar (``bar``), and ``seen_total`` / ``bad_total``:
    samples (all ranks) loaded since the run began (``seen``: carried over from the checkpoint a
    resume starts from), and the bad ones among them, as of the last log step. ``window``: the open
    window a resume's checkpoint saved (:meth:`window_state`), continued."""

    def __init__(
        self,
        acc: Accelerator,
        cfg: TrainConfig,
        log: MetricsLog,
        start: int,
        seen: Optional[dict[str, int]] = None,
        window: Optional[dict[str, Any]] = None,
    ) -> None:
        self.log, self.main = log, acc.is_main_process
        self.bar = progress(cfg.steps, "train", cfg.progress and acc.is_main_process)
        self.bar.update(start)
        self.stats = StepStats(acc.device, cfg.max_nonfinite_steps, acc.num_processes)
        self.seen_total, self.bad_total = (seen or {}).get("seen", 0), (seen or {}).get("bad", 0)
        self.elapsed = 0.0
        self.next_window()
        if window is not None:
            self.micro_steps, self.pairs, self.data_time = window["micro_steps"], window["pairs"], window["data_time"]
            self.started -= window["elapsed"]  # the window's wall time before the stop; the downtime is not counted
            self.stats.load_state(window["stats"])

    def sample_counts(self) -> dict[str, int]:
        """``{"seen": n, "bad": k}``: the run's samples and bad samples so far (checkpointed, so a
        resume continues the judgement of ``data.max_bad_fraction``)."""
        return {"seen": self.seen_total, "bad": self.bad_total}

    def window_state(self) -> dict[str, Any]:
        """The open window (the steps since the last log step) for a checkpoint: its host counters,
        its wall time so far and this rank's device sums (:meth:`StepStats.state`)."""
        return {
            "micro_steps": self.micro_steps,
            "pairs": self.pairs,
            "data_time": self.data_time,
            "elapsed": time.perf_counter() - self.started,
            "stats": self.stats.state(),
        }

    def next_window(self) -> None:
        """Start the host-side counters of a new window."""
        self.micro_steps, self.pairs, self.data_time = 0, 0, 0.0
        self.started = time.perf_counter()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The block's wall time (an evaluation between two steps) is left out of the window's."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.started += time.perf_counter() - t0

    def fetch(self, batches: Iterator[Any]) -> Any:
        """The next batch; the wait counts as the window's data time."""
        t0 = time.perf_counter()
        batch = next(batches)
        self.data_time += time.perf_counter() - t0
        return batch

    def add_step(self, micro_batches: int, pairs: int) -> None:
        """One optimizer step of ``micro_batches`` forwards over ``pairs`` pairs on all ranks (its
        statistics went to :attr:`stats` in :func:`vlp.train.step.train_step`)."""
        self.micro_steps += micro_batches
        self.pairs += pairs

    def read(self) -> Window:
        """The window's statistics, read back from the device (its one read), and its wall time."""
        self.elapsed = time.perf_counter() - self.started
        return self.stats.read()

    def write(self, step: int, lr: float, window: Window) -> dict[str, float]:
        """The window's record (main process: into the log), shown on the progress bar; adds the
        window's pairs and bad samples to the run's counts."""
        record = {
            "step": step,
            "lr": lr,
            **window.means,
            "pairs_per_s": self.pairs / self.elapsed,
            "data_time": self.data_time / self.micro_steps,
            "bad_samples": window.bad_samples,
            **({"skipped_steps": len(window.skipped)} if window.skipped else {}),
        }
        if self.main:
            self.log.write(record)
        if "loss" in record:
            self.bar.set_postfix(loss=f"{record['loss']:.3f}", pairs_s=f"{record['pairs_per_s']:.0f}")
        self.seen_total, self.bad_total = self.seen_total + self.pairs, self.bad_total + window.bad_samples
        return record
