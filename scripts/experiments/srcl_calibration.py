"""Does `vlp analyze helper` pick a good delta? SRCL at the delta calibrated without ground truth, by helper quality.

    python scripts/experiments/srcl_calibration.py --out runs/srcl_calibration                # primary, 12 seeds
    python scripts/experiments/srcl_calibration.py --out runs/srcl_calibration --grid sweep   # delta sweep, 3 seeds
    python scripts/experiments/srcl_calibration.py --out runs/srcl_calibration --status       # what is done / running

The SRCL testbed's world and training (``srcl_testbed.py``: 4,000 training images captioned by
object and count captions only, so that about 17% of the in-batch negatives are false negatives;
per seed a 200-step warm-up of plain in-batch ITC, then 300 steps per arm, batch 64, ITC only,
distillation off, ``alpha_h = 1`` all run). Helpers of graded quality, **each drawn anew per
seed**: the exact oracle corrupted by per-pair noise to ROC-AUC 0.65, 0.75, 0.85 and 0.95 (noise
seed ``100 + seed``), and a learned helper (the tiny architecture, plain InfoNCE, 600 steps on the
disjoint helper split). For every (helper, seed):

- ``vlp analyze helper`` as a user runs it, without ground truth (:func:`run_helper_calibration`,
  same-image captions as the known false negatives, target median weight 0.12, ``force=True``: this
  experiment is what sets the quality threshold, so no helper is refused here): the same-image AUC
  and the **no-GT delta**;
- the ground-truth report (:func:`run_helper_diagnostics`): the helper's ROC-AUC at telling true
  false negatives from true negatives and the **GT delta** (the delta that gives the true false
  negatives a median weight of 0.12).

``primary``: plain ITC and SRCL at the no-GT delta for each helper, 12 seeds, paired by seed (same
warm-up, data order and steps). ``sweep``: for the AUC-0.65 and AUC-0.85 oracles and the learned
helper, SRCL at 1/4, 1/2, 2 and 4 times the seed's no-GT delta (the factor 1 is the primary arm),
3 seeds. The pre-registered reading is in docs/experiments.md ("Does the calibration pick a good
delta?"). Everything is skipped when its output exists, so an interrupted run resumes; ``--shard
I/2`` splits the work between two processes (preparation by seed parity, then every other run).
The recorded runs (2026-11-28) predate two fixes of issue 51, so a rerun draws other helpers: the
learned helper was trained with ``train.seed = seed``, the student's seed (the two started from
identical weights; now :func:`harness.helper_seed`), and the four oracle levels of a seed scaled one
noise draw (now one draw per seed and level, :func:`vlp.lab.oracle.noise_seed`).

``--record DIR`` keeps the results and calibration reports in DIR as they are written (the
repository's ``results/srcl_calibration``, committed as the work goes on), and copies them back at
start, so that a run on a new machine goes on from what an earlier one finished.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Optional

from harness import (
    Sweep,
    experiment_parser,
    helper_seed,
    pin_design,
    prepare_lock,
    prepare_world,
    train_once,
)
from seed_results import SeedResults, slug
from srcl_calibration_design import (  # noqa: F401 (the design, shared with the report; the tests read it from here)
    AUCS,
    ENDPOINT,
    FACTORS,
    GRIDS,
    HELPERS,
    METRICS,
    PLAIN,
    PRIMARY_ARMS,
    SWEEP_ARMS,
    SWEPT,
    helper_of,
)
from srcl_calibration_report import write_calibration_report
from srcl_testbed import ITC_ONLY, KINDS, PRESET, SRCL  # the SRCL testbed's world, training and regulated arms

from vlp.errors import CalibrationError
from vlp.lab.calibration import run_helper_calibration
from vlp.lab.diagnostics import run_helper_diagnostics
from vlp.lab.oracle import run_cache_oracle_features
from vlp.locks import file_lock
from vlp.runs.training.features import run_cache_helper_features
from vlp.train.preemption import exit_status
from vlp.world import write_caption_mix

TARGET = 0.12
DIAG_BATCHES = 20
#: the settings every recorded run shares (:func:`harness.pin_design`; results/srcl_calibration/design.json)
DESIGN_KEYS = ("images", "test_images", "steps", "warmup_steps", "batch_size", "helper_images", "helper_steps")


class Experiment:
    """The shared and per-seed preparation of the experiment in ``out`` (world, warm-ups, helpers,
    caches, both calibrations), each piece built once under its own lock and skipped when present."""

    def __init__(self, out: Path, a: Any) -> None:
        self.out, self.a = out, a
        with file_lock(prepare_lock(out)):
            self.root = prepare_world(out, a.images, a.test_images, n_helper=a.helper_images)
            self.mix = self.root / f"pretrain_kinds_{'+'.join(KINDS)}.json"
            if not self.mix.exists():
                write_caption_mix(self.root, KINDS, seed=0)
        self.base = [f"data.batch_size={a.batch_size}", *ITC_ONLY]

    def _locked(self, name: str) -> Any:
        return file_lock(self.out / f".lock_{name}")

    def warmup(self, seed: int) -> Path:
        with self._locked(f"warmup{seed}"):
            return train_once(
                self.out / f"warmup_seed{seed}",
                PRESET,
                self.mix,
                self.a.warmup_steps,
                [*self.base, "model.queue_size=0", f"train.seed={seed}"],
            )

    def cache(self, helper: str, seed: int) -> Path:
        """The helper-feature cache of ``helper`` for ``seed`` (trains the learned helper first)."""
        path = self.out / "caches" / f"{slug(helper)}_seed{seed}"
        with self._locked(f"{slug(helper)}{seed}"):
            if path.exists():
                return path
            auc = HELPERS[helper]
            if auc is None:
                run = train_once(
                    self.out / f"helper_seed{seed}",
                    "configs/helper/shapes_tiny.yaml",
                    self.root / "helper_split.json",
                    self.a.helper_steps,
                    [*self.base, f"train.seed={helper_seed(seed)}"],
                    helper=True,
                )
                run_cache_helper_features(run, [str(self.mix)], path, show_progress=False)
            else:
                run_cache_oracle_features(self.root, [self.mix], path, auc=auc, seed=100 + seed)
        return path

    def nogt_options(self, helper: str, seed: int) -> dict[str, Any]:
        """Further options of the no-GT calibration of ``helper`` for ``seed`` (none here)."""
        return {}

    def calibration(self, helper: str, seed: int) -> dict[str, Any]:
        """The no-GT and the ground-truth reports of ``helper`` for ``seed`` (batch 64, no queue); the
        helper's cache is built only where a report is missing (a run builds it when it needs it)."""
        name = f"{slug(helper)}_seed{seed}"
        nogt, gt = self.out / "calibration" / name, self.out / "ground_truth" / name
        common = dict(batch_size=self.a.batch_size, queue_size=0, batches=DIAG_BATCHES, target_weight=TARGET)
        with self._locked(f"calib_{name}"):
            if not (nogt / "helper_diagnostics.json").exists():
                try:
                    extra = self.nogt_options(helper, seed)
                    run_helper_calibration(self.cache(helper, seed), [self.mix], nogt, force=True, **common, **extra)
                except CalibrationError as e:  # no delta for this helper: recorded in its report's "refused"
                    print(f"{name}: the no-GT calibration refuses: {e}", flush=True)
            if not (gt / "helper_diagnostics.json").exists():
                run_helper_diagnostics(self.cache(helper, seed), self.root, self.mix, gt, **common)
            record(self.out, self.a.record, [nogt / "helper_diagnostics.json", gt / "helper_diagnostics.json"])
        r = json.loads((nogt / "helper_diagnostics.json").read_text())
        g = json.loads((gt / "helper_diagnostics.json").read_text())
        return {
            "same_image_auc": r["quality"]["same_image_auc"],
            "gt_auc": g["helper_auc"]["with_queue"],
            "delta_nogt": r["delta"]["target_weight"],
            "delta_gt": g["delta"]["target_weight"],
            "n_eff": r.get("at_delta", {}).get("n_eff_mean"),
            "negatives_per_row": r.get("at_delta", {}).get("negatives_per_row"),
            "below_0_2": r["weights"].get("target_weight", {}).get("all_negatives", {}).get("below_0_2"),
            "refused": r.get("refused"),
            "cache": str(self.out / "caches" / name),
        }

    def sweep(self, cls: type, results: SeedResults, folder: str, summary: Any, width: int, t0: float) -> Any:
        """A ``cls`` (:class:`MarkedSweep` or a subclass) of this experiment's arms: each run in
        ``out/folder/<arm>_seed<S>``, with the world's graded relevance and caption groups, timed;
        an arm without a delta recorded as such; results kept in ``--record``."""
        sweep = cls(
            results,
            self.root,
            PRESET,
            self.mix,
            self.a.steps,
            run_dir=lambda name, seed: self.out / folder / f"{slug(name)}_seed{seed}",
            overrides=self.overrides,
            summary=summary,
            name_width=width,
            graded=True,
            caption_groups=True,
            timed=True,
            t0=t0,
        )
        sweep.has_delta, sweep.record_to = self.has_delta, self.a.record
        return sweep

    def prepare(self, seeds: list[int], shard: tuple[int, int]) -> None:
        """Every seed's calibrations (and the caches they need): this shard's seeds (by parity) first.
        Warm-ups are trained by the first run that starts from them."""
        i, n = shard
        for seed in [s for s in seeds if s % n == i] + [s for s in seeds if s % n != i]:
            for helper in HELPERS:
                self.calibration(helper, seed)

    def has_delta(self, arm: str, seed: int) -> bool:
        helper = helper_of(arm)[0]
        return helper is None or self.calibration(helper, seed)["delta_nogt"] is not None

    def overrides(self, arm: str, seed: int) -> list[str]:
        helper, factor = helper_of(arm)
        warm = self.warmup(seed)
        src: list[str] = ["loss.regulation=none"]
        if helper is not None:
            c = self.calibration(helper, seed)
            if c["delta_nogt"] is None:
                raise RuntimeError(f"{arm} seed {seed}: the no-GT calibration found no delta")
            cache = self.cache(helper, seed)
            src = [*SRCL, f"loss.srcl.helper_features={cache}", f"loss.srcl.delta={factor * c['delta_nogt']}"]
        return [*self.base, f"init_from={warm}", "model.queue_size=0", "loss.distill=false", *src]


class MarkedSweep(Sweep):
    """A :class:`Sweep` that leaves ``running_<pid>.txt`` (the run it is on) for ``--status``."""

    #: (arm, seed) -> whether the arm has a delta to train at (False: recorded as ``no_delta``, not trained)
    has_delta: Any = None
    #: the --record folder (None: nothing copied)
    record_to: Optional[Path] = None

    def _run_one(self, name: str, seed: int) -> None:
        if self.has_delta is not None and not self.has_delta(name, seed):
            self.results.add(name, seed, {"no_delta": 1.0})
            print(f"{name} seed {seed}: the no-GT calibration found no delta; recorded, not trained", flush=True)
            return
        mark = self.results.path.parent / f"running_{os.getpid()}.txt"
        mark.write_text(f"{name} seed {seed} since {time.strftime('%H:%M:%S')}\n")
        try:
            super()._run_one(name, seed)
        finally:
            mark.unlink(missing_ok=True)
        record(self.results.path.parent, self.record_to, [self.results.path])


def record(out: Path, to: Optional[Path], files: list[Path]) -> None:
    """Copy ``files`` (under ``out``) to the same places under ``to``, written whole then renamed."""
    if to is None:
        return
    for f in files:
        if f.exists():
            dst = to / f.relative_to(out)
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_suffix(".tmp")
            shutil.copyfile(f, tmp)
            tmp.replace(dst)


def restore(out: Path, kept: Optional[Path]) -> None:
    """The files :func:`record` kept, copied back into ``out`` where ``out`` has none: a run on a new
    machine skips what an earlier machine finished (results JSONs are merged by their own reader)."""
    if kept is None or not kept.exists():
        return
    for f in kept.rglob("*.json"):
        dst = out / f.relative_to(kept)
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dst)


def status(out: Path) -> str:
    """One line per grid (runs done of all), per live process (the run it is on) and per run a gone
    process left unfinished that no live process has taken up since (a restart reruns it)."""
    lines, done = [], []
    for grid, (arms, seeds) in GRIDS.items():
        r = SeedResults(out / f"results_{grid}.json")
        done.append(r)
        missing = [f"{a} s{s}" for s in seeds for a in arms if not r.has(a, s)]
        lines.append(f"{grid}: {len(arms) * len(seeds) - len(missing)}/{len(arms) * len(seeds)} runs done")
    prepared = len(list((out / "ground_truth").glob("*/helper_diagnostics.json")))
    lines.append(f"calibrations: {prepared}/{len(HELPERS) * 12} (helper, seed) pairs")
    live, gone = [], []
    for mark in sorted(out.glob("running_*.txt")):
        pid, text = int(mark.stem.split("_")[1]), mark.read_text().strip()
        (live if Path(f"/proc/{pid}").exists() else gone).append((pid, text))
    running = {text.split(" since ")[0] for _, text in live}
    lines += [f"pid {pid}: {text}" for pid, text in live]
    for pid, text in gone:
        name, _, seed = text.split(" since ")[0].rpartition(" seed ")
        if f"{name} seed {seed}" not in running and not any(r.has(name, int(seed)) for r in done):
            lines.append(f"pid {pid}: {text} (process gone: rerun to resume)")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = experiment_parser(__doc__, out="runs/srcl_calibration", steps=300)
    p.set_defaults(seeds=None)
    p.add_argument("--grid", choices=list(GRIDS), default="primary")
    p.add_argument("--helper-images", type=int, default=2000)
    p.add_argument("--helper-steps", type=int, default=600)
    p.add_argument("--warmup-steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--status", action="store_true", help="print what is done and what is running, then exit")
    p.add_argument(
        "--report",
        action="store_true",
        help="write the grid's report from the runs recorded so far (missing ones shown as missing), run nothing",
    )
    p.add_argument(
        "--record",
        type=Path,
        default=None,
        help="a folder (in the repository) that keeps the small files a lost machine would lose: results and "
        "calibration reports are copied there as they are written, and back into --out at start",
    )
    a = p.parse_args(argv)
    out = Path(a.out)
    if a.status:
        print(status(out))
        return 0
    arms, default_seeds = GRIDS[a.grid]
    seeds = list(a.seeds or default_seeds)
    t0 = time.time()
    if not a.report:
        pin_design(a.record, {k: getattr(a, k) for k in DESIGN_KEYS})
    restore(out, a.record)
    exp = Experiment(out, a)
    if a.report:
        write_calibration_report(exp, a.grid, seeds)
        return 0
    exp.prepare(seeds, a.shard)
    results = SeedResults(out / f"results_{a.grid}.json")
    summary = lambda m: f"t2i R-prec {m['img_r_precision']:.2f} nDCG@10 {m['img_ndcg10']:.2f}"  # noqa: E731
    sweep = exp.sweep(MarkedSweep, results, a.grid, summary, 40, t0)
    sweep.run(seeds, arms, shard=a.shard)
    if a.shard != (0, 1):
        print(f"shard {a.shard[0]}/{a.shard[1]} done; run again without --shard for the report", flush=True)
        return 0
    write_calibration_report(exp, a.grid, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(exit_status(main, "srcl_calibration.py"))
