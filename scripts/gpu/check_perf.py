"""The measuring sections of ``make gpu-check`` (``check.py``): bench, compile, retrieval, loader."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any, Optional

from check_common import (
    CONFIG,
    Context,
    Plan,
    device,
    has_tf32_key,
    load_cfg,
    peak_bf16_tflops,
    peak_memory,
    pretrain_args,
    release,
    reset_peak,
    sync,
)


def _bench_row(name: str, overrides: list[str], warmup: int, steps: int, peak_bf16: Optional[float]) -> dict[str, Any]:
    from vlp.runs.bench import run_bench

    cfg = load_cfg(overrides)
    tf32 = bool(getattr(cfg.train, "tf32", False)) if cfg.train.precision == "fp32" else None
    on_cuda = device().type == "cuda"
    peak = None
    if peak_bf16 is not None and on_cuda:
        peak = peak_bf16 if cfg.train.precision == "bf16" else (peak_bf16 / 2 if tf32 else None)
    release()
    t0 = time.perf_counter()
    r = run_bench(cfg, steps=steps, warmup=warmup, peak_tflops=peak)
    wall = time.perf_counter() - t0
    release()
    return {
        "name": name,
        "overrides": overrides,
        "device": r["device"],
        "precision": r["precision"],
        "tf32": tf32 if on_cuda else None,
        "compile": cfg.train.compile,
        "batch": r["batch_per_process"],
        "warmup": warmup,
        "steps": steps,
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
        "wall_s": wall,
    }


def _peak_for_device() -> tuple[Optional[float], Optional[str], str]:
    import torch

    if not torch.cuda.is_available():
        return None, None, "CPU"
    name = torch.cuda.get_device_name(0)
    peak, key = peak_bf16_tflops(name)
    return peak, key, name


def section_bench(ctx: Context) -> dict[str, Any]:
    p = ctx.plan
    peak, key, name = _peak_for_device()
    tf32 = ["train.tf32=true"] if has_tf32_key() else []
    common = pretrain_args(ctx, [])
    base = [
        *common,
        *p.base_model,
        "model.queue_size=65536",
        f"data.batch_size={p.base_batch}",
        "data.image.uint8=true",
    ]
    rows = [
        _bench_row("tiny (shapes_tiny)", [*common, *p.tiny_model], *p.tiny_steps, peak),
        _bench_row("base bf16", [*base, "train.precision=bf16"], *p.base_steps, peak),
        _bench_row(
            "base fp32" + (", train.tf32=true" if tf32 else ""),
            [*base, "train.precision=fp32", *tf32],
            *p.base_steps,
            peak,
        ),
    ]
    checks = {f"{r['name']}: pairs/s > 0": r["pairs_per_s"] > 0 for r in rows}
    checks |= {f"{r['name']}: FLOP counted": r["gflop_per_pair"] > 0 for r in rows}
    return {
        "results": {
            "device": name,
            "peak_bf16_tflops": peak,
            "peak_table_entry": key,
            "train_tf32_key": bool(tf32),
            "rows": rows,
        },
        "checks": checks,
        "summary": "; ".join(
            f"{r['name']} {r['pairs_per_s']:.1f} pairs/s" + (f", MFU {100 * r['mfu']:.1f}%" if r["mfu"] else "")
            for r in rows
        ),
    }


def _dynamo_stats() -> dict[str, Any]:
    from torch._dynamo.utils import counters, guard_failures

    reasons = [r for v in guard_failures.values() for r in v]
    return {
        "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "frames_compiled": int(counters["frames"].get("ok", 0)),
        "recompiles": len(reasons),
        "recompile_reasons": [str(r)[:200] for r in reasons[:8]],
    }


def _dynamo_reset() -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters, guard_failures

    torch._dynamo.reset()
    counters.clear()
    guard_failures.clear()


def section_compile(ctx: Context) -> dict[str, Any]:
    """Eager against ``train.compile`` blocks / full / full with CUDA graphs at the base config (bf16,
    fixed text length for all four): pairs/s, wall time with compilation, graphs and recompiles."""
    p = ctx.plan
    peak, _, name = _peak_for_device()
    base = [
        *pretrain_args(ctx, p.base_model),
        "model.queue_size=65536",
        f"data.batch_size={p.base_batch}",
        "data.image.uint8=true",
        "data.text_padding=max_len",
        "train.precision=bf16",
        f"train.compile_backend={p.compile_backend}",
    ]
    modes = {
        "off": ["train.compile=off"],
        "blocks": ["train.compile=blocks"],
        "full": ["train.compile=full"],
        "full+cuda_graphs": ["train.compile=full", "train.cuda_graphs=true"],
    }
    rows, stats = [], {}
    for mode, extra in modes.items():
        _dynamo_reset()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            row = _bench_row(f"base bf16, {' '.join(extra)}", [*base, *extra], *p.compile_steps, peak)
        row["warnings"] = [str(w.message)[:300] for w in seen if "cuda_graphs" in str(w.message)]
        rows.append(row)
        stats[mode] = _dynamo_stats()
    _dynamo_reset()
    eager = rows[0]
    speedup = {
        r["name"]: r["pairs_per_s"] / eager["pairs_per_s"] if eager["pairs_per_s"] else float("nan") for r in rows
    }
    return {
        "results": {"device": name, "backend": p.compile_backend, "rows": rows, "speedup": speedup, "dynamo": stats},
        "checks": {
            "pairs/s > 0 every way": all(r["pairs_per_s"] > 0 for r in rows),
            "train.compile=off compiled nothing": stats["off"]["unique_graphs"] == 0,
            "train.compile=blocks compiled graphs": stats["blocks"]["unique_graphs"] > 0,
            # the forward (with its backward) and the post-step (vlp/train/post_step.py)
            "train.compile=full: a forward and a post-step graph, no recompile": stats["full"]["unique_graphs"] == 2
            and stats["full"]["recompiles"] == 0,
        },
        "summary": f"{p.compile_backend}: "
        + ", ".join(f"{m} {r['pairs_per_s']:.1f} pairs/s ({r['wall_s']:.0f} s wall)" for m, r in zip(modes, rows))
        + f"; full: {stats['full']['unique_graphs']} graphs, {stats['full']['recompiles']} recompiles",
    }


def retrieval_checkpoint(ctx: Context, model: list[str]) -> Path:
    """The checkpoint to evaluate: one bf16 ``vlp pretrain`` step at ``model`` (ALBEF's queue; a small batch)
    -> its run folder."""
    from vlp.runs.pretrain import run_pretrain

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
    from vlp.runs.evaluate import run_evaluate_retrieval

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
    from vlp.runs.loader_bench import run_loader_bench

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
