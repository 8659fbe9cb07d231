"""Fault injection for training runs: stop a ``vlp pretrain`` run at a named checkpoint phase or right
after a training step, with SIGKILL or SIGTERM, resume it with ``--resume auto``, and compare it with
an uninterrupted run of the same configuration: every batch any attempt fetched (a SHA-256 of its
tensors) is the uninterrupted run's batch at that index, the ``metrics.jsonl`` records are equal to
the last bit (the wall-clock fields ``pairs_per_s`` and ``data_time`` aside) - losses, learning rate
and bad samples of every log window -, and so are the run's sample counts in the final
``state.json``, its final weights and its training state.

The runs train the tiny ALBEF on a shapes world written as 8 shards of one image (5 captions each),
two of them with a bad sample: an image cut to half its bytes and a sample whose JSON member is
not JSON (``data.on_bad_sample=skip``). A reader runs out of good pairs before its quota and reads
its shards again, so bad samples are met twice in an epoch and must be counted once.
``train.ckpt_every`` 3 and ``train.log_every`` 4 do not divide each other: most checkpoints fall
inside a log window.

    python scripts/soak.py --kills 50 [--processes 2] [--seed 0] [--out DIR]

runs one uninterrupted reference, then ``--kills`` faults (phase, signal and step drawn at random)
each in a new run folder, each resumed once and compared; one line per fault, a summary, exit
status 1 on any mismatch. One process runs are forked from this process (no start-up cost); two
processes are launched with ``torch.distributed.run`` (gloo on CPU), a SIGKILL reaching every
process of the launch, a SIGTERM only the rank that reached the phase (the ranks agree on it at the
next log step). The fault-injection tests (``tests/faults``) are built from the same parts.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import inspect
import io
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python scripts/soak.py` from anywhere (and under torch.distributed.run)
    sys.path.insert(0, str(ROOT))

from vlp.weights import CHECKPOINT_PHASES  # noqa: E402

#: where a fault can stop a run: a phase of writing a checkpoint (:data:`vlp.weights.CHECKPOINT_PHASES`),
#: or ``step``: right after a training step's optimizer update, before its log record and checkpoint
PHASES = (*CHECKPOINT_PHASES, "step")
SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM}
#: wall-clock fields of a metrics record: never equal between two runs
TIMING = ("pairs_per_s", "data_time")
#: the tiny ALBEF of the multi-process tests (tests/helpers.py, TINY_ALBEF_32) without momentum warm-up
MODEL = [
    "model.vision.depth=1",
    "model.text.layers=1",
    "model.text.fusion_layers=1",
    "model.vision.img_size=32",
    "model.queue_size=16",
    "model.momentum_warmup_steps=0",
]
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Fault:
    """Stop the run with ``signal`` (``KILL`` | ``TERM``) at ``phase`` of writing the checkpoint of
    step ``step``, or right after training step ``step`` (phase ``step``). Written ``KILL@manifest:9``."""

    signal: str
    phase: str
    step: int

    def __str__(self) -> str:
        return f"{self.signal}@{self.phase}:{self.step}"

    @classmethod
    def parse(cls, text: str) -> Fault:
        try:
            sig, rest = text.split("@")
            phase, step = rest.split(":")
            fault = cls(sig, phase, int(step))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected SIGNAL@PHASE:STEP such as KILL@manifest:9, got {text!r}"
            ) from None
        if sig not in SIGNALS or phase not in PHASES or fault.step < 1:
            raise argparse.ArgumentTypeError(f"{text}: signal one of {list(SIGNALS)}, phase one of {list(PHASES)}")
        return fault


@dataclass(frozen=True)
class Setup:
    """One configuration of the compared runs."""

    steps: int = 12
    ckpt_every: int = 3
    log_every: int = 4
    processes: int = 1
    batch_size: int = 4

    def args(self, shards: Path, run: Path) -> list[str]:
        """``vlp pretrain`` arguments of a run into ``run``."""
        return [
            "pretrain",
            "--config",
            str(ROOT / "configs/pretrain/shapes_tiny.yaml"),
            f"data.train=[{shards}]",
            "data.format=webdataset",
            "data.on_bad_sample=skip",
            "data.max_bad_fraction=0.5",
            "data.shuffle_buffer=16",
            f"data.batch_size={self.batch_size}",
            "data.num_workers=0",
            f"train.steps={self.steps}",
            f"train.log_every={self.log_every}",
            f"train.ckpt_every={self.ckpt_every}",
            "train.keep_last=2",
            "train.warmup_steps=0",
            "train.progress=false",
            f"output_dir={run}",
            *MODEL,
        ]

    def checkpoints(self) -> list[int]:
        """The steps with a checkpoint: every ``ckpt_every``-th, and the last."""
        return [*range(self.ckpt_every, self.steps, self.ckpt_every), self.steps]

    def random_fault(self, rng: random.Random) -> Fault:
        phase = rng.choice(PHASES)
        step = rng.randrange(1, self.steps) if phase == "step" else rng.choice(self.checkpoints())
        return Fault(rng.choice(list(SIGNALS)), phase, step)

    def dies(self, fault: Fault) -> bool:
        """Whether ``fault`` ends the process where it strikes: a SIGKILL. (A SIGTERM while the last
        checkpoint is written is held until that save is done: the run ends complete, status 0.)"""
        return fault.signal == "KILL"

    def exit_status(self, fault: Fault) -> Optional[int]:
        """The faulted run's exit status (None: any failure; a launcher reports a rank that died)."""
        if not self.dies(fault):
            return 0  # a SIGTERM: checkpoint, message, status 0
        if fault.signal == "KILL":
            return -signal.SIGKILL  # the whole process group, the launcher included
        return -signal.SIGTERM if self.processes == 1 else None

    def resumed_at(self, fault: Fault) -> int:
        """The step the resume starts from. A fault that ends the process (:meth:`dies`): the
        newest checkpoint renamed to its final name (a staging folder does not count). A SIGTERM
        otherwise: the run checkpoints at the step boundary after the signal (several processes: at
        the next log step, where they agree), or ends normally at its last step."""
        if self.dies(fault):
            done = fault.phase in ("renamed", "pruned")
            return fault.step if done else (fault.step - 1) // self.ckpt_every * self.ckpt_every
        stop = (
            fault.step if fault.phase == "step" else fault.step + 1
        )  # a signal during a save acts after the next step
        if self.processes > 1:
            stop = -(-stop // self.log_every) * self.log_every
        return min(stop, self.steps)


# ----------------------------------------------------------------------------- the shard world


def cut_first_image(shard: Path) -> None:
    """Rewrite ``shard`` with its first JPEG cut to half its bytes (an image that does not decode)."""
    _rewrite(shard, lambda name, data: data[: len(data) // 2] if name.endswith(".jpg") else data)


def break_first_json(shard: Path) -> None:
    """Rewrite ``shard`` with its first JSON member replaced by bytes that are not JSON (a malformed sample)."""
    _rewrite(shard, lambda name, data: b"{not json" if name.endswith(".json") else data)


def _rewrite(shard: Path, change: Callable[[str, bytes], bytes]) -> None:
    with tarfile.open(shard) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers() if m.isfile()]  # type: ignore[union-attr]
    changed = False
    with tarfile.open(shard, "w") as tf:
        for m, data in members:
            new = data if changed else change(m.name, data)
            changed = changed or new != data
            m.size = len(new)
            tf.addfile(m, io.BytesIO(new))


def make_shards(out: Path, images: int = 8) -> Path:
    """A shapes world of ``images`` 32-px images with 5 captions each, as shards of one image: the
    first with an image that does not decode, the fourth with a malformed JSON member."""
    from vlp.data.shard_writer import write_shards
    from vlp.world import generate_world

    world = generate_world(
        out / "world",
        n_train=images,
        n_val=0,
        n_test=0,
        image_size=32,
        progress=False,
        vqa_per_image=0,
        nlvr_per_image=0,
    )
    shards = write_shards([world["pretrain"]], out / "shards", size=32, max_per_shard=1, show_progress=False)
    cut_first_image(shards / "shard-00000.tar")
    break_first_json(shards / "shard-00003.tar")
    return shards


# ----------------------------------------------------------------------------- inside the run's processes


def fingerprint(batch: Any) -> str:
    """SHA-256 of a batch: its keys, and each tensor's dtype, shape and bytes (other values: repr)."""
    import torch

    h = hashlib.sha256()
    items = sorted(batch.items()) if isinstance(batch, dict) else [("", batch)]
    for key, value in items:
        h.update(key.encode())
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


def record_batches(stem: Path) -> Callable[..., Iterator[Any]]:
    """A stand-in for :func:`vlp.train.loop.endless_batches` that appends ``[index, fingerprint,
    image ids]`` of every batch the loop fetches to ``STEM.rankR.jsonl`` (``index``: the batch's
    place in the run's whole sequence; the ids: its ``image_ids``, which show the shards a rank read)."""
    import vlp.train.loop as loop

    real, rank = loop.endless_batches, int(os.environ.get("RANK", "0"))
    path = stem.with_name(f"{stem.name}.rank{rank}.jsonl")

    def recorded(loader: Any, start: int = 0, stream: Optional[dict] = None) -> Iterator[Any]:
        with path.open("a") as f:
            for i, batch in enumerate(real(loader, start, stream), start):
                ids = batch.get("image_ids") if isinstance(batch, dict) else None
                f.write(json.dumps([i, fingerprint(batch), [] if ids is None else ids.tolist()]) + "\n")
                f.flush()
                yield batch

    return recorded


@contextlib.contextmanager
def instrumented(stem: Path, fault: Optional[Fault]) -> Iterator[None]:
    """While it lasts, this process records its batches under ``stem`` and has ``fault`` armed
    (:func:`arm`); the training loop and the checkpoint hooks are restored afterwards."""
    import vlp.train.loop as loop
    import vlp.weights as weights

    saved, hooks = (loop.endless_batches, loop.train_step), list(weights.PHASE_HOOKS)
    loop.endless_batches = record_batches(stem)
    if fault is not None:
        arm(fault, stem.with_name(stem.name + ".fired"))
    try:
        yield
    finally:
        loop.endless_batches, loop.train_step = saved
        weights.PHASE_HOOKS[:] = hooks


def children_file(pid: int) -> Path:
    """The file listing the child processes of ``pid`` (Linux)."""
    return Path(f"/proc/{pid}/task/{pid}/children")


def job_groups() -> list[int]:
    """The process groups of this run in the order to kill them: under ``torch.distributed.run``
    (which starts every rank in a session of its own) the launcher's first, then the other ranks',
    this process's last; else this one's. Top down, because every rank meets a ``KILL@step`` fault at
    once: a rank killed by another before it reached the launcher must find it killed already."""
    own = os.getpgrp()
    if "LOCAL_RANK" not in os.environ:
        return [own]
    launcher = os.getppid()
    top, ranks = os.getpgid(launcher), [os.getpgid(int(p)) for p in children_file(launcher).read_text().split()]
    others = sorted(set(ranks) - {own, top})
    return [top, *others, own] if top != own else [*others, own]


def arm(fault: Fault, fired: Path) -> None:
    """Install ``fault`` in this process: at its phase and step it writes ``fired`` (the fault was
    reached) and sends its signal: SIGKILL to every process of the run (:func:`job_groups`, loader
    workers and launcher included, as a scheduler or a dying node does), SIGTERM to this process (a
    preemption notice; other ranks learn of it at the next log step)."""
    import vlp.train.loop as loop
    import vlp.weights as weights

    done: list[bool] = []

    def fire() -> None:
        if done:
            return
        done.append(True)
        fired.write_text(str(fault))
        if fault.signal == "KILL":
            for group in job_groups():
                with contextlib.suppress(ProcessLookupError):  # already killed (and reaped) by another rank
                    os.killpg(group, signal.SIGKILL)
        os.kill(os.getpid(), SIGNALS[fault.signal])

    if fault.phase == "step":
        real = loop.train_step
        params = inspect.signature(real)

        def stepped(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            if params.bind(*args, **kwargs).arguments["step"] + 1 == fault.step:
                fire()
            return result

        loop.train_step = stepped
        return
    name = f"step_{fault.step:07d}"

    def at_phase(phase: str, folder: Path) -> None:
        if phase == fault.phase and folder.name.removesuffix(".tmp") == name:
            fire()

    weights.PHASE_HOOKS.append(at_phase)


def run_in_process(argv: Sequence[str], stem: Path, fault: Optional[Fault]) -> int:
    """``vlp ARGV`` in this process with its batches recorded under ``stem`` and ``fault`` armed."""
    from vlp.cli import main

    with instrumented(stem, fault):
        return main(list(argv))


# ----------------------------------------------------------------------------- launching attempts


def _forked(argv: Sequence[str], stem: Path, fault: Optional[Fault], log: Path) -> int:
    """The child side of :func:`launch` with one process: a session of its own, output into ``log``."""
    os.setsid()
    out = open(log, "a", buffering=1)  # closed by os._exit
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    sys.stdout = sys.stderr = out
    os.environ.update(ENV)
    code = 1
    try:
        import torch

        torch.set_num_threads(1)
        code = run_in_process(argv, stem, fault)
    except BaseException:  # noqa: B036 (the child must reach os._exit)
        traceback.print_exc()
    finally:
        out.flush()
        os._exit(code)


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"the run did not end within {timeout:.0f} s")
        time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    argv: Sequence[str],
    stem: Path,
    fault: Optional[Fault] = None,
    processes: int = 1,
    timeout: float = 600,
    here: bool = False,
) -> int:
    """Run ``vlp ARGV`` on ``processes`` CPU processes with ``fault`` armed and its batches recorded
    under ``stem`` (output into ``STEM.log``); its exit status (negative: the signal that ended it).
    One process: forked from this one (whose imports it shares), or with ``here`` (no fault) in this
    process itself, which then has every import the forked runs need."""
    log = stem.with_name(stem.name + ".log")
    if here and processes == 1 and fault is None:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as in the forked attempts: another thread count sums in another order
        try:
            with log.open("a") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                return run_in_process(argv, stem, None)
        finally:
            torch.set_num_threads(threads)
    if processes == 1:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _forked(argv, stem, fault, log)
        return _wait(pid, timeout)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}"]
    cmd += [f"--master_port={_free_port()}", str(Path(__file__).resolve()), "--attempt", str(stem)]
    cmd += [*(["--fault", str(fault)] if fault is not None else []), "--", *argv]
    with log.open("a") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env={**os.environ, **ENV}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise TimeoutError(f"the run did not end within {timeout:.0f} s") from None


# ----------------------------------------------------------------------------- comparing


def records(run: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl`` of ``run`` without the wall-clock fields."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def batches(stems: Iterable[Path]) -> list[tuple[str, int, str]]:
    """``(rank file, index, fingerprint)`` of every batch the attempts under ``stems`` fetched, in order."""
    out = []
    for stem in stems:
        for f in sorted(stem.parent.glob(f"{stem.name}.rank*.jsonl")):
            rank = f.name.removeprefix(stem.name + ".")
            out += [(rank, rec[0], rec[1]) for rec in map(json.loads, f.read_text().splitlines())]
    return out


def image_ids(stem: Path) -> dict[str, dict[int, list[int]]]:
    """The image ids of every batch the attempt under ``stem`` fetched: rank file -> batch index -> ids."""
    out: dict[str, dict[int, list[int]]] = {}
    for f in sorted(stem.parent.glob(f"{stem.name}.rank*.jsonl")):
        recs = map(json.loads, f.read_text().splitlines())
        out[f.name.removeprefix(stem.name + ".")] = {rec[0]: rec[2] for rec in recs}
    return out


def _tensors_differ(a: Path, b: Path) -> list[str]:
    from safetensors.torch import load_file

    x, y = load_file(str(a)), load_file(str(b))
    if x.keys() != y.keys():
        return [f"{b.name}: other tensors"]
    return [f"{b.name}: {k} differs" for k in x if not (x[k].dtype == y[k].dtype and x[k].equal(y[k]))][:3]


def compare(setup: Setup, ref: Path, run: Path, attempts: Sequence[Path]) -> list[str]:
    """How ``run`` (its batches recorded under ``attempts``) differs from the reference ``ref`` (its
    batches under ``ref / "batches"``): batches, records, sample counts, final weights and task state."""
    from vlp.weights import read_state

    problems = []
    want = {(rank, i): sha for rank, i, sha in batches([ref / "batches"])}
    got = batches(attempts)
    wrong = [(rank, i) for rank, i, sha in got if want.get((rank, i)) != sha]
    missing = set(want) - {(rank, i) for rank, i, _ in got}
    if wrong or missing:
        problems.append(f"batches: {len(wrong)} differ (first {wrong[:1]}), {len(missing)} never fetched")
    a, b = records(ref), records(run)
    if a != b:
        diff = next(((x, y) for x, y in zip(a, b) if x != y), (len(a), len(b)))
        problems.append(f"metrics.jsonl: {diff[0]} != {diff[1]}")
    final = Path("checkpoints") / f"step_{setup.steps:07d}"
    if not (run / final).is_dir():
        return [*problems, f"no {final}"]
    counts = [read_state(r / final).get("samples") for r in (ref, run)]
    if counts[0] != counts[1]:
        problems.append(f"sample counts {counts[1]} != {counts[0]}")
    for rel in ("model.safetensors", "train_state/task.safetensors"):
        problems += _tensors_differ(ref / final / rel, run / final / rel)
    return problems


def started_at(stem: Path) -> Optional[int]:
    """The index of the first batch the attempt under ``stem`` fetched on rank 0 (None: none)."""
    first = next(iter(batches([stem])), None)
    return first[1] if first is not None else None


# ----------------------------------------------------------------------------- one fault, the soak


@dataclass
class Outcome:
    """One fault: the faulted attempt's exit status, the step the resume started from (the last
    step: nothing was left to run), and the mismatches."""

    fault: Fault
    status: int
    resumed_at: Optional[int]
    problems: list[str]

    def line(self, setup: Setup) -> str:
        ok = "same batches, losses, bad-sample counts and weights" if not self.problems else "; ".join(self.problems)
        return f"{self.fault}: exit {self.status}, resumed at step {self.resumed_at}: {'ok: ' if not self.problems else 'MISMATCH: '}{ok}"


def reference(setup: Setup, shards: Path, out: Path) -> Path:
    """The uninterrupted run of ``setup`` in ``out`` (its batches under ``out / "batches"``)."""
    out.mkdir(parents=True, exist_ok=True)
    status = launch(setup.args(shards, out), out / "batches", processes=setup.processes, here=True)
    if status != 0:
        raise RuntimeError(f"the reference run failed (exit {status}); see {out / 'batches.log'}")
    return out


def inject(setup: Setup, shards: Path, ref: Path, run: Path, fault: Fault) -> Outcome:
    """Run ``setup`` into ``run`` with ``fault``, resume it once, compare it with ``ref``."""
    run.mkdir(parents=True, exist_ok=True)
    args = setup.args(shards, run)
    killed, resumed = run / "attempt1", run / "attempt2"
    status = launch(args, killed, fault, setup.processes)
    problems = [] if killed.with_name("attempt1.fired").is_file() else [f"the fault was never reached (exit {status})"]
    expected = setup.exit_status(fault)
    if status != expected and not (expected is None and status != 0):
        problems.append(
            f"the faulted run exited with {status}, expected {expected if expected is not None else 'a failure'}"
        )
    again = launch([*args, "--resume", "auto"], resumed, None, setup.processes)
    if again != 0:
        problems.append(f"the resume exited with {again}; see {resumed}.log")
    start = started_at(resumed)  # one batch per step (no gradient accumulation); None: nothing left to run
    if (start if start is not None else setup.steps) != setup.resumed_at(fault):
        problems.append(f"resumed at step {start}, expected step {setup.resumed_at(fault)}")
    problems += compare(setup, ref, run, [killed, resumed]) if again == 0 else []
    return Outcome(fault, status, start if start is not None else setup.steps, problems)


def soak(setup: Setup, kills: int, seed: int, out: Path, keep: bool = False) -> int:
    """``kills`` random faults against one reference; one line each and a summary; 1 on any mismatch."""
    t0 = time.monotonic()
    shards = make_shards(out)
    ref = reference(setup, shards, out / "reference")
    rng = random.Random(seed)
    bad, signals = 0, {s: 0 for s in SIGNALS}
    for k in range(1, kills + 1):
        fault = setup.random_fault(rng)
        run = out / f"kill{k:03d}"
        outcome = inject(setup, shards, ref, run, fault)
        bad += bool(outcome.problems)
        signals[fault.signal] += 1
        print(f"kill {k}/{kills} {outcome.line(setup)}", flush=True)
        if not outcome.problems and not keep:
            shutil.rmtree(run)
    what = ", ".join(f"{n} SIG{s}" for s, n in signals.items())
    print(
        f"soak: {kills} kills ({what}; {setup.processes} process(es), seed {seed}): "
        f"{kills - bad} resumed exactly, {bad} mismatched, {time.monotonic() - t0:.0f} s"
    )
    return 1 if bad else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=50, help="random faults, each resumed and compared (default 50)")
    p.add_argument("--processes", type=int, default=1, choices=[1, 2])
    p.add_argument("--seed", type=int, default=0, help="seed of the drawn faults")
    p.add_argument("--out", type=Path, default=None, help="work folder (default: a new temporary one, removed)")
    p.add_argument("--keep", action="store_true", help="keep every run folder, not only the mismatched ones")
    p.add_argument("--attempt", type=Path, help=argparse.SUPPRESS)  # inside a launched process
    p.add_argument("--fault", type=Fault.parse, help=argparse.SUPPRESS)
    p.add_argument("vlp", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.attempt is not None:
        return run_in_process(a.vlp[1:] if a.vlp[:1] == ["--"] else a.vlp, a.attempt, a.fault)
    os.environ.update(ENV)
    out = a.out or Path(__import__("tempfile").mkdtemp(prefix="vlp-soak-"))
    setup = replace(Setup(), processes=a.processes)
    status = soak(setup, a.kills, a.seed, out, a.keep)
    if a.out is None and not a.keep and status == 0:
        shutil.rmtree(out, ignore_errors=True)
    elif status:
        print(f"the mismatched runs are in {out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
