"""What the loop reports of its steps: the log window's device-side statistics
(:class:`vlp.train.step_stats.StepStats`), its host-side counters (wall time, pairs, time spent
waiting for data), the record written to ``metrics.jsonl`` (and the sinks) at a log step, the
progress bar, and the run's running count of samples and bad samples (the bad-sample budget).
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Optional

from accelerate import Accelerator

from vlp.config import TrainConfig
from vlp.progress import progress
from vlp.train.logging import MetricsLog
from vlp.train.step_stats import StepStats, Window


class Reporter:
    """The log of a run that starts at step ``start``: ``stats`` (device side) and the host-side
    counters of the current window, the progress bar (``bar``), and ``seen_total`` / ``bad_total``:
    samples (all ranks) loaded since the run began (``seen``: carried over from the checkpoint a
    resume starts from), and the bad ones among them."""

    def __init__(
        self, acc: Accelerator, cfg: TrainConfig, log: MetricsLog, start: int, seen: Optional[dict[str, int]] = None
    ) -> None:
        self.log, self.main = log, acc.is_main_process
        self.bar = progress(cfg.steps, "train", cfg.progress and acc.is_main_process)
        self.bar.update(start)
        self.stats = StepStats(acc.device, cfg.max_nonfinite_steps, acc.num_processes)
        self.seen_total, self.bad_total = (seen or {}).get("seen", 0), (seen or {}).get("bad", 0)
        self.elapsed = 0.0
        self.next_window()

    def sample_counts(self) -> dict[str, int]:
        """``{"seen": n, "bad": k}``: the run's samples and bad samples so far (checkpointed, so a
        resume continues the judgement of ``data.max_bad_fraction``)."""
        return {"seen": self.seen_total, "bad": self.bad_total}

    def next_window(self) -> None:
        """Start the host-side counters of a new window."""
        self.micro_steps, self.pairs, self.data_time = 0, 0, 0.0
        self.started = time.perf_counter()

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
