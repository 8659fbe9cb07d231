"""Experiment summaries: resumable per-seed results, mean ± sample std over seeds, Markdown tables (the
experiment scripts' helper; moved here from vlp/eval, which no code of vlp used)."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
from pathlib import Path
from typing import Sequence

from vlp.locks import file_lock


def slug(name: str) -> str:
    """A variant name as a folder name: ``"LTD constraint eta 0.2"`` -> ``ltd_constraint_eta_0_2``."""
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


def summarise(
    results: dict[str, dict[str, dict[str, float]]], seeds: Sequence[int], metrics: Sequence[str]
) -> dict[str, dict[str, tuple[float, float, int]]]:
    """``results[variant][seed][metric]`` -> ``{variant: {metric: (mean, std, n)}}`` over the given
    seeds that are present and have the metric (sample std; 0 for one seed)."""
    out = {}
    for name, per_seed in results.items():
        present = [per_seed[str(s)] for s in seeds if str(s) in per_seed]
        vals = {m: [r[m] for r in present if m in r] for m in metrics}  # a seed may lack a metric
        out[name] = {
            m: (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v)) for m, v in vals.items() if v
        }
    return out


def paired_differences(
    results: dict[str, dict[str, dict[str, float]]], seeds: Sequence[int], metrics: Sequence[str], baseline: str
) -> dict[str, dict[str, tuple[float, float, int]]]:
    """Each variant minus ``baseline``, seed by seed: ``{variant: {metric: (mean, std, n)}}`` of
    ``results[variant][s][metric] - results[baseline][s][metric]`` over the given seeds both have
    (sample std; 0 for one seed). Arms that share a seed share its warm-up and data order, so the
    spread of the differences, not of the arms, says whether an effect is larger than the noise.
    The baseline itself is left out."""
    base = results.get(baseline, {})
    out = {}
    for name, per_seed in results.items():
        if name == baseline:
            continue
        shared = [str(s) for s in seeds if str(s) in per_seed and str(s) in base]
        row = {}
        for m in metrics:
            d = [per_seed[s][m] - base[s][m] for s in shared if m in per_seed[s] and m in base[s]]
            if d:
                row[m] = (statistics.mean(d), statistics.stdev(d) if len(d) > 1 else 0.0, len(d))
        out[name] = row
    return out


def student_t_two_sided(t: float, dof: int, intervals: int = 4000) -> float:
    """Two-sided p-value of Student's t statistic ``t`` with ``dof`` degrees of freedom:
    ``P(|T| >= |t|)``. The density is integrated from 0 to ``|t|`` by Simpson's rule (exact to
    about 1e-10 for the few degrees of freedom of a seed comparison); no SciPy needed."""
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    if math.isnan(t):
        return float("nan")
    x = min(abs(t), 1e6)
    if x == 0.0:
        return 1.0
    log_c = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)

    def pdf(u: float) -> float:
        return math.exp(log_c - (dof + 1) / 2 * math.log1p(u * u / dof))

    # integrate in arctan space so very large t costs no more than small t: u = tan(v)
    top = math.atan(x)
    h = top / intervals
    acc = 0.0
    for k in range(intervals + 1):
        v = k * h
        f = pdf(math.tan(v)) / math.cos(v) ** 2
        acc += f * (1 if k in (0, intervals) else 4 if k % 2 else 2)
    return max(0.0, 1.0 - 2.0 * acc * h / 3.0)


def paired_t_test(differences: Sequence[float]) -> tuple[float, float]:
    """Paired t-test of per-seed differences (variant - baseline) against 0: ``(t, p)`` with
    ``t = mean / (std / sqrt(n))`` (sample std) and the two-sided p-value with n - 1 degrees of
    freedom. NaN for fewer than two differences; ``t`` is +-inf (p 0) when every difference is
    equal and non-zero."""
    n = len(differences)
    if n < 2:
        return float("nan"), float("nan")
    mean, sd = statistics.mean(differences), statistics.stdev(differences)
    if sd == 0.0:
        return (0.0, 1.0) if mean == 0.0 else (math.copysign(math.inf, mean), 0.0)
    t = mean / (sd / math.sqrt(n))
    return t, student_t_two_sided(t, n - 1)


def markdown_table(summary: dict[str, dict[str, tuple[float, float, int]]], metrics: Sequence[str]) -> str:
    lines = [f"| variant | seeds | {' | '.join(metrics)} |", "|---|---:|" + "---:|" * len(metrics)]
    for name, row in summary.items():
        n = max((v[2] for v in row.values()), default=0)
        lines.append(
            f"| {name} | {n} | "
            + " | ".join(f"{row[m][0]:.2f} ± {row[m][1]:.2f}" if m in row else "-" for m in metrics)
            + " |"
        )
    return "\n".join(lines)


class SeedResults:
    """``results[variant][seed] -> metrics`` kept in a JSON file, rewritten after every run, so an
    experiment script resumes where it stopped."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.data: dict[str, dict[str, dict[str, float]]] = (
            json.loads(self.path.read_text()) if self.path.exists() else {}
        )

    def has(self, variant: str, seed: int) -> bool:
        return str(seed) in self.data.get(variant, {})

    @staticmethod
    def fresh(run_dir: Path) -> Path:
        """``run_dir`` emptied of an interrupted run (one without a recorded result)."""
        if run_dir.exists():
            shutil.rmtree(run_dir)
        return run_dir

    def add(self, variant: str, seed: int, metrics: dict[str, float]) -> None:
        """Record one run, merged with what other writers of the file (shards of the same
        experiment, ``--shard``) recorded since: a lock file serialises the writers and the file is
        replaced atomically, so none overwrites another's records."""
        with file_lock(self.path.with_name(self.path.name + ".lock")):
            if self.path.exists():
                for name, per_seed in json.loads(self.path.read_text()).items():
                    for s, m in per_seed.items():
                        self.data.setdefault(name, {}).setdefault(s, m)
            self.data.setdefault(variant, {})[str(seed)] = metrics
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(self.data, indent=1))
            os.replace(tmp, self.path)
