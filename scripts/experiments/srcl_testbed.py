"""SRCL testbed on the shapes world: does similarity-regulated ITC help, and is the helper good enough?

    python scripts/experiments/srcl_testbed.py --out runs/srcl_testbed                 # main grid, 5 seeds
    python scripts/experiments/srcl_testbed.py --out runs/srcl_testbed --grid ablations  # 3 seeds
    python scripts/experiments/srcl_testbed.py --out runs/srcl_testbed --grid removal    # Fig. 3a sweep
    python scripts/experiments/srcl_testbed.py --out runs/srcl_testbed --grid dose       # helper quality, 5 seeds

1. writes a shapes world with a disjoint helper split, and the diagnostic pretraining file: object
   and count captions only, so that about 17% of the in-batch negatives are true false negatives
   (``vlp make-world --caption-kinds object,count``);
2. trains the learned helper (the tiny architecture, plain InfoNCE) on the helper split, which has
   every caption kind and no training image, evaluates its own zero-shot retrieval and caches its
   features; writes the exact oracle (the world's ground-truth relevance as the helper's similarity);
3. diagnoses every similarity source on training batches (with the arm's queue): ROC-AUC at separating
   true false negatives from true negatives, delta by the 20% rule and by a target median
   false-negative weight (``--target-weight``, the paper's ~0.12-0.2), and the weights of both
   groups at each delta;
4. per seed, warms a tiny ALBEF up with plain in-batch ITC, then trains every arm of the grid from
   that warm-up with identical data order,
   steps and model, evaluates zero-shot retrieval on the test split (exact and graded relevance,
   every metric also over the generic captions only) and writes ``OUT/results_<grid>.json`` and
   ``OUT/report_<grid>.md`` (mean ± std over seeds).

The ``dose`` grid asks what a helper must be: the exact oracle corrupted by fixed per-pair noise
to ROC-AUC 0.75, 0.85 and 0.95 (``vlp cache-helper-features --oracle exact --oracle-auc``), the
exact oracle and plain ITC, every regulated arm at the delta that puts the false negatives'
median weight at the paper's 0.12, and the exact oracle at delta 1 (the old default); the report
adds a paired t-test of each arm against plain ITC.

Regulated arms keep the helper's share at 1 all run (``loss.srcl.alpha_h_end=1``: the question is
whether weighting by that similarity helps) unless the arm says otherwise. The main grid uses
in-batch negatives (``--queue 0``): with a 1,024 queue after a 200-step warm-up plain ITC and
oracle SRCL collapsed to chance on the tiny from-scratch model (ITC 7-8.6 against ln(1088) = 7.0,
R@1 at chance; the learned-helper arm of the ablation reached R-precision 17.0 against chance 11.0;
docs/experiments.md), so the queue is an ablation. Every step is skipped when its output
exists, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from harness import (
    Sweep,
    experiment_parser,
    helper_seed,
    paired_table,
    paired_tests_table,
    plot_sweep,
    prepare_lock,
    prepare_world,
    results_table,
    run_minutes,
    train_once,
    write_report,
)
from seed_results import SeedResults, slug, summarise

from vlp.lab.diagnostics import run_helper_diagnostics
from vlp.lab.oracle import run_cache_oracle_features
from vlp.locks import file_lock
from vlp.runs.evaluation.image_text_retrieval import run_evaluate_retrieval
from vlp.runs.training.features import run_cache_helper_features
from vlp.train.preemption import exit_status
from vlp.world import write_caption_mix

PRESET = "configs/pretrain/shapes_tiny.yaml"
ITC_ONLY = ["loss.itm=0", "loss.mlm=0", "eval.score=itc", "train.progress=false", "data.num_workers=1"]
KINDS = ("object", "count")

# arm -> (similarity source: None | "oracle" | "helper", overrides); delta comes from the source's diagnosis
SRCL = ["loss.regulation=srcl", "loss.srcl.norm=softmax", "loss.srcl.alpha_h_end=1.0"]
ARMS: dict[str, tuple[str | None, list[str]]] = {
    "plain ITC": (None, ["loss.regulation=none"]),
    "oracle SRCL": ("oracle", SRCL),
    "oracle removal": ("oracle", ["loss.regulation=removal", "loss.srcl.alpha_h_end=1.0", "loss.srcl.threshold=0.5"]),
    "helper SRCL softmax": ("helper", SRCL),
    "helper SRCL mean": ("helper", ["loss.regulation=srcl", "loss.srcl.norm=mean", "loss.srcl.alpha_h_end=1.0"]),
}
MAIN = list(ARMS)
KEY_ARMS = ("plain ITC", "oracle SRCL", "helper SRCL softmax")
ABLATIONS = {
    **{f"{a}, queue 1024": (ARMS[a][0], [*ARMS[a][1], "model.queue_size=1024"]) for a in KEY_ARMS},
    **{f"{a}, distillation on": (ARMS[a][0], [*ARMS[a][1], "loss.distill=true"]) for a in KEY_ARMS},
    "oracle SRCL, distillation on, weighted targets": (
        "oracle",
        [*SRCL, "loss.distill=true", "loss.srcl.weight_targets=true"],
    ),
    "oracle SRCL graded": ("graded", SRCL),
    "helper SRCL softmax, alpha_h 1 -> 0": ("helper", [*SRCL[:2], "loss.srcl.alpha_h_end=0.0"]),
}
THRESHOLDS = (0.1, 0.2, 0.3, 0.5, 0.7)
REMOVAL = {
    f"helper removal {t:g}": (
        "helper",
        ["loss.regulation=removal", "loss.srcl.alpha_h_end=1.0", f"loss.srcl.threshold={t}"],
    )
    for t in THRESHOLDS
}
AUCS = (0.75, 0.85, 0.95)
DOSE = {
    "plain ITC": ARMS["plain ITC"],
    **{f"oracle AUC {q:g} SRCL": (f"noisy {q:g}", SRCL) for q in AUCS},
    "oracle SRCL": ARMS["oracle SRCL"],
    "oracle SRCL, delta 1": ("oracle", [*SRCL, "loss.srcl.delta=1.0"]),  # after the calibrated delta: wins
}
PRIMARY = ("img_r_precision", "img_ndcg10")  # the pre-stated primary endpoints (docs/experiments.md)
GRIDS = {
    "main": (MAIN, (0, 1, 2, 3, 4)),
    "dose": (list(DOSE), (0, 1, 2, 3, 4)),
    "ablations": (list(ABLATIONS), (0, 1, 2)),
    "removal": (list(REMOVAL), (0, 1, 2)),
}
METRICS = (
    "img_r_precision img_ndcg10 img_r_precision@generic img_ndcg10@generic img_r_precision@scene "
    "img_r1 img_r5_rel txt_r1 txt_r_precision"
).split()


def _delta_cell(delta: float | None) -> str:
    """A delta for a report table (``unreachable`` when the search found none)."""
    return "unreachable" if delta is None else f"{delta:.3g}"


def baseline_of(name: str) -> str:
    """The plain-ITC arm an arm is compared with: the one with the same queue / distillation suffix."""
    for suffix in (", queue 1024", ", distillation on"):
        if suffix in name:
            return "plain ITC" + suffix
    return "plain ITC"


def arm(name: str) -> tuple[str | None, list[str]]:
    return {**ARMS, **ABLATIONS, **REMOVAL, **DOSE}[name]


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    """The command line (the harness's options and the testbed's)."""
    p = experiment_parser(__doc__, out="runs/srcl_testbed", steps=300)
    p.set_defaults(seeds=None)
    p.add_argument("--grid", choices=list(GRIDS), default="main")
    p.add_argument("--helper-images", type=int, default=2000, help="disjoint images the helper trains on")
    p.add_argument("--helper-steps", type=int, default=600)
    p.add_argument("--warmup-steps", type=int, default=200, help="plain in-batch ITC steps before every arm")
    p.add_argument(
        "--queue", type=int, default=0, help="ITC queue of the arms (after the warm-up); an arm may override it"
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--target-weight",
        type=float,
        help="median false-negative weight delta aims at (default 0.15; the dose grid: 0.12, the paper's example)",
    )
    p.add_argument("--diag-batches", type=int, default=20)
    return p.parse_args(argv)


def train_helper(a: argparse.Namespace, out: Path, root: Path, base: list[str]) -> tuple[Path, dict[str, Any]]:
    """The learned helper (disjoint images, every caption kind), trained and evaluated once -> (its run
    folder, its own zero-shot retrieval metrics on the test split). Its seed is :func:`helper_seed` of
    0; the recorded grids (2026-11) trained it with the config's default seed, 42, also no student's."""
    helper_dir = train_once(
        out / "helper",
        "configs/helper/shapes_tiny.yaml",
        root / "helper_split.json",
        a.helper_steps,
        [*base, f"train.seed={helper_seed(0)}"],
        helper=True,
    )
    helper_eval = out / "helper" / "eval" / "metrics.json"
    if not helper_eval.exists():
        run_evaluate_retrieval(
            helper_dir,
            root / "retrieval_test.json",
            root / "relevance_test.json",
            helper_dir / "eval",
            overrides=["eval.score=itc"],
            graded_relevance=root / "relevance_graded_test.npy",
            show_progress=False,
        )
    return helper_dir, json.loads(helper_eval.read_text())


def cache_sources(grid: str, out: Path, root: Path, mix: Path, helper_dir: Path) -> dict[str, Path]:
    """The similarity sources' feature caches of the mix, each written once -> {source: cache folder}:
    the learned helper, the exact and graded oracles and (the dose grid) the noisy oracles."""
    caches = {"helper": out / "cache_helper", "oracle": out / "cache_oracle", "graded": out / "cache_oracle_graded"}
    if grid == "dose":
        caches |= {f"noisy {q:g}": out / f"cache_oracle_auc{q:g}" for q in AUCS}
        for q in AUCS:
            if not caches[f"noisy {q:g}"].exists():
                run_cache_oracle_features(root, [mix], caches[f"noisy {q:g}"], auc=q, seed=0)
    if not caches["helper"].exists():
        run_cache_helper_features(helper_dir, [str(mix)], caches["helper"])
    if not caches["oracle"].exists():
        run_cache_oracle_features(root, [mix], caches["oracle"])
    if not caches["graded"].exists():
        run_cache_oracle_features(root, [mix], caches["graded"], graded=True)
    return caches


@dataclass
class Testbed:
    """The prepared world, mix and similarity caches, and what every arm's run is built from."""

    a: argparse.Namespace
    out: Path
    target: float  # the median false-negative weight delta aims at
    root: Path
    mix: Path  # the diagnostic pretraining file (object and count captions)
    base: list[str]  # every run's overrides
    caches: dict[str, Path]

    def diagnose(self, source: str, queue: int) -> dict:
        """The similarity source's diagnostics with a queue of ``queue`` (computed once)."""
        suffix = "" if self.target == 0.15 else f"_t{self.target:g}"
        f = self.out / f"diagnostics_{slug(source)}_q{queue}{suffix}" / "helper_diagnostics.json"
        if not f.exists():
            run_helper_diagnostics(
                self.caches[source],
                self.root,
                self.mix,
                f.parent,
                batch_size=self.a.batch_size,
                queue_size=queue,
                batches=self.a.diag_batches,
                target_weight=self.target,
            )
        return json.loads(f.read_text())

    def queue_of(self, name: str) -> int:
        """The arm's ITC queue: its own ``model.queue_size`` override, else ``--queue``."""
        sizes = [int(o.split("=")[1]) for o in arm(name)[1] if o.startswith("model.queue_size=")]
        return sizes[-1] if sizes else self.a.queue

    def overrides(self, name: str, seed: int) -> list[str]:
        """The arm's run from this seed's warm-up (trained once), with its source's cache and delta."""
        a = self.a
        source, extra = arm(name)
        warm = train_once(
            self.out / f"warmup_seed{seed}",
            PRESET,
            self.mix,
            a.warmup_steps,
            [*self.base, "model.queue_size=0", f"train.seed={seed}"],
        )
        if source is None:
            src = []
        else:
            d = self.diagnose(source, self.queue_of(name))
            delta = d["delta"]["target_weight"]
            if delta is None:
                raise RuntimeError(f"{name}: no delta reaches the target weight for {source}: {d.get('delta_error')}")
            src = [f"loss.srcl.helper_features={self.caches[source]}", f"loss.srcl.delta={delta}"]
        return [*self.base, f"init_from={warm}", f"model.queue_size={a.queue}", "loss.distill=false", *src, *extra]


def prepare(a: argparse.Namespace, out: Path, target: float) -> tuple[Testbed, dict[str, Any], dict[str, dict]]:
    """World, mix, helper, caches and the diagnostics at ``--queue`` (under the prepare lock) -> (the
    testbed, the helper's own retrieval metrics, {source: diagnostics})."""
    with file_lock(prepare_lock(out)):  # shards (--shard) prepare one at a time
        root = prepare_world(out, a.images, a.test_images, n_helper=a.helper_images)
        mix = root / f"pretrain_kinds_{'+'.join(KINDS)}.json"
        if not mix.exists():
            write_caption_mix(root, KINDS, seed=0)
        base = [f"data.batch_size={a.batch_size}", *ITC_ONLY]
        # the learned helper: disjoint images, every caption kind; its own retrieval; its cache of the mix
        helper_dir, helper_retrieval = train_helper(a, out, root, base)
        caches = cache_sources(a.grid, out, root, mix, helper_dir)
        tb = Testbed(a, out, target, root, mix, base, caches)
        diag = {s: tb.diagnose(s, a.queue) for s in caches}
    return tb, helper_retrieval, diag


def run_grid(tb: Testbed, names: list[str], seeds: list[int], t0: float) -> SeedResults:
    """Train and evaluate the grid's arms for every seed of this shard (done runs skipped) -> the results."""
    a, out = tb.a, tb.out
    results = SeedResults(out / f"results_{a.grid}.json")
    Sweep(
        results,
        tb.root,
        PRESET,
        tb.mix,
        a.steps,
        run_dir=lambda name, seed: out / a.grid / f"{slug(name)}_seed{seed}",
        overrides=tb.overrides,
        summary=lambda m: (
            f"t2i R-prec {m['img_r_precision']:.2f} (generic {m['img_r_precision@generic']:.2f}) "
            f"nDCG@10 {m['img_ndcg10']:.2f}"
        ),
        name_width=36,
        graded=True,
        caption_groups=True,
        timed=True,
        t0=t0,
    ).run(seeds, names, shard=a.shard)
    return results


def setup_lines(
    a: argparse.Namespace, results: SeedResults, helper_retrieval: dict[str, Any], diag: dict[str, dict]
) -> list[str]:
    """The report's opening: the setup, the helper's own retrieval and each similarity source's diagnosis."""
    lines = [
        f"Shapes world: {a.images} training images captioned by {' and '.join(KINDS)} captions only; helper trained "
        f"{a.helper_steps} steps on {a.helper_images} disjoint images with every caption kind. Per seed: "
        f"{a.warmup_steps} warm-up steps of plain in-batch ITC, then {a.steps} steps per arm with a queue of {a.queue} "
        f"(unless the arm says otherwise), batch {a.batch_size}, ITC only, distillation off (unless the arm says "
        f"otherwise); {run_minutes(results)} on this machine. Zero-shot retrieval on the {a.test_images}-image "
        "test split with ITC scores; `@generic` / `@scene`: the text->image metrics over those query captions only.",
        "",
        f"Learned helper's own zero-shot retrieval (test split): img_r1 {helper_retrieval['img_r1']:.2f}, "
        f"img_r_precision {helper_retrieval['img_r_precision']:.2f}, txt_r1 {helper_retrieval['txt_r1']:.2f}.",
        "",
        "| similarity source | AUC (FN vs TN) | FN share (batch / +queue) | delta, 20% rule | delta, target | "
        "FN median weight | TN median weight |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s, d in diag.items():
        share, t = d["false_negative_share"], d["weights"].get("target_weight")
        target_cells = (
            f"{t['delta']:.3f} | {t['false_negatives']['median']:.3f} | {t['true_negatives']['median']:.3f}"
            if t
            else "unreachable | - | -"
        )
        lines.append(
            f"| {s} | {d['helper_auc']['with_queue']:.3f} | {100 * share['in_batch']:.1f}% / {100 * share['with_queue']:.1f}% | "
            f"{_delta_cell(d['delta']['rule_20pct'])} | {target_cells} |"
        )
    return lines


def plot_removal(out: Path, results: SeedResults, seeds: list[int]) -> None:
    """The removal grid's sweep by threshold, with the main grid's arms dotted (``OUT/removal_sweep.png``)."""
    main = SeedResults(out / "results_main.json")
    plot_sweep(
        results,
        seeds,
        {f"helper removal {t:g}": t for t in THRESHOLDS},
        ["img_r_precision", "img_ndcg10", "img_r_precision@generic"],
        out / "removal_sweep.png",
        "learned-helper removal (ALBEF++) by threshold; dotted: the main grid's arms",
        "removal threshold",
        summarise({k: v for k, v in main.data.items() if k in ("plain ITC", "oracle removal")}, seeds, METRICS),
    )


def dose_response(
    out: Path, results: SeedResults, seeds: list[int], names: list[str], diag: dict[str, dict], target: float
) -> str:
    """The dose grid's plot by measured helper AUC (``OUT/dose_response.png``) -> its report section:
    each arm against plain ITC with paired t-tests on the primary endpoints."""
    measured = {f"oracle AUC {q:g} SRCL": diag[f"noisy {q:g}"]["helper_auc"]["with_queue"] for q in AUCS}
    plot_sweep(
        results,
        seeds,
        {**measured, "oracle SRCL": diag["oracle"]["helper_auc"]["with_queue"]},
        [*PRIMARY, "img_r_precision@generic"],
        out / "dose_response.png",
        f"SRCL by helper quality (delta: median false-negative weight {target:g}); dotted: plain ITC, delta 1",
        "helper ROC-AUC (false vs true negatives, measured)",
        summarise(
            {k: v for k, v in results.data.items() if k in ("plain ITC", "oracle SRCL, delta 1")}, seeds, METRICS
        ),
    )
    return (
        "Each arm minus plain ITC on the primary endpoints, seed by seed, with a paired t-test "
        f"(two-sided, n - 1 dof); {len(DOSE) - 1} arms x {len(PRIMARY)} endpoints = "
        f"{(len(DOSE) - 1) * len(PRIMARY)} tests: Holm-Bonferroni at a family-wise 0.05 needs p < "
        f"{0.05 / ((len(DOSE) - 1) * len(PRIMARY)):.3g} for the smallest p:\n\n"
        + paired_tests_table(results.data, seeds, PRIMARY, "plain ITC", names)
    )


def main(argv=None) -> int:
    a = parse_args(argv)
    names, default_seeds = GRIDS[a.grid]
    target = a.target_weight if a.target_weight is not None else 0.12 if a.grid == "dose" else 0.15
    seeds = a.seeds or list(default_seeds)
    out = Path(a.out)
    t0 = time.time()
    tb, helper_retrieval, diag = prepare(a, out, target)
    results = run_grid(tb, names, seeds, t0)
    if a.shard != (0, 1):
        print(f"shard {a.shard[0]}/{a.shard[1]} done; run again without --shard for the report", flush=True)
        return 0

    auc = {None: "-", **{s: f"{d['helper_auc']['with_queue']:.3f}" for s, d in diag.items()}}
    lines = setup_lines(a, results, helper_retrieval, diag)
    table = results_table(results, seeds, METRICS, label=lambda name: f"{name} (AUC {auc[arm(name)[0]]})")
    if a.grid == "removal":
        plot_removal(out, results, seeds)
    tests = dose_response(out, results, seeds, names, diag, target) if a.grid == "dose" else ""
    both = {**SeedResults(out / "results_main.json").data, **results.data}
    paired = paired_table(both, seeds, METRICS, baseline_of, variants=names)
    write_report(
        out / f"report_{a.grid}.md",
        "\n".join(lines),
        table,
        "Differences from the matching plain-ITC arm, seed by seed (same warm-up and data order):" if paired else "",
        paired,
        tests,
    )
    return 0


if __name__ == "__main__":
    sys.exit(exit_status(main, "srcl_testbed.py"))
