"""The Markdown table of ``make gpu-check``'s report (``check.py``: ``OUT/gpu_check.md``)."""

from __future__ import annotations

import math
from typing import Any


def _f(x: Any, fmt: str = "{:.1f}", none: str = "n/a") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    return fmt.format(x)


def markdown(report: dict[str, Any]) -> str:
    env, secs = report["environment"], report["sections"]
    title = "gpu-check" if report.get("part", "eager") == "eager" else "gpu-check-compile"
    lines = [
        f"# {title}: {'PASSED' if report['passed'] else 'FAILED'}",
        "",
        f"{report['mode']} mode, device {env.get('device')}, torch {env.get('torch')}, python {env.get('python')}, "
        f"{report['finished']} UTC, {report['seconds']:.0f} s"
        + (
            f" (CPU mode: tiny sizes everywhere, the 'base' rows included; exact settings in {title.replace('-', '_')}.json)"
            if report["mode"] == "cpu"
            else ""
        ),
        "",
        "| section | status | time | budget | result |",
        "|---|---|---:|---:|---|",
    ]
    for name in report["section_order"]:
        r = secs[name]
        status = "pass" if r["passed"] else "FAIL"
        text = r.get("summary") or ""
        if r.get("error"):
            text = (text + "; " if text else "") + "error: " + r["error"].replace("\n", " ")[:300]
        lines.append(
            f"| {name} | {status} | {r.get('seconds', 0):.1f} s | {_f(r.get('budget_s'), '{:.0f} s')} | "
            f"{text.replace('|', '/')} |"
        )
    rows = [
        r
        for name in ("bench", "compile_64", "compile_128")
        for r in secs.get(name, {}).get("results", {}).get("rows", [])
    ]
    lines += bench_table(rows)
    ret = secs.get("retrieval", {}).get("results", {}).get("rows", [])
    if ret:
        lines += [
            "",
            f"| retrieval (k_test {secs['retrieval']['results']['k_test']}) | images x captions | time | "
            "peak memory | ITM pairs |",
            "|---|---|---:|---:|---:|",
        ]
        for r in ret:
            lines.append(
                f"| {r['precision']} | {r['n_images']} x {r['n_texts']} | {r['seconds']:.1f} s | "
                f"{r['peak_memory_mb']:.0f} MiB | {r['itm_pairs']} |"
            )
    lines += _loader_table(secs.get("loader", {}).get("results", {}).get("rows", []))
    return "\n".join(lines) + "\n"


def bench_table(rows: list[dict[str, Any]]) -> list[str]:
    """The bench and compile rows' table (no lines without rows): a row that asked for CUDA graphs and
    ran without them shows "not captured: REASON" instead of its speed."""
    if not rows:
        return []
    lines = [
        "",
        "| bench | batch | pairs/s | ms/step (data, fwd, bwd, opt) | peak memory | MFU | warm-up (compile) | "
        "graphs / breaks / recompiles | launches / syncs per step |",
        "|---|---:|---:|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        if r.get("not_captured") or r.get("pairs_per_s") is None:
            lines.append(f"| {r['name']} | {r['batch']} | {str(r.get('not_captured')).replace('|', '/')} | | | | | | |")
            continue
        ph, c, prof = r["ms_phases"], r.get("compile_record"), r.get("profile")
        graphs = f"{c['graphs']} / {c['graph_breaks']} / {c['recompiles']}" if c and r["compile"] != "off" else ""
        launches = f"{prof['kernel_launches_per_step']:.0f} / {prof['syncs_per_step']:.0f}" if prof else ""
        warm = f"{r['warmup_s']:.1f} s (first step {r['first_step_s'] or 0:.1f} s)" if r["warmup"] else "none"
        lines.append(
            f"| {r['name']}{' (CUDA graphs ' + r['cuda_graphs'] + ')' if r.get('cuda_graphs') else ''} | {r['batch']} | "
            f"{r['pairs_per_s']:.1f} | {r['ms_per_step']:.1f} ({ph['data']:.1f}, {ph['forward']:.1f}, "
            f"{ph['backward']:.1f}, {ph['optimizer']:.1f}) | {r['peak_memory_mb']:.0f} MiB | "
            f"{_f(r['mfu'] and 100 * r['mfu'], '{:.1f}%')} | {warm} | {graphs} | {launches} |"
        )
    return lines


def _loader_table(rows: list[dict[str, Any]]) -> list[str]:
    """The loader section's table (no lines without rows)."""
    if not rows:
        return []
    lines = [
        "",
        "| loader, decode=device | images/s per worker: full / device's loader share | device | decode + augment "
        "images/s | ms per batch | mean diff vs CPU |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['source']} -> {r['image_size']} px, {r['workers']} workers | {r['full_per_worker']:.1f} / "
            f"{r['device_loader_per_worker']:.1f} | {r['device']} | {r['device_images_per_s']:.1f} | "
            f"{r['ms_per_batch']:.1f} (batch {r['batch']}) | {_f(r['mean_abs_diff_vs_cpu'], '{:.2f}')} |"
        )
    return lines
