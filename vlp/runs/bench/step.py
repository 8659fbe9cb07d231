"""``vlp bench``: time pretraining steps of a config, phase by phase, with the analytic FLOP count.

The model, task and loader are those of ``vlp pretrain`` (:func:`vlp.runs.training.pretrain.build_pretraining`), on
the config's real data, and the step is the loop's own (:func:`vlp.train.step.train_step`). After
``warmup`` untimed steps, each of ``steps`` steps is timed in five phases, with a device
synchronisation around each: data (next batch, on the device), forward (every loss), backward,
optimizer (clipping, the non-finite check, step, zero_grad, momentum update, the queues' keep or
undo) and statistics (the step's device-side log accumulators). FLOP per pair come from
:mod:`vlp.flops` at each batch's padded text length; MFU = achieved FLOP/s / (peak x processes).
"""

from __future__ import annotations

import contextlib
import json
import platform
import resource
import statistics
import time
from dataclasses import asdict
from datetime import date
from pathlib import Path
from typing import Any, Iterator, Optional, cast

import torch

from vlp.config import PretrainConfig, to_dict
from vlp.errors import ConfigError
from vlp.flops import step_flops
from vlp.models.albef import param_count
from vlp.runs.training.pretrain import build_pretraining
from vlp.train.compile_watch import CompileRecord, CompileWatch, cuda_graph_status
from vlp.train.dispatch_counts import DispatchCounter
from vlp.train.loop import endless_batches
from vlp.train.post_step import compiled_post_step
from vlp.train.profile_counts import profile_steps
from vlp.train.setup import prepare_training
from vlp.train.step import no_phase, stateful_modules, train_step
from vlp.train.step_stats import StepStats
from vlp.version import __version__

PHASES = ("data", "forward", "backward", "optimizer", "statistics")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _peak_memory_mb(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "max CUDA memory allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "peak process RSS"


class _PhaseClock:
    """The seconds each phase of the current step took (``spent``: phase -> seconds), each timed
    with a device synchronisation before and after."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.spent: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    def sync(self) -> float:
        """Waits for the device's queued work; returns :func:`time.perf_counter` after it."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Adds the time of the block to ``spent[phase]``; yields None (a phase not in :data:`PHASES`,
        a part of a timed one such as the compiled post-step inside "optimizer", is not timed)."""
        if phase not in self.spent:
            yield
            return
        t0 = self.sync()
        yield
        self.spent[phase] += self.sync() - t0


def _bench_result(
    cfg: PretrainConfig,
    acc: Any,
    model: torch.nn.Module,
    times: dict[str, list[float]],
    work: tuple[float, int],
    steps: int,
    warmup: int,
    peak_tflops: Optional[float],
) -> dict[str, Any]:
    """The record of :func:`run_bench` from the timed steps' ``times`` (phase -> seconds per step)
    and ``work`` (FLOP and pairs over them, all processes): throughput, ms per phase, peak memory,
    FLOP per pair, achieved TFLOP/s and MFU, the versions and the config. Returns the dict."""
    flops, pairs = work
    device = acc.device
    total = sum(sum(v) for v in times.values())
    ms = {p: 1000 * statistics.mean(v) for p, v in times.items()}
    ms["step"] = sum(ms.values())
    memory, memory_kind = _peak_memory_mb(device)
    achieved = flops / total
    return {
        "date": date.today().isoformat(),
        "device": _device_name(device),
        "processes": acc.num_processes,
        "precision": cfg.train.precision,
        "grad_checkpointing": cfg.train.grad_checkpointing,
        "batch_per_process": cfg.data.batch_size,
        "steps": steps,
        "warmup": warmup,
        "pairs_per_s": pairs / total,
        "ms_per_step": ms,
        "ms_per_step_median": 1000 * statistics.median(sum(x) for x in zip(*times.values())),
        "peak_memory_mb": memory,
        "peak_memory_kind": memory_kind,
        "gflop_per_pair": flops / pairs / 1e9,
        "achieved_tflops": achieved / 1e12,
        "peak_tflops_per_process": peak_tflops,
        "mfu": achieved / (peak_tflops * 1e12 * acc.num_processes) if peak_tflops else None,
        "trainable_params_m": param_count(model) / 1e6,
        "vlp_version": __version__,
        "torch": torch.__version__,
        "config": to_dict(cfg),
    }


def run_bench(
    cfg: PretrainConfig,
    steps: int = 20,
    warmup: int = 3,
    peak_tflops: Optional[float] = None,
    out: Optional[str | Path] = None,
    profile: int = 0,
) -> dict[str, Any]:
    """``vlp bench``: ``warmup`` untimed then ``steps`` timed pretraining steps of ``cfg``, phase by
    phase (module docstring), then ``profile`` more under ``torch.profiler`` (kernel launches and
    host syncs per step: :mod:`vlp.train.profile_counts`). Returns the record of
    :func:`_bench_result` with the warm-up's wall time (compilation included) apart, torch.compile's
    record (:class:`~vlp.train.compile_watch.CompileRecord`) and, under ``train.cuda_graphs``,
    whether CUDA graphs were captured; also written to ``out`` as JSON by the main process."""
    if steps < 1 or warmup < 0 or profile < 0:
        raise ConfigError(
            f"vlp bench: --steps must be >= 1, --warmup and --profile >= 0, got {steps} / {warmup} / {profile}"
        )
    cfg.train.steps = max(cfg.train.steps, warmup + steps + profile)  # the lr schedule spans the benchmark
    job = build_pretraining(cfg)
    acc = job.accelerator()
    prep = prepare_training(acc, *job.built(), cfg.train)
    device = acc.device
    clock = _PhaseClock(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    stats = StepStats(device, cfg.train.max_nonfinite_steps, acc.num_processes)
    undo = stateful_modules(prep.inner)
    post = compiled_post_step(acc, prep.optimizer, prep.inner, prep.params, undo, cfg.train)
    batches = endless_batches(prep.loader)
    last: dict[str, Any] = {}

    def fetch() -> Any:
        last["batch"] = next(batches)
        return last["batch"]

    def one_step(step: int, phase: Any = no_phase, read: bool = True) -> None:
        args = (acc, prep.task, prep.inner, prep.optimizer, prep.params, fetch, step, cfg.train, stats)
        train_step(*args, phase=phase, undo=undo, post=post)
        if read and (step + 1) % cfg.train.log_every == 0:
            stats.read()  # as the loop does at a log step: the window's records do not pile up

    prep.task.train()
    flops, pairs, wall = 0.0, 0, []
    warm: Optional[CompileRecord] = None  # torch.compile's record at the end of the warm-up
    with CompileWatch() as watch:
        for step in range(warmup + steps):
            clock.spent.update(dict.fromkeys(PHASES, 0.0))
            t0 = clock.sync()
            one_step(step, clock.timed)
            wall.append(clock.sync() - t0)
            if step == warmup - 1:
                warm = watch.record()
            if step >= warmup:
                for p in PHASES:
                    times[p].append(clock.spent[p])
                b = len(last["batch"]["input_ids"]) * acc.num_processes
                flops += step_flops(cfg, last["batch"]["input_ids"].shape[1]) * b
                pairs += b
        # the profiled steps' own launches and syncs (no log read between them)
        counts = profile_steps(lambda: one_step(len(wall), read=False), profile, device) if profile else None
    result = _bench_result(cfg, acc, job.model, times, (flops, pairs), steps, warmup, peak_tflops)
    result.update(_compile_fields(cfg, device, watch.record(), warm, wall[:warmup]))
    result["profile"] = counts
    _write(result, out, acc.is_main_process)
    return result


def _compile_fields(
    cfg: PretrainConfig,
    device: torch.device,
    record: CompileRecord,
    warm: Optional[CompileRecord],
    warmup_wall: list[float],
) -> dict[str, Any]:
    """The bench record's torch.compile fields: the warm-up's wall seconds (the first step's apart:
    under train.compile it holds the compilation), what dynamo and inductor did over the run and
    how many graphs were compiled after the warm-up, and the CUDA-graph status
    (:func:`~vlp.train.compile_watch.cuda_graph_status`). Returns the dict."""
    return {
        "compile": cfg.train.compile,
        "first_step_s": warmup_wall[0] if warmup_wall else None,
        "warmup_s": sum(warmup_wall),
        "compile_record": asdict(record),
        "graphs_after_warmup": record.graphs - (warm.graphs if warm else 0),
        "cuda_graphs": cuda_graph_status(cfg.train.cuda_graphs, device.type, record),
    }


def _write(result: dict[str, Any], out: Optional[str | Path], main: bool) -> None:
    if out is not None and main:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2))


def momentum_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The momentum twin's parameters (their casts are counted apart: autocast does not cache them)."""
    twin = getattr(model, "momentum", None)
    return list(twin.parameters()) if isinstance(twin, torch.nn.Module) else []


def run_count_ops(cfg: PretrainConfig, warmup: int = 1, out: Optional[str | Path] = None) -> dict[str, Any]:
    """``vlp bench --count-ops``: run ``warmup`` training steps (the loop's own
    :func:`vlp.train.step.train_step`), then count one more at the dispatcher
    (:class:`~vlp.train.dispatch_counts.DispatchCounter`): kernel-launching ops, casts (those of
    the momentum weights apart), device synchronisations, module calls per forward; per phase."""
    if warmup < 0:
        raise ConfigError(f"vlp bench: --warmup must be >= 0, got {warmup}")
    cfg.train.steps = max(cfg.train.steps, warmup + 1)
    job = build_pretraining(cfg)
    acc = job.accelerator()
    prep = prepare_training(acc, *job.built(), cfg.train)
    stats = StepStats(acc.device, cfg.train.max_nonfinite_steps, acc.num_processes)
    batches = endless_batches(prep.loader)
    prep.task.train()
    args = (acc, prep.task, prep.inner, prep.optimizer, prep.params)
    undo = stateful_modules(prep.inner)
    post = compiled_post_step(acc, prep.optimizer, prep.inner, prep.params, undo, cfg.train)
    graphs, before = [], dynamo_counts()  # dynamo's graphs after each step (train.compile), this run's
    for step in range(warmup):
        train_step(*args, batches, step, cfg.train, stats, undo=undo, post=post)
        graphs.append(dynamo_counts(before))
    # a compiled step's forward graph, backward and post-step run as graphs, uncounted (see format_count_ops);
    # the forward's eager work before its graph (masks, races, clamp_temp, the alpha fill) is counted
    paused = ("graph", "backward", "post_step") if cfg.train.compile == "full" else ()
    counter = DispatchCounter(watch=momentum_weights(job.model), pause=paused)
    if paused and hasattr(prep.inner, "graph_phase"):
        cast(Any, prep.inner).graph_phase = counter.phase
    with counter:
        train_step(*args, batches, warmup, cfg.train, stats, phase=counter.phase, undo=undo, post=post)
    graphs.append(dynamo_counts(before))
    result: dict[str, Any] = {
        **counter.summary(),
        "compile": cfg.train.compile,
        "graphs": graphs[-1]["graphs"],
        "graph_breaks": graphs[-1]["graph_breaks"],
        "graphs_compiled_after_step_1": graphs[-1]["graphs"] - graphs[0]["graphs"],
        "graphs_per_step": [g["graphs"] for g in graphs],
        "date": date.today().isoformat(),
        "device": _device_name(acc.device),
        "precision": cfg.train.precision,
        "batch_per_process": cfg.data.batch_size,
        "counted_step": warmup + 1,
        "vlp_version": __version__,
        "torch": torch.__version__,
        "config": to_dict(cfg),
    }
    _write(result, out, acc.is_main_process)
    return result


def dynamo_counts(since: Optional[dict[str, int]] = None) -> dict[str, int]:
    """torch.compile's totals in this process (minus ``since``, an earlier reading): graphs compiled
    (each recompile is one more) and graph breaks."""
    from torch._dynamo.utils import counters

    now = {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values())}
    return {k: v - (since or {}).get(k, 0) for k, v in now.items()}


def format_count_ops(r: dict[str, Any]) -> str:
    lines = [
        f"one training step (step {r['counted_step']}, {r['precision']}, batch {r['batch_per_process']}) "
        f"on {r['device']}",
        f"kernel-launching ops   {r['kernel_ops_per_step']}",
        f"casts                  {r['casts_per_step']} ({r['casts_of_watched_per_step']} of momentum weights)",
        f"device syncs           {r['syncs_per_step']}",
        f"module calls/forward   {r['module_calls_per_forward']}",
        "per phase              "
        + ", ".join(
            f"{p} {v['kernel_ops']} ops / {v['casts']} casts / {v['syncs']} syncs" for p, v in r["per_phase"].items()
        ),
    ]
    lines += [f"  sync: {site} x{n}" for site, n in r["sync_sites"].items()]
    if r["compile"] != "off":
        lines.append(
            f"train.compile={r['compile']}: {r['graphs']} graphs, {r['graph_breaks']} graph breaks, "
            f"{r['graphs_compiled_after_step_1']} compiled after step 1 (per step: {r['graphs_per_step']})"
        )
        if r["compile"] == "full":
            lines.append(
                "  the forward's graph, the backward and the post-step run as compiled graphs: the counts above are "
                "the step's work outside them (the forward's eager work before its graph included)"
            )
    return "\n".join(lines)


def not_captured(r: dict[str, Any]) -> Optional[str]:
    """A bench record's "not captured: REASON" when it asked for CUDA graphs and ran without them
    (its speed is then no CUDA-graph figure), else None."""
    status = r.get("cuda_graphs")
    return status if status is not None and status != "captured" else None


def format_compile(r: dict[str, Any]) -> list[str]:
    """The lines of a bench record's torch.compile fields (none with train.compile=off)."""
    if r.get("compile", "off") == "off":
        return []
    c = r["compile_record"]
    lines = [
        f"train.compile={r['compile']}   {c['graphs']} graphs ({r['graphs_after_warmup']} after the warm-up), "
        f"{c['graph_breaks']} graph breaks, {c['recompiles']} recompiles; warm-up {r['warmup_s']:.1f} s "
        f"(first step {r['first_step_s'] or 0:.1f} s: compilation), apart from the timed steps"
    ]
    lines += [f"  recompile: {reason}" for reason in c["recompile_reasons"]]
    if r.get("cuda_graphs") is not None:
        lines.append(f"CUDA graphs         {r['cuda_graphs']} ({c['cudagraph_skips']} skipped by inductor)")
    return lines


def format_profile(r: dict[str, Any]) -> list[str]:
    """The line of a bench record's profiled launches and syncs per step (none without --profile)."""
    p = r.get("profile")
    if not p:
        return []
    return [
        f"profiled per step   {p['kernel_launches_per_step']:.0f} kernel launches, {p['graph_launches_per_step']:.0f} "
        f"CUDA-graph launches, {p['copies_per_step']:.0f} async copies/fills, {p['syncs_per_step']:.0f} host syncs "
        f"({p['steps']} steps, torch.profiler; {p['aten_ops_per_step']:.0f} aten ops, nested included)"
    ]


def format_bench(r: dict[str, Any]) -> str:
    ms = r["ms_per_step"]
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a (give --peak-tflops)"
    lost = not_captured(r)
    speed = f"{r['pairs_per_s']:.1f}" if lost is None else f"{lost} (the step ran without CUDA graphs: no figure)"
    return "\n".join(
        [
            f"device              {r['device']} x {r['processes']} ({r['precision']}"
            f"{', activation checkpointing' if r['grad_checkpointing'] else ''})",
            f"pairs/s             {speed}  (batch {r['batch_per_process']} per process, "
            f"{r['steps']} timed steps after {r['warmup']})",
            "ms per step         " + ", ".join(f"{p} {ms[p]:.1f}" for p in PHASES) + f" = {ms['step']:.1f}"
            f" (median step {r['ms_per_step_median']:.1f})",
            f"peak memory         {r['peak_memory_mb']:.0f} MiB ({r['peak_memory_kind']})",
            f"GFLOP per pair      {r['gflop_per_pair']:.2f} (analytic, vlp.flops)",
            f"achieved            {r['achieved_tflops']:.3f} TFLOP/s, MFU {mfu}",
            *format_compile(r),
            *format_profile(r),
        ]
    )
