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
    lines = [
        f"# gpu-check: {'PASSED' if report['passed'] else 'FAILED'}",
        "",
        f"{report['mode']} mode, device {env.get('device')}, torch {env.get('torch')}, python {env.get('python')}, "
        f"{report['finished']} UTC, {report['seconds']:.0f} s"
        + (
            " (CPU mode: tiny sizes everywhere, the 'base' rows included; exact settings in gpu_check.json)"
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
        *secs.get("bench", {}).get("results", {}).get("rows", []),
        *secs.get("compile", {}).get("results", {}).get("rows", []),
    ]
    if rows:
        lines += [
            "",
            "| bench | precision | batch | pairs/s | ms/step (data, fwd, bwd, opt) | peak memory | GFLOP/pair | "
            "TFLOP/s | peak | MFU |",
            "|---|---|---:|---:|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            ph = r["ms_phases"]
            prec = r["precision"] + (" + TF32" if r.get("tf32") else "") + (" compiled" if r.get("compile") else "")
            lines.append(
                f"| {r['name']} | {prec} | {r['batch']} | {r['pairs_per_s']:.1f} | {r['ms_per_step']:.1f} "
                f"({ph['data']:.1f}, {ph['forward']:.1f}, {ph['backward']:.1f}, {ph['optimizer']:.1f}) | "
                f"{r['peak_memory_mb']:.0f} MiB | {r['gflop_per_pair']:.2f} | {r['achieved_tflops']:.3f} | "
                f"{_f(r['peak_tflops'], '{:.0f}')} | {_f(r['mfu'] and 100 * r['mfu'], '{:.1f}%')} |"
            )
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
