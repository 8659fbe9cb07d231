"""The report of ``srcl_helpers.py``: what is done, and the pre-registered reading (docs/experiments.md,
"Does SRCL help with a learned helper stronger than the student?").

Primary: each grade's annealed arm against plain ITC (paired t, Holm over the four grades), the
per-seed slope of the "alone" arms' gain over log2(grade) (one-sample t), the oracle control; at the
interim look (the first 12 seeds, once each has every arm) a test is read as final only at p < 0.001
(Haybittle-Peto); before it the tests are printed and read by nothing.
Secondary: which measure ranks the gain (Spearman with a seed-bootstrap interval, leave one grade out),
read at 20 seeds.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from harness import results_table, run_minutes, write_report
from seed_results import SeedResults, paired_t_test, student_t_two_sided
from srcl_calibration_report import gains_by_seed, holm, mean_std, save_gain_plot
from srcl_helpers_design import (
    ARMS,
    CONTROL,
    ENDPOINT,
    GRADES,
    HELPERS,
    INTERIM,
    PLAIN,
    SEEDS,
    alone,
    annealed,
    helper_steps,
    helpers_table,
)

from vlp.lab.helper_student import report_value

#: the p below which a primary test is read as final at the interim look (Haybittle-Peto)
INTERIM_P = 0.001
FAMILY_ALPHA = 0.05
#: the measures of the secondary question: name -> path into the no-GT calibration report
MEASURES: dict[str, tuple[str, ...]] = {
    "same-image AUC": ("quality", "same_image_auc"),
    "N_eff at the no-GT δ": ("at_delta", "n_eff_mean"),
    "share of negatives below 0.2": ("weights", "target_weight", "all_negatives", "below_0_2"),
    "same-image AUC, student's hardest": ("against_student", "hard_same_image_auc"),
    "same-image AUC, student-softmax weighted": ("against_student", "student_weighted_same_image_auc"),
    "helper-student rank agreement": ("against_student", "rank_agreement"),
    "pair R@1, helper minus student": ("against_student", "pair_r1_gap"),
}


def t_quantile(p: float, dof: int) -> float:
    """The ``t`` with two-sided p-value ``p`` at ``dof`` degrees of freedom (bisection)."""
    lo, hi = 0.0, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if student_t_two_sided(mid, dof, 400) > p else (lo, mid)
    return (lo + hi) / 2


def one_sample(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample std, n, two-sided t-test against 0 and the 95% confidence interval of the mean."""
    n = len(values)
    if n < 2:
        return {"n": n, "mean": values[0] if values else math.nan}
    mean, sd = statistics.mean(values), statistics.stdev(values)
    t, p = paired_t_test(list(values))
    half = t_quantile(0.05, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "std": sd, "t": t, "p": p, "ci_low": mean - half, "ci_high": mean + half}


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` over ``xs``."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def seed_slopes(data: dict, arm_of: Callable[[int], str], seeds: Sequence[int]) -> dict[int, float]:
    """Per seed with every grade recorded: the slope of (arm - plain ITC) over log2(grade)."""
    gains = {g: gains_by_seed(data, arm_of(g), PLAIN, seeds, ENDPOINT) for g in GRADES}
    xs = [math.log2(g) for g in GRADES]
    return {s: slope(xs, [gains[g][s] for g in GRADES]) for s in seeds if all(s in gains[g] for g in GRADES)}


def verdict(test: dict[str, float], significant: bool, final: bool, look: str = "final") -> str:
    """supported / refuted / inconclusive, "(interim)" for a reading that is not yet final, and "not
    read" before the pre-registered look (``look == "none"``)."""
    if "p" not in test:
        return "not yet"
    if look == "none":
        return "not read (no look yet)"
    word = ("supported" if test["mean"] > 0 else "refuted") if significant else "inconclusive"
    return word if final or significant else f"{word} so far (interim)"


def recorded(data: dict, seeds: Sequence[int]) -> list[int]:
    """The seeds of ``seeds`` with a plain ITC record (the arm every comparison is paired with)."""
    return [s for s in seeds if str(s) in data.get(PLAIN, {})]


def has_every_arm(data: dict, seed: int) -> bool:
    """Whether every arm of ``seed`` is recorded in ``data`` (arm -> seed -> metrics)."""
    return all(str(seed) in data.get(arm, {}) for arm in ARMS)


def the_look(data: dict, seeds: Sequence[int]) -> tuple[str, list[int]]:
    """The pre-registered look the recorded runs allow, and the seeds it reads: "final" once every arm
    of all 20 seeds is recorded; "interim" once the first 12 are (read on those 12 alone, whatever is
    recorded beyond them); else "none" (the tests on every seed with a record, read by nothing)."""
    complete = [s for s in seeds if has_every_arm(data, s)]
    if set(SEEDS) <= set(complete):
        return "final", list(SEEDS)
    if set(SEEDS[:INTERIM]) <= set(complete):
        return "interim", list(SEEDS[:INTERIM])
    return "none", recorded(data, seeds)


def primary_reading(data: dict, seeds: Sequence[int]) -> dict[str, Any]:
    """The pre-registered primary tests on the recorded runs (``the_look`` picks the seeds): Question 1
    (each grade's annealed arm minus plain ITC; Holm over the grades), Question 2 (the alone arms' slope
    over log2(grade)), the control; ``final``: all 20 seeds, at the interim p < 0.001 decides, before
    it nothing is read. ``complete``: how many of the interim look's seeds have every arm."""
    look, seeds = the_look(data, seeds)
    final = look == "final"
    q1 = {g: one_sample(list(gains_by_seed(data, annealed(g), PLAIN, seeds, ENDPOINT).values())) for g in GRADES}
    pvals = {str(g): t["p"] for g, t in q1.items() if "p" in t}
    rejected = holm(pvals, FAMILY_ALPHA) if final else {k: p < INTERIM_P for k, p in pvals.items()}
    slopes = seed_slopes(data, alone, seeds)
    q2 = one_sample(list(slopes.values()))
    control = one_sample(list(gains_by_seed(data, CONTROL, PLAIN, seeds, ENDPOINT).values()))
    bar = FAMILY_ALPHA if final else INTERIM_P
    complete = sum(has_every_arm(data, s) for s in SEEDS[:INTERIM])
    return {
        "seeds": len(seeds),
        "look": look,
        "complete": complete,
        "final": final,
        "q1": {g: {**t, "reading": verdict(t, rejected.get(str(g), False), final, look)} for g, t in q1.items()},
        "q2": {**q2, "reading": verdict(q2, q2.get("p", 1.0) < bar, final, look)},
        "q2_annealed": one_sample(list(seed_slopes(data, annealed, seeds).values())),
        "control": {**control, "reading": verdict(control, control.get("p", 1.0) < FAMILY_ALPHA, True, look)},
    }


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return num / den if den else math.nan


def logo_r2(points: Sequence[tuple[int, int, float, float]]) -> float:
    """Leave one grade out: for each grade, gain = a + b * measure fitted on the other grades' points
    ``(grade, seed, measure, gain)`` predicts its points; 1 - (their squared error) / (the squared error
    of predicting the other grades' mean gain), pooled over the held-out grades."""
    sse_fit = sse_mean = 0.0
    for g in sorted({p[0] for p in points}):
        train = [p for p in points if p[0] != g]
        test = [p for p in points if p[0] == g]
        xs, ys = [p[2] for p in train], [p[3] for p in train]
        b = slope(xs, ys) if len(set(xs)) > 1 else 0.0
        a = statistics.mean(ys) - b * statistics.mean(xs)
        sse_fit += sum((a + b * p[2] - p[3]) ** 2 for p in test)
        sse_mean += sum((statistics.mean(ys) - p[3]) ** 2 for p in test)
    return 1.0 - sse_fit / sse_mean if sse_mean else math.nan


def rank_measure(points: Sequence[tuple[int, int, float, float]], n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """A measure against the gain: Spearman over the points, its 95% interval by resampling seeds,
    R2_LOGO, and whether it predicts (R2_LOGO > 0 and the interval excludes 0)."""
    rho = spearman([p[2] for p in points], [p[3] for p in points])
    by_seed: dict[int, list] = {}
    for p in points:
        by_seed.setdefault(p[1], []).append(p)
    rng, seeds, boots = random.Random(seed), sorted(by_seed), []
    for _ in range(n_boot):
        sample = [p for s in (rng.choice(seeds) for _ in seeds) for p in by_seed[s]]
        r = spearman([p[2] for p in sample], [p[3] for p in sample])
        if not math.isnan(r):
            boots.append(r)
    boots.sort()
    lo, hi = (boots[int(0.025 * len(boots))], boots[int(0.975 * len(boots)) - 1]) if boots else (math.nan, math.nan)
    r2 = logo_r2(points)
    return {"spearman": rho, "ci_low": lo, "ci_high": hi, "r2_logo": r2, "predicts": r2 > 0 and (lo > 0 or hi < 0)}


def measure_points(out: Path, data: dict, arm_of: Callable[[int], str], seeds: Sequence[int]) -> dict[str, list]:
    """measure -> ``(grade, seed, measure, gain)`` for every learned helper with both recorded."""
    points: dict[str, list] = {m: [] for m in MEASURES}
    for g in GRADES:
        gains = gains_by_seed(data, arm_of(g), PLAIN, seeds, ENDPOINT)
        for s, gain in gains.items():
            path = out / "calibration" / f"helper_x{g}_seed{s}" / "helper_diagnostics.json"
            if path.exists():
                report = json.loads(path.read_text())
                for m, keys in MEASURES.items():
                    v = report_value(report, keys)
                    if v is not None and math.isfinite(v):
                        points[m].append((g, s, v, gain))
    return points


def _test_row(name: str, t: dict[str, Any]) -> str:
    if "p" not in t:
        return f"| {name} | {t.get('n', 0)} | - | - | - | - | not yet |"
    return (
        f"| {name} | {t['n']} | {t['mean']:+.2f} ± {t['std']:.2f} | {t['ci_low']:+.2f} to {t['ci_high']:+.2f} "
        f"| {t['t']:.2f} | {t['p']:.2g} | {t.get('reading', '')} |"
    )


def primary_tables(reading: dict[str, Any]) -> str:
    """The primary tests (and the control) as one Markdown table."""
    head = [
        "| test | seeds | mean ± std | 95% CI | t | p | reading |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    rows = [_test_row(f"Q1: {annealed(g)} − plain ITC", t) for g, t in reading["q1"].items()]
    rows.append(_test_row("Q2: slope of (alone − plain ITC) per doubling of the helper's images", reading["q2"]))
    rows.append(_test_row("(secondary) slope of (annealed − plain ITC) per doubling", reading["q2_annealed"]))
    rows.append(_test_row(f"control: {CONTROL} − plain ITC", reading["control"]))
    look = {
        "final": "final (20 seeds)",
        "interim": f"interim ({INTERIM} seeds: final only at p < {INTERIM_P})",
        "none": f"no look yet: {reading['complete']} of the interim look's {INTERIM} seeds have every arm "
        f"(descriptive, {reading['seeds']} seeds)",
    }[reading["look"]]
    return f"Primary tests, {look}; Q1 with Holm over {len(GRADES)} grades at {FAMILY_ALPHA}.\n\n" + "\n".join(
        head + rows
    )


def helper_strength_table(rows: list[dict[str, Any]], student: Sequence[float]) -> str:
    """Each grade's own text->image R-precision over seeds, and its ratio to the student's mean."""
    lines = [
        "| helper | images | steps | seeds | own t2i R-precision | ÷ student's (plain ITC) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    base = statistics.mean(student) if student else math.nan
    for g in GRADES:
        mine = [r for r in rows if r["grade"] == g]
        if mine:
            v = [r["t2i_r_precision"] for r in mine]
            lines.append(
                f"| x{g} | {mine[0]['images']} | {mine[0]['steps']} | {len(v)} | {mean_std(v, '.2f')} "
                f"| {statistics.mean(v) / base:.2f} |"
            )
    return "\n".join(lines)


def measures_table(out: Path, seeds: Sequence[int]) -> str:
    """Every helper's measures (no ground truth, against the student) and ground-truth AUC, mean ± std."""
    names = list(MEASURES)
    lines = ["| helper | " + " | ".join(names) + " | ground-truth AUC |", "|---|" + "---:|" * (len(names) + 1)]
    for h in HELPERS:
        cells = []
        for keys in MEASURES.values():
            v = [_report_value(out / "calibration", h, s, keys) for s in seeds]
            cells.append(mean_std([x for x in v if x is not None], ".3f"))
        gt = [_report_value(out / "ground_truth", h, s, ("helper_auc", "with_queue")) for s in seeds]
        cells.append(mean_std([x for x in gt if x is not None], ".3f"))
        lines.append(f"| {h} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _report_value(folder: Path, helper: str, seed: int, keys: tuple[str, ...]) -> Optional[float]:
    from seed_results import slug

    path = folder / f"{slug(helper)}_seed{seed}" / "helper_diagnostics.json"
    return report_value(json.loads(path.read_text()), keys) if path.exists() else None


def _enough(points: Sequence[tuple[int, int, float, float]]) -> bool:
    return len({p[1] for p in points}) >= 3 and len({p[0] for p in points}) >= 2


def gate_line(points: Sequence[tuple[int, int, float, float]]) -> dict[str, Any]:
    """The gate's figures for a measure (docs/experiments.md, "How the final look is read"): the
    least-squares line of the gain on the measure over every ``(grade, seed, measure, gain)`` point,
    the measure where it crosses 0 (``threshold``), whether it rises, and the span the points cover."""
    xs, ys = [p[2] for p in points], [p[3] for p in points]
    b = slope(xs, ys)
    a = statistics.mean(ys) - b * statistics.mean(xs)
    threshold = -a / b if b else math.nan
    return {"intercept": a, "slope": b, "threshold": threshold, "rising": b > 0, "span": (min(xs), max(xs))}


def the_gate(out: Path, data: dict, seeds: Sequence[int]) -> Optional[tuple[str, dict[str, Any]]]:
    """The measure the gate advises by: of those that predict the annealed arms' gain, the one with
    the highest R²_LOGO, with its :func:`gate_line`; None where none predicts."""
    ranked = []
    for m, pts in measure_points(out, data, annealed, seeds).items():
        if _enough(pts):
            r = rank_measure(pts)
            if r["predicts"]:
                ranked.append((r["r2_logo"], m, pts))
    if not ranked:
        return None
    _, m, pts = max(ranked)
    return m, gate_line(pts)


def gate_sentence(gate: Optional[tuple[str, dict[str, Any]]]) -> str:
    """The report's line on the gate (``PREDICTOR`` in vlp/lab/helper_student.py) from :func:`the_gate`."""
    if gate is None:
        return "The gate: no measure predicts the annealed arms' gain; `PREDICTOR` stays None."
    m, g = gate
    side = "at or above" if g["rising"] else "at or below"
    return (
        f"The gate: {m}, the best measure that predicts the annealed arms' gain; the least-squares line "
        f"gain = {g['intercept']:+.3f} {g['slope']:+.4g} x measure crosses 0 at {g['threshold']:.4g} (go {side} it); "
        f"the points span {g['span'][0]:.4g} to {g['span'][1]:.4g}."
    )


def secondary_table(out: Path, data: dict, seeds: Sequence[int], final: bool) -> str:
    """The pre-registered secondary: each measure against the annealed arm's gain (and the alone arm's);
    whether a measure predicts is read only at the final look (``final``: 20 seeds with every arm)."""
    lines = [
        "| measure | arms | points | Spearman (95% CI, seeds resampled) | R²_LOGO | predicts |",
        "|---|---|---:|---:|---:|---|",
    ]
    for label, arm_of in (("annealed", annealed), ("alone", alone)):
        for m, pts in measure_points(out, data, arm_of, seeds).items():
            if not _enough(pts):
                lines.append(f"| {m} | {label} | {len(pts)} | - | - | not yet |")
                continue
            r = rank_measure(pts)
            lines.append(
                f"| {m} | {label} | {len(pts)} | {r['spearman']:+.2f} ({r['ci_low']:+.2f} to {r['ci_high']:+.2f}) "
                f"| {r['r2_logo']:+.2f} | {('yes' if r['predicts'] else 'no') if final else 'not read (at 20 seeds)'} |"
            )
    return "\n".join(lines) + ("\n\n" + gate_sentence(the_gate(out, data, seeds)) if final else "")


def plot_gain_by_grade(data: dict, seeds: Sequence[int], path: Path) -> Optional[Path]:
    """The gain over plain ITC by grade (log2 axis), alone and annealed (mean ± std), with the control."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    drawn = False
    for k, (label, arm_of) in enumerate((("alone (alpha_h 1)", alone), ("annealed (paper)", annealed))):
        pts = [(g, list(gains_by_seed(data, arm_of(g), PLAIN, seeds, ENDPOINT).values())) for g in GRADES]
        pts = [(g, v) for g, v in pts if v]
        if pts:
            drawn = True
            ax.errorbar([g * (1.04 if k else 1.0) for g, _ in pts], [statistics.mean(v) for _, v in pts],
                        yerr=[statistics.stdev(v) if len(v) > 1 else 0.0 for _, v in pts], marker="o", capsize=3,
                        color=f"C{k}", label=f"{label}, learned helper")  # fmt: skip
    control = list(gains_by_seed(data, CONTROL, PLAIN, seeds, ENDPOINT).values())
    if control:
        ax.axhline(statistics.mean(control), color="C2", ls="--", label="oracle AUC 0.75 (control)")
    if not drawn and not control:
        plt.close(fig)
        return None
    ax.set_xscale("log", base=2)
    return save_gain_plot(fig, ax, path, "helper's images ÷ the student's (compute grows with data)")


def plot_gate(out: Path, data: dict, seeds: Sequence[int], path: Path) -> Optional[Path]:
    """The annealed arms' gain against the gate's measure (:func:`the_gate`), one point per (grade,
    seed), with the fitted line and its threshold; None where no measure predicts."""
    gate = the_gate(out, data, seeds)
    if gate is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measure, line = gate
    points = measure_points(out, data, annealed, seeds)[measure]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for k, g in enumerate(GRADES):
        mine = [p for p in points if p[0] == g]
        ax.scatter([p[2] for p in mine], [p[3] for p in mine], s=14, color=f"C{k}", label=f"helper x{g}")
    lo, hi = line["span"]
    ax.plot([lo, hi], [line["intercept"] + line["slope"] * x for x in (lo, hi)], color="k", lw=1, label="fit")
    ax.axvline(line["threshold"], color="k", ls="--", lw=1, label=f"threshold {line['threshold']:.4g}")
    return save_gain_plot(fig, ax, path, f"{measure} (annealed arms)")


def write_helpers_report(exp: Any, results: SeedResults, seeds: Sequence[int]) -> str:
    """``OUT/report_primary.md`` and its plot (copied into ``--record``): the pre-registered reading."""
    data = results.data
    rows = helpers_table(exp.out, exp.a.helper_base_steps, exp.a.images, list(seeds))
    with_record = recorded(data, seeds)
    student = [data[PLAIN][str(s)][ENDPOINT] for s in with_record]
    plot = plot_gain_by_grade(data, seeds, exp.out / "gain_by_grade.png")
    reading = primary_reading(data, seeds)
    gate = plot_gate(exp.out, data, seeds, exp.out / "gain_by_gate_measure.png") if reading["final"] else None
    text = write_report(
        exp.out / "report_primary.md",
        f"SRCL with learned helpers graded by strength; seeds with a record {with_record}; "
        f"{run_minutes(results, 'of the arms alone, wall-clock, on one or two threads')}.",
        "Helpers' own retrieval on the student's test split:\n\n" + helper_strength_table(rows, student),
        "Text->image R-precision and the other metrics, mean ± std over seeds:\n\n"
        + results_table(results, seeds, (ENDPOINT, "img_ndcg10", "txt_r_precision"), label=None),
        primary_tables(reading),
        "Measures of each helper (no ground truth, against the student's warm-up; ground truth beside):\n\n"
        + measures_table(exp.out, seeds),
        "Secondary (pre-registered): which measure ranks the gain, learned helpers only:\n\n"
        + secondary_table(exp.out, data, seeds, reading["final"]),
        f"![gain by grade]({plot.name})" if plot else "",
        f"![gain against the gate's measure]({gate.name})" if gate else "",
    )
    if exp.a.record is not None:
        for f in [exp.out / "report_primary.md", *[p for p in (plot, gate) if p]]:
            (exp.a.record / f.name).write_bytes(f.read_bytes())
    (exp.out / "helpers.json").write_text(json.dumps(rows, indent=1))
    return text


def seeds_left(done: Sequence[tuple[str, int]]) -> list[str]:
    """The seeds with every arm, and for each seed begun but not finished the arms it lacks."""
    by_seed: dict[int, set[str]] = {}
    for arm, s in done:
        by_seed.setdefault(s, set()).add(arm)
    full = [s for s in SEEDS if len(by_seed.get(s, ())) == len(ARMS)]
    lines = [f"seeds with every arm: {', '.join(map(str, full)) or 'none'}"]
    for s in SEEDS:
        if s in by_seed and s not in full:
            lacks = [arm for arm in ARMS if arm not in by_seed[s]]
            lines.append(f"seed {s} lacks {len(lacks)} arms: {'; '.join(lacks)}")
    return lines


def status(out: Path, a: Any) -> str:
    """Runs done of all (and of the interim look's seeds), helpers trained, and the run each live
    process is on (a mark whose process is gone is shown as such: rerun to resume), counting what
    ``a.record`` keeps: a new machine's ``out`` is empty until a run starts."""
    r = SeedResults(out / "seed_results_primary.json")
    record = getattr(a, "record", None)
    listed = record / "results_primary.json" if record is not None else None
    kept = {(x["arm"], int(x["seed"])) for x in json.loads(listed.read_text())} if listed and listed.exists() else set()
    done = [(arm, s) for s in SEEDS for arm in ARMS if r.has(arm, s) or (arm, s) in kept]
    interim = [d for d in done if d[1] < INTERIM]
    lines = [
        f"primary: {len(done)}/{len(ARMS) * len(SEEDS)} runs done ({len(interim)}/{len(ARMS) * INTERIM} of the "
        f"interim look's {INTERIM} seeds)"
    ]
    trained = [
        (g, s)
        for s in SEEDS
        for g in GRADES
        if any(
            (
                where
                / "helpers"
                / f"x{g}_steps{helper_steps(g, a.helper_base_steps)}_seed{s}"
                / "eval"
                / "metrics.json"
            ).exists()
            for where in (out, record)
            if where is not None
        )
    ]
    lines.append(f"helpers trained and evaluated: {len(trained)}/{len(GRADES) * len(SEEDS)}")
    lines += seeds_left(done)
    for mark in sorted(out.glob("running_*.txt")):
        pid = int(mark.stem.split("_")[1])
        alive = Path(f"/proc/{pid}").exists()
        lines.append(f"pid {pid}: {mark.read_text().strip()}" + ("" if alive else " (process gone: rerun to resume)"))
    return "\n".join(lines)
