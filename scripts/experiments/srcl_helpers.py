"""Does SRCL help with a learned helper stronger than the student, and what tells a user beforehand?

    python scripts/experiments/srcl_helpers.py --pilot                  # the strongest grade of seed 0 first
    OMP_NUM_THREADS=2 python scripts/experiments/srcl_helpers.py --hours 2.7   # a session: only what ends in time
    python scripts/experiments/srcl_helpers.py --shard 0/2 & python scripts/experiments/srcl_helpers.py --shard 1/2
    python scripts/experiments/srcl_helpers.py --status                 # what is done / running
    python scripts/experiments/srcl_helpers.py --report                 # the report from what is recorded

The SRCL testbed's student and training (``srcl_calibration.py``: 4,000 training images with object
and count captions only, about 17% false negatives in a batch; per seed one 200-step plain-ITC
warm-up, then 300 steps per arm, batch 64, in-batch negatives, ITC only, distillation off), and
**learned helpers graded by strength**: the tiny architecture trained with plain InfoNCE on 1, 4, 16
and 64 times as many images as the student sees (4,000, 16,000, 64,000, 256,000), every caption
kind, from a pool disjoint from the student's training and test images (the world's ``helper``
split, written in a folder of its own, ``OUT/helper_pool``), with compute growing with data
(``--helper-base-steps`` x sqrt(grade) steps). Per seed each grade's images are the first of one
permutation of the pool (nested), and each helper has its own seed (:func:`harness.helper_seed`:
never the student's, nor another grade's). Every helper is evaluated on the student's test split
(its own text->image R-precision) and frozen.

Arms per seed, all from that seed's one warm-up (docs/experiments.md, "Does SRCL help with a learned
helper stronger than the student?", holds the pre-registered design, endpoint, rule and power):
plain ITC; SRCL at each grade's no-GT delta with ``alpha_h`` fixed at 1 ("alone"); the same with the
paper's annealing of ``alpha_h`` from 1 to 0 over the run ("annealed", vlp's default); and the
oracle noised to ROC-AUC 0.75 at its no-GT delta, alpha_h 1 (the positive control).

For every (helper, seed) the script records, from the helper's features on the student's training
data: the no-GT calibration with the measures against the student (the warm-up checkpoint; ``vlp
analyze helper --student``), and the world's ground-truth AUC and GT delta.

Every process works through the seeds in the order of ``SEEDS`` (the 12 of the interim look first);
with ``--shard I/2`` each takes its half of a seed's work (:func:`shard_arms`: the x64 and x1 helpers
and their arms; the x16 and x4 helpers and theirs, plain ITC and the control), training a grade's
helper just before its arms; everything is skipped when its output exists, so a killed run resumes, and a lost
helper is trained again from its seeds (one thread: bit-identical). Without ``--shard`` a process runs a
seed's jobs largest first, and with ``--hours H`` starts an arm only if it is expected to finish within H
hours (:class:`harness.Budget`), so a session's end goes to the smaller jobs. ``--record DIR`` keeps the
small files a lost machine would lose (results, helpers' own evaluations, calibrations) in DIR
(``results/srcl_helpers``) and copies them back at start.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
from harness import Budget, experiment_parser, helper_seed, pin_design, seconds_per_step, steps_done, train_once
from seed_results import SeedResults, slug
from srcl_calibration import Experiment, MarkedSweep, record, restore
from srcl_helpers_design import (
    ARM_OVERHEAD_MINUTES,
    ARMS,
    CONTROL_AUC,
    ENDPOINT,
    GRADES,
    HELPER_CKPT_EVERY,
    PLAIN,
    SEEDS,
    arm_grade,
    grade_of,
    helper_steps,
    shard_arms,
)
from srcl_helpers_report import status, write_helpers_report

from vlp.lab.helper_student import cache_student
from vlp.lab.oracle import run_cache_oracle_features
from vlp.locks import file_lock
from vlp.runs.evaluation.image_text_retrieval import run_evaluate_retrieval
from vlp.runs.training.features import run_cache_helper_features
from vlp.train.preemption import exit_status
from vlp.world import generate_world


def pool_subset(pool: list[dict[str, Any]], seed: int, grade: int, student_images: int) -> list[dict[str, Any]]:
    """The ``grade`` x ``student_images`` images of ``seed``'s helper: the first of a permutation of the
    pool drawn from ``seed`` (so grades are nested per seed and seeds draw different images)."""
    n = grade * student_images
    if n > len(pool):
        raise ValueError(f"grade {grade} needs {n} pool images, the pool has {len(pool)}")
    order = np.random.default_rng([seed, 51]).permutation(len(pool))
    return [pool[i] for i in order[:n]]


class HelperExperiment(Experiment):
    """The preparation of :class:`srcl_calibration.Experiment` (world, warm-ups, calibrations) with the
    graded learned helpers and the oracle control as its helpers, the measures against the student
    in the no-GT calibration, and arms that differ in ``alpha_h``'s schedule."""

    def __init__(self, out: Path, a: Any) -> None:
        super().__init__(out, a)
        self.base.append(f"train.precision={a.precision}")
        self.pool = out / "helper_pool"
        with file_lock(self.out / ".lock_pool"):
            if not (self.pool / "helper_split.json").exists():
                generate_world(
                    self.pool, seed=0, n_train=64, n_val=8, n_test=8, n_helper=GRADES[-1] * a.images, progress=False
                )

    def helper_data(self, seed: int, grade: int) -> Path:
        """The annotation file of ``seed``'s helper of ``grade`` (in the pool's folder, for its image paths)."""
        path = self.pool / f"subset_seed{seed}_x{grade}.json"
        with self._locked(f"subset{seed}_{grade}"):
            if not path.exists():
                pool = json.loads((self.pool / "helper_split.json").read_text())
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(pool_subset(pool, seed, grade, self.a.images)))
                tmp.replace(path)
        return path

    def helper_dir(self, seed: int, grade: int) -> Path:
        """The run folder of ``seed``'s helper of ``grade``."""
        return self.out / "helpers" / f"x{grade}_steps{helper_steps(grade, self.a.helper_base_steps)}_seed{seed}"

    def helper_run(self, seed: int, grade: int) -> Path:
        """``seed``'s helper of ``grade``, trained (or resumed), its own retrieval evaluated and recorded."""
        steps = helper_steps(grade, self.a.helper_base_steps)
        run = self.helper_dir(seed, grade)
        with self._locked(f"helper{seed}_{grade}_{steps}"):  # the lock of the run folder
            train_once(
                run,
                "configs/helper/shapes_tiny.yaml",
                self.helper_data(seed, grade),
                steps,
                [
                    *self.base,
                    f"train.seed={helper_seed(seed, GRADES.index(grade))}",
                    f"train.ckpt_every={HELPER_CKPT_EVERY}",
                    "train.keep_last=2",
                ],
                helper=True,
            )
            own = run / "eval" / "metrics.json"
            if not own.exists():
                run_evaluate_retrieval(
                    run,
                    self.root / "retrieval_test.json",
                    self.root / "relevance_test.json",
                    run / "eval",
                    show_progress=False,
                )
            record(self.out, self.a.record, [own])
        return run

    def cache(self, helper: str, seed: int) -> Path:
        path = self.out / "caches" / f"{slug(helper)}_seed{seed}"
        grade = grade_of(helper)
        if grade is not None:
            run = self.helper_run(seed, grade)  # outside the cache's lock: it has its own
        with self._locked(f"{slug(helper)}{seed}"):
            if not path.exists():
                if grade is None:
                    run_cache_oracle_features(self.root, [self.mix], path, auc=CONTROL_AUC, seed=100 + seed)
                else:
                    run_cache_helper_features(run, [str(self.mix)], path, show_progress=False)
        return path

    def student_cache(self, seed: int) -> Path:
        """The student's features (its warm-up checkpoint) on its training data, for the measures."""
        warm = self.warmup(seed)
        with self._locked(f"student{seed}"):
            return cache_student(warm, [self.mix], self.out / "caches" / f"student_seed{seed}")

    def nogt_options(self, helper: str, seed: int) -> dict[str, Any]:
        return {"student_cache": self.student_cache(seed)}

    def overrides(self, arm: str, seed: int) -> list[str]:
        extra = super().overrides(arm, seed)
        return [*extra, "loss.srcl.alpha_h_end=0.0"] if arm.startswith("SRCL annealed") else extra

    def steps_left(self, arm: str, seed: int) -> int:
        """The training steps ``arm`` of ``seed`` still needs: its own, and those of its seed's warm-up
        and its helper not yet trained on this machine."""
        steps = self.a.steps + max(0, self.a.warmup_steps - steps_done(self.out / f"warmup_seed{seed}"))
        grade = arm_grade(arm)
        if grade is not None:
            need = helper_steps(grade, self.a.helper_base_steps)
            steps += max(0, need - steps_done(self.helper_dir(seed, grade)))
        return steps

    def ready(self, arm: str, seed: int) -> None:
        """Everything ``arm`` of ``seed`` trains from (warm-up, helper, cache, calibrations), built
        under their own locks, before the run takes the shared preparation lock."""
        self.warmup(seed)
        helper = arm.split(", ")[1] if arm != PLAIN else None
        if helper is not None:
            self.calibration(helper, seed)


def as_records(results: SeedResults) -> list[dict[str, Any]]:
    """``results`` as the list ``results_primary.json`` keeps: ``{"arm", "seed", "t2i_r_precision", ...}``."""
    return [
        {"arm": arm, "seed": int(s), "t2i_r_precision": m.get(ENDPOINT), **m}
        for arm, per_seed in results.data.items()
        for s, m in sorted(per_seed.items(), key=lambda kv: int(kv[0]))
    ]


def adopt_records(results: SeedResults, path: Path) -> None:
    """The runs a record list at ``path`` holds that ``results`` lacks, added (a new machine goes on)."""
    if path.exists():
        for r in json.loads(path.read_text()):
            if not results.has(r["arm"], r["seed"]):
                m = {k: v for k, v in r.items() if k not in ("arm", "seed", "t2i_r_precision")}
                results.add(r["arm"], r["seed"], m)


def write_records(results: SeedResults, to: Optional[Path]) -> None:
    """``to/results_primary.json``: every recorded run as a record list, written whole then renamed."""
    if to is not None:
        to.mkdir(parents=True, exist_ok=True)
        tmp = to / "results_primary.tmp"
        tmp.write_text(json.dumps(as_records(SeedResults(results.path)), indent=1))
        tmp.replace(to / "results_primary.json")


class RecordingSweep(MarkedSweep):
    """A :class:`MarkedSweep` that keeps the record list in ``--record`` after every run."""

    def _run_one(self, name: str, seed: int) -> None:
        super()._run_one(name, seed)
        write_records(self.results, self.record_to)
        if self.record_to is not None:  # the list is the record; the per-seed table stays in --out
            (self.record_to / self.results.path.name).unlink(missing_ok=True)


#: the settings every recorded run of the experiment shares (:func:`harness.pin_design`)
DESIGN_KEYS = ("precision", "helper_base_steps", "images", "test_images", "steps", "warmup_steps", "batch_size")


def pilot(exp: HelperExperiment, sweep: RecordingSweep, results: SeedResults) -> int:
    """Seed 0's plain ITC and strongest helper: the helper's own R-precision against the student's."""
    sweep.run([0], [PLAIN])
    run = exp.helper_run(0, GRADES[-1])
    helper = json.loads((run / "eval" / "metrics.json").read_text())[ENDPOINT]
    student = results.data[PLAIN]["0"][ENDPOINT]
    ok = helper >= 1.5 * student
    print(
        f"pilot: helper x{GRADES[-1]} ({helper_steps(GRADES[-1], exp.a.helper_base_steps)} steps) t2i R-precision "
        f"{helper:.2f}, student (plain ITC, seed 0) {student:.2f}: ratio {helper / student:.3f} "
        f"({'at least' if ok else 'below'} 1.5)",
        flush=True,
    )
    return 0 if ok else 3


def in_time(exp: HelperExperiment, budget: Budget, arm: str, seed: int) -> bool:
    """Whether ``arm`` of ``seed`` is expected to finish within ``budget`` (its seed's warm-up, which
    every arm needs, is trained first if no step has been timed yet); a skipped arm is said."""
    if budget.step_s is None:
        budget.timed_step(seconds_per_step(exp.warmup(seed), exp.a.batch_size))
    steps = exp.steps_left(arm, seed)
    if budget.fits(steps, time.time()):
        return True
    print(
        f"skipped {arm}, seed {seed}: {steps} steps, about {budget.estimate(steps) or 0:.0f} s, "
        f"{max(0.0, budget.end - time.time()):.0f} s left of --hours",
        flush=True,
    )
    return False


def main(argv: Optional[list[str]] = None) -> int:
    p = experiment_parser(__doc__, out="runs/srcl_helpers", steps=300)
    p.set_defaults(seeds=None, helper_images=0)
    p.add_argument(
        "--helper-base-steps",
        type=int,
        default=800,
        help="steps of the x1 helper (x sqrt(grade)); 800 since the B = 600 pilot (docs/experiments.md)",
    )
    p.add_argument("--warmup-steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="fp32 since 2026-12-02 (bf16 is emulated, 8.7x slower, on CPUs without avx512_bf16; docs/experiments.md)",
    )
    p.add_argument("--arms", nargs="+", choices=ARMS, default=ARMS, help="only these arms (default: all)")
    p.add_argument(
        "--hours",
        type=float,
        default=None,
        help="start an arm only if it is expected to finish (with the warm-up and helper it needs) within "
        "this many hours: a machine held for a session then spends its end on arms that fit",
    )
    p.add_argument(
        "--arm-overhead-minutes",
        type=float,
        default=ARM_OVERHEAD_MINUTES,
        help="an arm's time beyond its training steps (evaluation, features, calibration) assumed by --hours "
        "until one has finished",
    )
    p.add_argument("--pilot", action="store_true", help="seed 0's plain ITC and strongest helper, then exit")
    p.add_argument("--status", action="store_true", help="print what is done and what is running, then exit")
    p.add_argument("--report", action="store_true", help="write the report from the recorded runs, run nothing")
    p.add_argument("--record", type=Path, default=None, help="a folder (in the repository) that keeps the results")
    a = p.parse_args(argv)
    out = Path(a.out)
    if a.status:
        print(status(out, a))
        return 0
    seeds = list(a.seeds or SEEDS)
    if not a.report:
        pin_design(a.record, {k: getattr(a, k) for k in DESIGN_KEYS})
    restore(out, a.record)
    exp = HelperExperiment(out, a)
    results = SeedResults(out / "seed_results_primary.json")
    if a.record is not None:
        adopt_records(results, a.record / "results_primary.json")
    if a.report:
        write_helpers_report(exp, results, seeds)
        return 0
    sweep = exp.sweep(RecordingSweep, results, "primary", lambda m: f"t2i R-prec {m[ENDPOINT]:.2f}", 34, time.time())
    if a.pilot:
        return pilot(exp, sweep, results)
    mine = [arm for arm in shard_arms(*a.shard) if arm in a.arms]
    budget = Budget(time.time() + a.hours * 3600, a.arm_overhead_minutes * 60) if a.hours else None
    skipped = []
    for seed in seeds:
        for arm in (arm for arm in mine if not results.has(arm, seed)):
            if budget is not None and not in_time(exp, budget, arm, seed):
                skipped.append((arm, seed))
                continue
            started, steps = time.time(), exp.steps_left(arm, seed)
            exp.ready(arm, seed)
            sweep.run([seed], [arm])
            if budget is not None:
                grade = arm_grade(arm)
                for run in [sweep.run_dir(arm, seed), *([exp.helper_dir(seed, grade)] if grade else [])]:
                    budget.timed_step(seconds_per_step(run, a.batch_size))
                budget.finished(steps, time.time() - started)
    if skipped:
        print(f"{len(skipped)} (arm, seed) left for a later run, not expected to finish within --hours", flush=True)
        return 0
    print(f"seeds {seeds} done for {mine}; --report writes the report", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(exit_status(main, "srcl_helpers.py"))
