"""The report of ``srcl_helpers.py``: what is done, and the pre-registered reading (docs/experiments.md,
"Does SRCL help with a learned helper stronger than the student?")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seed_results import SeedResults
from srcl_helpers import ARMS, GRADES, INTERIM, SEEDS, helper_steps


def status(out: Path, a: Any) -> str:
    """Runs done of all (and of the interim look's seeds), helpers trained, and the run each live
    process is on (a mark whose process is gone is shown as such: rerun to resume)."""
    r = SeedResults(out / "seed_results_primary.json")
    done = [(arm, s) for s in SEEDS for arm in ARMS if r.has(arm, s)]
    interim = [d for d in done if d[1] < INTERIM]
    lines = [
        f"primary: {len(done)}/{len(ARMS) * len(SEEDS)} runs done ({len(interim)}/{len(ARMS) * INTERIM} of the "
        f"interim look's {INTERIM} seeds)"
    ]
    trained = [
        (g, s)
        for s in SEEDS
        for g in GRADES
        if (
            out / "helpers" / f"x{g}_steps{helper_steps(g, a.helper_base_steps)}_seed{s}" / "eval" / "metrics.json"
        ).exists()
    ]
    lines.append(f"helpers trained and evaluated: {len(trained)}/{len(GRADES) * len(SEEDS)}")
    for mark in sorted(out.glob("running_*.txt")):
        pid = int(mark.stem.split("_")[1])
        alive = Path(f"/proc/{pid}").exists()
        lines.append(f"pid {pid}: {mark.read_text().strip()}" + ("" if alive else " (process gone: rerun to resume)"))
    return "\n".join(lines)
