"""The design of ``srcl_helpers.py``, read by the experiment and by its report
(``srcl_helpers_report.py``), so that neither imports the other: the grades, the arms and their order,
the seeds and the interim look, the endpoint, the helpers' steps and the table of their own scores."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from harness import helper_seed

GRADES = (1, 4, 16, 64)
CONTROL_AUC = 0.75
PLAIN = "plain ITC"
CONTROL = f"SRCL alone, oracle AUC {CONTROL_AUC:g}"
#: 20 seeds; the first 12 are the interim look's (docs/experiments.md)
SEEDS = tuple(range(20))
INTERIM = 12
ENDPOINT = "img_r_precision"
#: the helpers' checkpoint cadence: a killed helper resumes from its newest
HELPER_CKPT_EVERY = 300
#: an arm's time beyond its training steps assumed by ``--hours`` until one has finished (then the most
#: measured): on an AVX2-only machine, two threads, under a minute for an arm's evaluation, about 9 for a
#: helper's evaluation, features and calibration before its first arm (docs/experiments.md, its Status)
ARM_OVERHEAD_MINUTES = 5.0


def helper_name(grade: int) -> str:
    return f"helper x{grade}"


def alone(grade: int) -> str:
    """The arm with the grade's helper alone all run (``alpha_h = 1``)."""
    return f"SRCL alone, {helper_name(grade)}"


def annealed(grade: int) -> str:
    """The arm with the paper's annealing of ``alpha_h`` from 1 to 0 over the run (vlp's default)."""
    return f"SRCL annealed, {helper_name(grade)}"


#: a seed's arms in the order they run: the ones without a learned helper first, then grade by grade
ARMS = [PLAIN, CONTROL, *(arm for g in GRADES for arm in (alone(g), annealed(g)))]
HELPERS = [f"oracle AUC {CONTROL_AUC:g}", *(helper_name(g) for g in GRADES)]


def shard_arms(i: int, n: int) -> list[str]:
    """The arms of a seed that shard ``i`` of ``n`` runs, in order: a seed's jobs (a grade's helper with
    its two arms; plain ITC with the control), largest helper first, dealt out so that with two shards
    each takes about half a seed (x64 and x1; x16, x4, plain ITC and the control) and both work on the
    same seed at once: a seed's work then fits the time a machine is held, the largest helper starting
    first. One shard runs every job, largest first (so that with ``--hours`` the smaller ones fill the
    end of a session)."""
    x64, x16, x4, x1 = ([alone(g), annealed(g)] for g in sorted(GRADES, reverse=True))
    halves = [[*x64, *x1], [*x16, *x4, PLAIN, CONTROL]]  # about 2.1 and 1.9 thread-hours at B = 600
    if n == 2:
        return halves[i]
    jobs = [x64, x16, x4, x1, [PLAIN, CONTROL]]
    return [arm for job in jobs[i::n] for arm in job]


def grade_of(helper: str) -> Optional[int]:
    """``"helper x16"`` -> 16; an oracle -> None."""
    return int(helper.removeprefix("helper x")) if helper.startswith("helper x") else None


def arm_grade(arm: str) -> Optional[int]:
    """The grade of ``arm``'s learned helper; None for plain ITC and the oracle control."""
    return grade_of(arm.split(", ")[1]) if arm != PLAIN else None


def helper_steps(grade: int, base: int) -> int:
    """Training steps of a grade's helper: ``base`` x sqrt(grade) (compute grows with data)."""
    return round(base * math.sqrt(grade))


def helpers_table(out: Path, base_steps: int, images: int, seeds: list[int]) -> list[dict[str, Any]]:
    """One record per (learned helper, seed) with its own evaluation recorded under ``out/helpers``
    (``base_steps``: ``--helper-base-steps``; ``images``: the student's): grade, seed, images, steps, its
    own text->image R-precision."""
    rows = []
    for seed in seeds:
        for grade in GRADES:
            steps = helper_steps(grade, base_steps)
            own = out / "helpers" / f"x{grade}_steps{steps}_seed{seed}" / "eval" / "metrics.json"
            if own.exists():
                m = json.loads(own.read_text())
                rows.append(
                    {
                        "helper": helper_name(grade),
                        "grade": grade,
                        "seed": seed,
                        "train_seed": helper_seed(seed, GRADES.index(grade)),
                        "images": grade * images,
                        "steps": steps,
                        "t2i_r_precision": m[ENDPOINT],
                    }
                )
    return rows
