"""Experiment summaries: mean ± sample std over seeds, as a Markdown table."""

from __future__ import annotations

import statistics
from typing import Sequence


def slug(name: str) -> str:
    """A variant name as a folder name: ``"LTD constraint eta 0.2"`` -> ``ltd_constraint_eta_0_2``."""
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


def summarise(results: dict[str, dict[str, dict[str, float]]], seeds: Sequence[int],
              metrics: Sequence[str]) -> dict[str, dict[str, tuple[float, float, int]]]:
    """``results[variant][seed][metric]`` -> ``{variant: {metric: (mean, std, n)}}`` over the given
    seeds that are present (sample std; 0 for one seed)."""
    out = {}
    for name, per_seed in results.items():
        vals = {m: [per_seed[str(s)][m] for s in seeds if str(s) in per_seed] for m in metrics}
        out[name] = {m: (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v))
                     for m, v in vals.items() if v}
    return out


def markdown_table(summary: dict[str, dict[str, tuple[float, float, int]]], metrics: Sequence[str]) -> str:
    lines = [f"| variant | seeds | {' | '.join(metrics)} |", "|---|---:|" + "---:|" * len(metrics)]
    for name, row in summary.items():
        n = max((v[2] for v in row.values()), default=0)
        lines.append(f"| {name} | {n} | " + " | ".join(f"{row[m][0]:.2f} ± {row[m][1]:.2f}" if m in row else "-"
                                                      for m in metrics) + " |")
    return "\n".join(lines)
