"""The measuring sections of ``make gpu-check`` (``check.py``): bench, compile, retrieval, loader."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

from check_common import (
    CONFIG,
    Context,
    Plan,
    device,
    load_cfg,
    peak_bf16_tflops,
    peak_memory,
    pretrain_args,
    release,
    reset_peak,
    sync,
)


def bench_row(name: str, overrides: list[str], r: dict[str, Any], peak: Optional[float], wall: float) -> dict[str, Any]:
    """A report row from a :func:`vlp.runs.bench.step.run_bench` record ``r`` (its config's ``overrides``,
    ``peak`` TFLOP/s for MFU, ``wall`` seconds with the build and the warm-up): throughput, phases,
    memory, MFU, torch.compile's record with the warm-up apart, the profiled launches and syncs, and
    ``cuda_graphs`` ("captured", "not captured: REASON" or None) - a row not captured has no speed
    in the table (:mod:`check_report`)."""
    from vlp.runs.bench.step import not_captured

    return {
        "name": name,
        "overrides": overrides,
        "device": r["device"],
        "precision": r["precision"],
        "compile": r["compile"],
        "batch": r["batch_per_process"],
        "warmup": r["warmup"],
        "steps": r["steps"],
        "pairs_per_s": r["pairs_per_s"],
        "ms_per_step": r["ms_per_step"]["step"],
        "ms_phases": {k: v for k, v in r["ms_per_step"].items() if k != "step"},
        "ms_per_step_median": r["ms_per_step_median"],
        "peak_memory_mb": r["peak_memory_mb"],
        "peak_memory_kind": r["peak_memory_kind"],
        "gflop_per_pair": r["gflop_per_pair"],
        "achieved_tflops": r["achieved_tflops"],
        "peak_tflops": peak,
        "mfu": r["mfu"],
        "trainable_params_m": r["trainable_params_m"],
        "first_step_s": r["first_step_s"],
        "warmup_s": r["warmup_s"],
        "compile_record": r["compile_record"],
        "graphs_after_warmup": r["graphs_after_warmup"],
        "cuda_graphs": r["cuda_graphs"],
        "not_captured": not_captured(r),
        "profile": r["profile"],
        "wall_s": wall,
    }


def _bench_row(name: str, overrides: list[str], steps: tuple[int, int], peak_bf16: Optional[float], profile: int = 0):
    """Bench ``overrides`` (``steps``: warm-up, timed; ``profile`` more under the profiler) -> its
    :func:`bench_row`, MFU against ``peak_bf16`` on CUDA in bf16."""
    from vlp.runs.bench.step import run_bench

    cfg = load_cfg(overrides)
    on_cuda = device().type == "cuda"
    peak = peak_bf16 if peak_bf16 is not None and on_cuda and cfg.train.precision == "bf16" else None
    release()
    t0 = time.perf_counter()
    r = run_bench(cfg, steps=steps[1], warmup=steps[0], peak_tflops=peak, profile=profile)
    wall = time.perf_counter() - t0
    release()
    return bench_row(name, overrides, r, peak, wall)


def _peak_for_device() -> tuple[Optional[float], Optional[str], str]:
    import torch

    if not torch.cuda.is_available():
        return None, None, "CPU"
    name = torch.cuda.get_device_name(0)
    peak, key = peak_bf16_tflops(name)
    return peak, key, name


def _base(ctx: Context, batch: int, *extra: str) -> list[str]:
    """The base config's overrides at ``batch`` (bf16, uint8 images, ALBEF's queue) and ``extra``."""
    return [
        *pretrain_args(ctx, ctx.plan.base_model),
        "model.queue_size=65536",
        f"data.batch_size={batch}",
        "data.image.uint8=true",
        "train.precision=bf16",
        *extra,
    ]


def section_bench(ctx: Context) -> dict[str, Any]:
    """Eager bf16 at the base config, batch 64 and 128: pairs/s, phases, MFU, and launches and
    syncs per step counted by ``torch.profiler`` over a few more steps."""
    p = ctx.plan
    peak, key, name = _peak_for_device()
    rows = [
        _bench_row(f"base bf16 eager, batch {b}", _base(ctx, b), p.base_steps, peak, p.profile_steps)
        for b in p.base_batches
    ]
    checks = {f"{r['name']}: pairs/s > 0": r["pairs_per_s"] > 0 for r in rows}
    checks |= {f"{r['name']}: FLOP counted": r["gflop_per_pair"] > 0 for r in rows}
    checks |= {f"{r['name']}: {p.profile_steps} steps profiled": r["profile"]["steps"] == p.profile_steps for r in rows}
    if device().type == "cuda":
        checks |= {f"{r['name']}: kernel launches seen": r["profile"]["kernel_launches_per_step"] > 0 for r in rows}
    return {
        "results": {"device": name, "peak_bf16_tflops": peak, "peak_table_entry": key, "rows": rows},
        "checks": checks,
        "summary": "; ".join(
            f"{r['name']} {r['pairs_per_s']:.1f} pairs/s"
            + (f", MFU {100 * r['mfu']:.1f}%" if r["mfu"] else "")
            + f", {r['profile']['kernel_launches_per_step']:.0f} launches / {r['profile']['syncs_per_step']:.0f} "
            "syncs per step"
            for r in rows
        ),
    }


def _dynamo_reset() -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters, guard_failures

    torch._dynamo.reset()
    counters.clear()
    guard_failures.clear()


#: the compile sections' ways, by name: their overrides on top of the base config
COMPILE_MODES = {
    "off": ["train.compile=off"],
    "full": ["train.compile=full"],
    "full+cuda_graphs": ["train.compile=full", "train.cuda_graphs=true"],
}


def _not_run_on_cpu(name: str, overrides: list[str], batch: int) -> dict[str, Any]:
    """The row of a CUDA-graph run on a machine without CUDA: not run, "not captured" (the config
    refuses CUDA graphs with the CPU mode's eager backend, and without CUDA there is none to capture)."""
    from vlp.train.compile_watch import CompileRecord, cuda_graph_status

    return {
        "name": name,
        "overrides": overrides,
        "batch": batch,
        "compile": "full",
        "precision": "bf16",
        "cuda_graphs": cuda_graph_status(True, "cpu", CompileRecord()),
        "not_captured": cuda_graph_status(True, "cpu", CompileRecord()),
        "pairs_per_s": None,
        "compile_record": None,
    }


def compile_rows(ctx: Context, batch: int, modes: list[str]) -> list[dict[str, Any]]:
    """The base bf16 bench (``data.text_padding=max_len``) at ``batch``, one row per mode of
    :data:`COMPILE_MODES` (a fresh dynamo for each); on CPU the CUDA-graph rows are not run."""
    p = ctx.plan
    peak, _, _ = _peak_for_device()
    rows = []
    for mode in modes:
        extra = COMPILE_MODES[mode]
        overrides = _base(ctx, batch, "data.text_padding=max_len", f"train.compile_backend={p.compile_backend}", *extra)
        name = f"base bf16 {mode}, batch {batch}"
        if "train.cuda_graphs=true" in extra and device().type != "cuda":
            rows.append(_not_run_on_cpu(name, overrides, batch))
            continue
        _dynamo_reset()
        rows.append(_bench_row(name, overrides, p.compile_steps, peak))
    _dynamo_reset()
    return rows


def compile_checks(rows: list[dict[str, Any]], on_cuda: bool) -> dict[str, bool]:
    """Each compile row's checks: a speed (unless not run), two graphs (the forward, the post-step) and
    no graph break or recompile under train.compile=full, and on CUDA the CUDA graphs captured."""
    checks: dict[str, bool] = {}
    for r in rows:
        if r["pairs_per_s"] is not None:
            checks[f"{r['name']}: pairs/s > 0"] = r["pairs_per_s"] > 0
        c = r["compile_record"]
        if r["compile"] == "full" and c is not None:
            checks[f"{r['name']}: 2 graphs, no break, no recompile"] = (
                c["graphs"] == 2 and c["graph_breaks"] == 0 and c["recompiles"] == 0
            )
        if r.get("cuda_graphs") is not None and (on_cuda or c is not None):
            checks[f"{r['name']}: CUDA graphs captured"] = r["not_captured"] is None
    return checks


def _compile_section(ctx: Context, batch: int, modes: list[str]) -> dict[str, Any]:
    rows = compile_rows(ctx, batch, modes)
    name = _peak_for_device()[2]

    def line(r: dict[str, Any]) -> str:
        if r["not_captured"] or r["pairs_per_s"] is None:
            return f"{r['name']}: {r['not_captured']}"
        warm = f" (warm-up {r['warmup_s']:.0f} s)" if r["compile"] != "off" else ""
        return f"{r['name']} {r['pairs_per_s']:.1f} pairs/s{warm}"

    return {
        "results": {"device": name, "backend": ctx.plan.compile_backend, "batch": batch, "rows": rows},
        "checks": compile_checks(rows, device().type == "cuda"),
        "summary": f"{ctx.plan.compile_backend}: " + "; ".join(line(r) for r in rows),
    }


def section_compile_64(ctx: Context) -> dict[str, Any]:
    """Eager, ``train.compile=full`` and full with CUDA graphs at the first batch (ALBEF's 64)."""
    return _compile_section(ctx, ctx.plan.base_batches[0], ["off", "full", "full+cuda_graphs"])


def section_compile_128(ctx: Context) -> dict[str, Any]:
    """``train.compile=full`` and full with CUDA graphs at the second batch (128; eager: the bench's)."""
    return _compile_section(ctx, ctx.plan.base_batches[1], ["full", "full+cuda_graphs"])


def retrieval_checkpoint(ctx: Context, model: list[str]) -> Path:
    """The checkpoint to evaluate: one bf16 ``vlp pretrain`` step at ``model`` (ALBEF's queue; a small batch)
    -> its run folder."""
    from vlp.runs.training.pretrain import run_pretrain

    run = ctx.work / "retrieval_ckpt"
    run_pretrain(
        load_cfg(
            pretrain_args(
                ctx,
                model,
                "model.queue_size=65536",
                f"data.batch_size={min(8, ctx.plan.resume_batch)}",
                "train.steps=1",
                "train.warmup_steps=0",
                "train.precision=bf16",
                "train.save_state=false",
                "data.image.uint8=true",
                f"output_dir={run}",
            )
        )
    )
    return run


def retrieval_row(ctx: Context, run: Path, precision: str) -> dict[str, Any]:
    """Zero-shot retrieval with ITM re-ranking of the test split in ``precision`` -> its row: time, peak
    memory, ITM pairs, the score matrix's size, R@mean and the evaluation's own record."""
    from vlp.runs.evaluation.image_text_retrieval import run_evaluate_retrieval

    release()
    reset_peak()
    t0 = sync()
    res = run_evaluate_retrieval(
        run,
        ctx.world / "retrieval_test.json",
        None,
        ctx.work / f"eval_{precision}",
        overrides=[f"eval.k_test={ctx.plan.k_test}", "eval.score=itm", f"eval.precision={precision}"],
        show_progress=False,
    )
    seconds = sync() - t0
    mem, kind = peak_memory()
    m = res.metrics
    written = json.loads((ctx.work / f"eval_{precision}" / "metrics.json").read_text())
    return {
        "precision": precision,
        "seconds": seconds,
        "peak_memory_mb": mem,
        "peak_memory_kind": kind,
        "itm_pairs": int(m["itm_pairs"]),
        "n_images": res.scores_i2t.shape[0],
        "n_texts": res.scores_i2t.shape[1],
        "r_mean": m.get("r_mean"),
        "eval_record": {
            k: written.get(k)
            for k in ("precision", "offload", "processes", "image_size", "k_test", "score")
            if k in written
        },
    }


def retrieval_checks(p: Plan, rows: list[dict[str, Any]]) -> dict[str, bool]:
    """The retrieval section's checks on its rows: the score matrix's size, the evaluated resolution and
    precision, the number of ITM pairs."""
    n = p.test_images
    size = p.retrieval_size
    checks = {
        f"{r['precision']}: {n} images x {5 * n} captions": (r["n_images"], r["n_texts"]) == (n, 5 * n) for r in rows
    }
    checks |= {
        f"{r['precision']}: evaluated at {size} px in {r['precision']}": r["eval_record"].get("image_size") == size
        and r["eval_record"].get("precision") == r["precision"]
        for r in rows
    }
    k = p.k_test  # each caption's top k images are distinct pairs; each image's top k captions add at most n*k
    checks |= {
        f"{r['precision']}: ITM pairs in [{5 * n * k}, {6 * n * k}]": 5 * n * k <= r["itm_pairs"] <= 6 * n * k
        for r in rows
    }
    return checks


def section_retrieval(ctx: Context) -> dict[str, Any]:
    """Zero-shot retrieval with ITM re-ranking in fp32 and bf16 from a 1-step checkpoint: time, memory."""
    p = ctx.plan
    t0 = time.perf_counter()
    model = [*p.base_model, f"model.vision.img_size={p.retrieval_size}"]
    run = retrieval_checkpoint(ctx, model)
    ckpt_s = time.perf_counter() - t0
    rows = [retrieval_row(ctx, run, precision) for precision in ("fp32", "bf16")]
    release()
    return {
        "results": {"k_test": p.k_test, "model": model, "checkpoint_seconds": ckpt_s, "rows": rows},
        "checks": retrieval_checks(p, rows),
        "summary": "; ".join(
            f"{r['precision']} {r['seconds']:.1f} s, {r['peak_memory_mb']:.0f} MiB, {r['itm_pairs']} ITM pairs"
            for r in rows
        ),
    }


def section_loader(ctx: Context) -> dict[str, Any]:
    """``data.image.decode=device`` through ``vlp bench --loader-only`` (``full`` timed beside it)."""
    from vlp.runs.bench.loader import run_loader_bench

    p, on = ctx.plan, device()
    cfg = load_cfg(p.loader)
    rows = []
    for w, h in p.loader_sizes:
        out = ctx.out / f"loader_bench_{w}x{h}.json"
        r = run_loader_bench(
            cfg,
            n=p.loader_images,
            workers=p.workers,
            size=(w, h),
            decodes=("full", "device"),
            rounds=p.loader_rounds,
            out=out,
        )
        d, host = r["device_decode"], r["by_decode"]
        rows.append(
            {
                "source": f"{w}x{h}",
                "image_size": r["image_size"],
                "workers": r["workers"],
                "full_per_worker": host["full"]["images_per_s_per_worker"],
                "device_loader_per_worker": host["device"]["images_per_s_per_worker"],
                "device": d["device"],
                "device_images_per_s": d["images_per_s"],
                "ms_per_batch": d["ms_per_batch"],
                "batch": d["batch"],
                "jpeg_share": d["jpeg_share"],
                "mean_abs_diff_vs_cpu": d["mean_abs_diff_vs_cpu"],
                "json": str(out),
            }
        )
    checks = {f"the device's share ran on {on.type}": all(r["device"].startswith(on.type) for r in rows)}
    checks["every rate > 0"] = all(
        min(r["full_per_worker"], r["device_loader_per_worker"], r["device_images_per_s"]) > 0 for r in rows
    )
    checks["every image shipped as JPEG bytes"] = all(r["jpeg_share"] == 1.0 for r in rows)
    if on.type == "cuda":  # nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's: close, not equal
        checks["CUDA decode within 5/255 of the CPU's on average"] = all(r["mean_abs_diff_vs_cpu"] < 5 for r in rows)
    return {
        "results": {"config": str(CONFIG), "overrides": p.loader, "rows": rows},
        "checks": checks,
        "summary": "; ".join(
            f"{r['source']}: loader {r['full_per_worker']:.0f} (full) / {r['device_loader_per_worker']:.0f} (device) "
            f"images/s per worker, {r['device'].split(' ')[0]} {r['device_images_per_s']:.0f} images/s"
            for r in rows
        ),
    }
