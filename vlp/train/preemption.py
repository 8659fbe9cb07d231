"""Stopping a run from outside: SIGTERM / SIGUSR1 (a scheduler's preemption notice) are recorded
instead of killing the process (:func:`stop_signals`), the ranks agree on them
(:func:`stop_agreed`), the loop checkpoints at the next step boundary and raises :class:`Preempted`
(:func:`preempted`), which ``vlp`` and the experiment scripts (:func:`exit_status`) turn into a
message on how to resume and exit status 0.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from vlp.dist import any_over_ranks

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


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


def stop_agreed(stop: list[int], log_step: bool, processes: int, device: torch.device) -> bool:
    """Whether the run stops after this step: a stop signal is acted on at once on one process;
    several processes agree on it at log steps (one read each), so that every rank stops together."""
    if processes == 1:
        return bool(stop)
    return log_step and bool(any_over_ranks([bool(stop)], device=device)[0])


def preempted(stop: list[int], done: int, steps: int, run_dir: Path, checkpoint: Path) -> Preempted:
    """The :class:`Preempted` of a run stopped after step ``done`` of ``steps`` (its checkpoint
    ``checkpoint`` saved) by the signals in ``stop`` (none here: another rank got one)."""
    names = ", ".join(sorted({signal.Signals(s).name for s in stop})) or "a stop signal on another rank"
    where = f"stopped by {names} after step {done} of {steps}; checkpoint {checkpoint}"
    return Preempted(
        f"{where}. Resume: run the same command with --resume auto (or train.resume=auto; "
        f"the run's config: {run_dir / 'config.yaml'})",
        where,
    )
