"""LTD testbed on the shapes world: does the constraint keep caption information the contrastive loss drops?

    python scripts/experiments/ltd_testbed.py --out runs/ltd_testbed     # 4 arms x 5 seeds

1. writes a shapes world and embeds every training caption once with the offline all-MiniLM-L6-v2
   (``vlp make-targets``);
2. computes the L_rec floor of each suppressed attribute from the targets (``vlp analyze
   ltd-floor``): the lowest reconstruction loss a decoder can reach when the caption embedding
   carries nothing of that attribute. The constraint's bound is set below the floors of the
   attributes it can protect (``--protect``, default shape and colour: ``--eta-fraction`` x the
   smaller of their floors). With MiniLM targets the size, cell, count and relation floors
   (0.002-0.01) lie below the L_rec the model can reach (~0.03-0.05), so no feasible bound
   protects those: they are probed all the same;
3. trains the resource-constrained dual encoder (``configs/ltd/shapes_dual.yaml``) for every arm
   and seed with the same data order and steps: the InfoNCE baseline, LTD with the constraint,
   LTD as a dual loss with beta matched to the constraint's mean lambda / eta of the same seed, and
   LTD as a dual loss with beta 1;
4. evaluates zero-shot retrieval on the test split (R@k, R-precision, graded nDCG), the linear
   attribute probes on frozen caption embeddings of the held-out captions (``vlp analyze probes``)
   and minimal-pair retrieval (``vlp analyze minimal-pairs``), and writes ``OUT/results.json``,
   ``OUT/report.md`` (mean ± std over seeds) and the lambda / L_rec trajectories of the
   constraint arm (``OUT/lambda.png``, ``OUT/ltd_rec.png``).

Every run is skipped when its result already exists, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from harness import (
    Sweep,
    experiment_parser,
    paired_table,
    paired_tests_table,
    plot_arm_bars,
    prepare_lock,
    prepare_world,
    results_table,
    run_minutes,
    write_report,
)
from seed_results import SeedResults, slug

from vlp.lab.ltd_floor import run_ltd_floor
from vlp.lab.minimal_pairs import run_minimal_pairs
from vlp.lab.probes import run_probes
from vlp.locks import file_lock
from vlp.runs.training.features import run_make_targets
from vlp.train.preemption import exit_status
from vlp.viz import plot_run_curves

ATTRIBUTES = ("shape", "color", "size", "cell", "count")
METRICS = (
    "rsum img_r1 img_r5_rel img_r_precision img_ndcg10 txt_r_precision "
    "probe_shape probe_color probe_size probe_cell probe_count mp_shape mp_color mp_size mp_cell mp_all"
).split()


MATCHED = "LTD dual (beta matched)"
PRIMARY = ("mp_shape", "img_r_precision", "img_ndcg10")  # the pre-stated endpoints (docs/experiments.md)


def arms(eta: float) -> dict[str, list[str]]:
    """The arms; the matched dual arm's beta is set per seed (:func:`matched_beta`). It comes two
    places after the constraint arm, so with two shards (every other run) both land in the same
    shard, constraint first."""
    return {
        "InfoNCE baseline": [],
        f"LTD constraint eta {eta:.3g}": ["loss.ltd.mode=constraint", f"loss.ltd.eta={eta}"],
        "LTD dual (beta 1)": ["loss.ltd.mode=dual"],
        MATCHED: ["loss.ltd.mode=dual"],
    }


def matched_beta(constraint_run: Path, eta: float) -> float:
    """The dual weight that matches the constraint run's average pull on L_rec: the constraint
    L_con + lambda (L_rec / eta - 1) weighs L_rec by lambda / eta, so beta = mean over the logged
    steps of lambda, divided by eta. Comparing beta with lambda itself understates that weight by
    1 / eta (about 28x at eta 0.035)."""
    from vlp.train.logging import read_metrics

    f = constraint_run / "metrics.jsonl"
    lams = [r["ltd_lambda"] for r in read_metrics(f) if "ltd_lambda" in r] if f.exists() else []
    if not lams:
        raise RuntimeError(f"{f}: no logged lambda; run the constraint arm of this seed first")
    return sum(lams) / len(lams) / eta


def probe_metrics(name: str, seed: int, run: Path, root: Path) -> dict[str, float]:
    """Probe and minimal-pair accuracies (%) of a trained run, as flat metrics."""
    probes = run_probes(run, root, run / "probes")["attributes"]
    pairs = run_minimal_pairs(run, root, run / "probes")["attributes"]
    out = {f"probe_{a}": 100 * r["accuracy"] for a, r in probes.items() if "accuracy" in r}
    out |= {f"probe_{a}_majority": 100 * r["majority"] for a, r in probes.items() if "majority" in r}
    out |= {f"mp_{a}": 100 * r["accuracy"] for a, r in pairs.items() if "accuracy" in r}
    return out


class Prepared(NamedTuple):
    """The shared inputs of every run: the world, the caption targets and the constraint's bound."""

    root: Path  # the shapes world
    targets: Path  # all-MiniLM-L6-v2 embeddings of the training captions
    floors: dict[str, Any]  # the L_rec floor record of each suppressed attribute
    lowest: str  # the protected attribute with the lowest floor
    eta: float  # the constraint's bound


def prepare(a: argparse.Namespace, out: Path) -> Prepared:
    """The world, its caption targets and the L_rec floors (each made once, under the prepare lock) and
    the constraint's bound (``--eta``, else ``--eta-fraction`` x the lowest protected floor)."""
    with file_lock(prepare_lock(out)):  # shards (--shard) prepare one at a time
        root = prepare_world(out, a.images, a.test_images)
        targets = root / "targets_minilm.safetensors"
        if not targets.exists():
            run_make_targets([str(root / "pretrain.json")], "all-MiniLM-L6-v2", targets)
        floor_file = out / "floor" / "ltd_floor.json"
        if not floor_file.exists():
            run_ltd_floor(targets, [root / "pretrain.json"], out / "floor", attributes=[*ATTRIBUTES, "caption"])
        floors = json.loads(floor_file.read_text())["floors"]
        lowest = min(a.protect, key=lambda x: floors[x]["floor"])
        eta = a.eta if a.eta is not None else round(a.eta_fraction * floors[lowest]["floor"], 4)
    return Prepared(root, targets, floors, lowest, eta)


def constraint_arm(variants: dict[str, list[str]]) -> str:
    """The name of the constraint arm among ``variants``."""
    return next(n for n in variants if n.startswith("LTD constraint"))


def run_arms(
    a: argparse.Namespace, out: Path, prep: Prepared, variants: dict[str, list[str]], t0: float
) -> SeedResults:
    """Train and evaluate every arm and seed of this shard (done runs skipped) -> the results so far."""
    root, eta = prep.root, prep.eta
    constraint = constraint_arm(variants)

    def overrides(name: str, seed: int) -> list[str]:
        extra = list(variants[name])
        if name == MATCHED:
            extra.append(f"loss.ltd.beta={matched_beta(out / f'{slug(constraint)}_seed{seed}', eta):.6g}")
        return ["train.progress=false", f"loss.ltd.targets={prep.targets}", *extra]

    results = SeedResults(out / "results.json")
    Sweep(
        results,
        root,
        "configs/ltd/shapes_dual.yaml",
        root / "pretrain.json",
        a.steps,
        run_dir=lambda name, seed: out / f"{slug(name)}_seed{seed}",
        overrides=overrides,
        summary=lambda m: (
            f"rsum {m['rsum']:.1f} R-prec(t2i) {m['img_r_precision']:.2f} "
            f"probe size {m.get('probe_size', float('nan')):.1f} mp {m.get('mp_all', float('nan')):.1f}"
        ),
        name_width=28,
        graded=True,
        timed=True,
        t0=t0,
        after=lambda name, seed, run: probe_metrics(name, seed, run, root),
    ).run(a.seeds, list(variants), shard=a.shard)
    return results


def plot_results(a: argparse.Namespace, out: Path, results: SeedResults, constraint: str, eta: float) -> None:
    """The constraint arm's lambda and L_rec curves and the minimal-pair and probe bars per arm (PNGs in ``out``)."""
    curves = {f"seed {s}": out / f"{slug(constraint)}_seed{s}" / "metrics.jsonl" for s in a.seeds}
    curves = {k: v for k, v in curves.items() if v.exists()}
    if curves:
        plot_run_curves(curves, "ltd_lambda", out / "lambda.png", f"lambda, LTD constraint eta {eta:.3g}")
        plot_run_curves(
            curves, "ltd_rec", out / "ltd_rec.png", f"L_rec (dotted: eta {eta:.3g})", hlines={k: eta for k in curves}
        )
    attrs = ("shape", "color", "size", "cell", "count")
    plot_arm_bars(
        results,
        a.seeds,
        [f"mp_{k}" for k in attrs] + ["mp_all"],
        out / "minimal_pairs.png",
        "minimal-pair accuracy by attribute (dotted: chance 50)",
        chance=50.0,
    )
    plot_arm_bars(
        results,
        a.seeds,
        [f"probe_{k}" for k in attrs],
        out / "probes.png",
        "linear-probe accuracy on caption embeddings",
    )


def write_ltd_report(
    a: argparse.Namespace, out: Path, results: SeedResults, prep: Prepared, variants: dict[str, list[str]]
) -> None:
    """``OUT/report.md``: the setup, the floors, the results over seeds, the paired differences and tests
    and the matched arm's beta per seed."""
    eta, constraint = prep.eta, constraint_arm(variants)
    floor_rows = "\n".join(
        f"| {k} | {f['floor']:.4f} | {f['floor_mentioning']:.4f} | {100 * f['share_mentioning']:.0f}% |"
        for k, f in prep.floors.items()
    )
    write_report(
        out / "report.md",
        f"Shapes world: {a.images} training images (5 captions each), `configs/ltd/shapes_dual.yaml` from scratch, "
        f"{a.steps} steps, {len(a.seeds)} seeds, {run_minutes(results)} on this machine. LTD targets: "
        f"all-MiniLM-L6-v2. Constraint bound eta = {eta:.4g} ({a.eta_fraction:g} x the floor of {prep.lowest}, the lower "
        f"of the protected {' and '.join(a.protect)}). Zero-shot retrieval on the {a.test_images}-image test split (ITC cosine); probes: linear, on frozen "
        "embeddings of the test split's distinct captions (accuracy %, held-out half); mp: minimal-pair accuracy % "
        "(chance 50).",
        "| suppressed | L_rec floor | over captions mentioning it | captions mentioning it |\n|---|---:|---:|---:|\n"
        + floor_rows,
        results_table(results, a.seeds, METRICS),
        "Differences from the InfoNCE baseline, seed by seed (same data order and initialisation):",
        paired_table(results.data, a.seeds, METRICS, lambda name: "InfoNCE baseline"),
        "Paired t-tests on the pre-stated endpoints (docs/experiments.md), against the baseline and "
        "between the constraint and the matched dual arm:",
        paired_tests_table(results.data, a.seeds, PRIMARY, "InfoNCE baseline", list(variants)),
        paired_tests_table(results.data, a.seeds, PRIMARY, MATCHED, [constraint]),
        "beta of the matched dual arm per seed (mean lambda / eta of the constraint run): "
        + ", ".join(
            f"seed {s} {matched_beta(out / f'{slug(constraint)}_seed{s}', eta):.2f}"
            for s in a.seeds
            if (out / f"{slug(constraint)}_seed{s}" / "metrics.jsonl").exists()
        ),
    )


def main(argv=None) -> int:
    p = experiment_parser(__doc__, out="runs/ltd_testbed", steps=400)
    p.set_defaults(seeds=[0, 1, 2, 3, 4])
    p.add_argument("--eta", type=float, help="the constraint's bound (default: --eta-fraction x the protected floors)")
    p.add_argument("--protect", nargs="+", default=["shape", "color"], choices=list(ATTRIBUTES))
    p.add_argument("--eta-fraction", type=float, default=0.8)
    a = p.parse_args(argv)
    out = Path(a.out)
    t0 = time.time()
    prep = prepare(a, out)
    variants = arms(prep.eta)
    results = run_arms(a, out, prep, variants, t0)
    if a.shard != (0, 1):
        print(f"shard {a.shard[0]}/{a.shard[1]} done; run again without --shard for the report", flush=True)
        return 0
    plot_results(a, out, results, constraint_arm(variants), prep.eta)
    write_ltd_report(a, out, results, prep, variants)
    return 0


if __name__ == "__main__":
    sys.exit(exit_status(main, "ltd_testbed.py"))
