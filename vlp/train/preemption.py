"""Stopping a run from outside: SIGTERM / SIGUSR1 (a scheduler's preemption notice) are recorded
instead of killing the process (:func:`stop_signals`), the ranks agree on them
(:func:`stop_agreed`), the loop checkpoints at the next step boundary and raises :class:`Preempted`
(:func:`preempted`), which ``vlp`` and the experiment scripts (:func:`exit_status`) turn into a
message on how to resume and exit status 0 (``vlp demo``: 128 + the signal's number, its table not
written).

Every message of a stopped run says how to resume in the words of the command that runs it
(:func:`how_to_resume`): a command that does not take ``--resume`` sets its own
(:func:`resume_advice`: ``vlp demo``, the experiment scripts), so the advice it prints works for it.

A run that cannot reach a step boundary (blocked, e.g. waiting for data) cannot save; the
:class:`StopRequest`'s watchdog ends it instead: after a stop signal, each phase of the loop (a
step, a checkpoint save, a validation) must end within ``train.stop_grace_s`` seconds, else the
process prints why and exits with status 128 + the signal's number (143 for SIGTERM), its data
loader workers killed. A second stop signal (more than :data:`REPEAT_AFTER` seconds after the
first: a launcher that passes the first one on to every process sends copies sooner) or a SIGINT
after a stop signal exits at once the same way.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Callable, Iterator, Optional

import torch

from vlp.console import show_logs
from vlp.dist import any_over_ranks

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


#: how ``vlp``'s training commands (pretrain, finetune, train-helper) continue a stopped run
TRAINING_RESUME = "run the same command with --resume auto (or train.resume=auto)"
#: how the experiment scripts continue (:func:`exit_status`)
SCRIPT_RESUME = "run the same script command again"
_ADVICE = [TRAINING_RESUME]  # a stack: the innermost command's advice last (a plain list: read from any thread)


@contextlib.contextmanager
def resume_advice(text: str) -> Iterator[None]:
    """While the block runs, a stopped run says ``Resume: TEXT`` (the command running it continues a
    run that way) instead of :data:`TRAINING_RESUME`."""
    _ADVICE.append(text)
    try:
        yield
    finally:
        _ADVICE.pop()


def how_to_resume() -> str:
    """How the command now running continues a stopped run (:func:`resume_advice`)."""
    return _ADVICE[-1]


def stopped_at(done: int, steps: int, checkpoint: Path) -> str:
    """The end of a stopped run's message: the step it stopped after (of ``steps``), its checkpoint
    and how to resume (:func:`how_to_resume`)."""
    return f"the run stopped after step {done} of {steps}; checkpoint {checkpoint}. Resume: {how_to_resume()}"


class Preempted(Exception):
    """The run was asked to stop (SIGTERM / SIGUSR1) and saved a checkpoint at a step boundary;
    the message says how to resume (``args[1]``: where it stopped, without the hint; ``signum``: the
    first signal). ``vlp`` prints it and exits with status 0 (``vlp demo``: 128 + ``signum``)."""

    def __init__(self, *args: object, signum: int = signal.SIGTERM) -> None:
        super().__init__(*args)
        self.signum = signum

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def exit_status(main: Callable[[], Optional[int]], prog: str) -> int:
    """Run a script's ``main`` (the experiment scripts, which call the jobs in-process): a run
    stopped by SIGTERM / SIGUSR1 prints where it stopped and gives status 0, as ``vlp`` does;
    running the script again continues from its checkpoints. Any stop message inside says so
    (:data:`SCRIPT_RESUME`), not ``--resume``, which a script does not take. vlp's log records are
    printed as ``vlp`` prints them (:func:`vlp.console.show_logs`)."""
    show_logs()
    try:
        with resume_advice(SCRIPT_RESUME):
            return main() or 0
    except Preempted as e:
        where = e.args[1] if len(e.args) > 1 else str(e)
        logger.warning(f"{prog}: {where}. Run the same script command again to continue.")
        return 0


#: seconds after a first stop signal within which another one is a copy of it, not a second request
REPEAT_AFTER = 1.0


def exit_now(message: str, signum: int) -> None:
    """End the process at once with ``message`` on stderr and status 128 + ``signum``, killing its
    multiprocessing children (data loader workers, which ignore SIGTERM) first."""
    logger.error(f"vlp: error: {message}")
    for child in multiprocessing.active_children():
        child.kill()
    os._exit(128 + signum)


@dataclass
class StopRequest:
    """The stop signals a run received (``signals``, in order) and the watchdog that ends the run
    when it cannot act on them (module doc). The loop calls :meth:`phase_done` after each step,
    checkpoint save and validation, and :meth:`acting` once it stops at a step boundary."""

    grace: float  # train.stop_grace_s
    signals: list[int] = field(default_factory=list)
    first_at: float = 0.0
    timer: Optional[threading.Timer] = None
    acted: bool = False

    def receive(self, signum: int, _frame: Optional[FrameType] = None) -> None:
        """The handler of SIGTERM / SIGUSR1 / SIGINT."""
        if self.signals:
            late = time.monotonic() - self.first_at > REPEAT_AFTER
            if signum == signal.SIGINT or late:
                exit_now(
                    f"{signal.Signals(signum).name} after {self.names()}: exiting at once, without a checkpoint; "
                    f"resume from the last one: {how_to_resume()}",
                    signum,
                )
        if signum == signal.SIGINT:
            signal.default_int_handler(signum, _frame)  # no stop pending: KeyboardInterrupt, as always
        if not self.signals:
            self.first_at = time.monotonic()
        self.signals.append(signum)
        if self.timer is None and not self.acted:
            self.phase_done()

    def names(self) -> str:
        """The names of the signals received, distinct and sorted, joined by ``", "`` (e.g. ``"SIGTERM, SIGUSR1"``)."""
        return ", ".join(sorted({signal.Signals(s).name for s in self.signals}))

    def phase_done(self) -> None:
        """A phase of the loop ended: with a stop pending, the next one has ``grace`` seconds again."""
        if not self.signals or self.acted:
            return
        self.cancel()
        self.timer = threading.Timer(self.grace, self.expire)
        self.timer.daemon = True
        self.timer.start()

    def acting(self) -> None:
        """The loop reached a step boundary to stop at: the watchdog is off (the save takes what it takes)."""
        self.acted = True
        self.cancel()

    def cancel(self) -> None:
        """Stop the watchdog's timer, if one runs."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def expire(self) -> None:
        """The watchdog's end: exit at once without a checkpoint (:func:`exit_now`, the first signal's status)."""
        exit_now(
            f"stopped by {self.names()}, but the run reached no step boundary within train.stop_grace_s="
            f"{self.grace:g} s (blocked, e.g. waiting for data); exiting without a checkpoint; resume from the "
            f"last one: {how_to_resume()}",
            self.signals[0],
        )


@contextlib.contextmanager
def stop_signals(grace: float = 60.0) -> Iterator[StopRequest]:
    """While training, SIGTERM and SIGUSR1 are recorded (in the returned request's ``signals``)
    instead of killing the process; the loop checkpoints at the next step boundary, or the
    request's watchdog ends a run that does not get there within ``grace`` seconds (module doc).
    Main thread only (elsewhere Python cannot install handlers, and the signals keep their
    default action)."""
    request = StopRequest(grace)
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    old = {s: signal.signal(s, request.receive) for s in (*STOP_SIGNALS, signal.SIGINT)}
    try:
        yield request
    finally:
        request.cancel()
        for s, handler in old.items():
            signal.signal(s, handler)


def stop_agreed(stop: StopRequest, log_step: bool, processes: int, device: torch.device) -> bool:
    """Whether the run stops after this step (whose phase ends here: :meth:`StopRequest.phase_done`):
    a stop signal is acted on at once on one process; several processes agree on it at log steps
    (one read each), so that every rank stops together."""
    stop.phase_done()
    if processes == 1:
        return bool(stop.signals)
    return log_step and bool(any_over_ranks([bool(stop.signals)], device=device)[0])


def preempted(stop: StopRequest, done: int, steps: int, checkpoint: Path) -> Preempted:
    """The :class:`Preempted` of a run stopped after step ``done`` of ``steps`` (its checkpoint
    ``checkpoint`` to be saved or saved) by the signals of ``stop`` (none here: another rank got
    one); the watchdog is off from here (:meth:`StopRequest.acting`)."""
    stop.acting()
    names = stop.names() or "a stop signal on another rank"
    where = f"stopped by {names} after step {done} of {steps}; checkpoint {checkpoint}"
    return Preempted(f"{where}. Resume: {how_to_resume()}", where, signum=(stop.signals or [signal.SIGTERM])[0])
