"""The experiment harness's sharding: shards split the (seed, variant) runs between them, skip
recorded ones, and share one results file."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "experiments"))
from harness import Sweep, shard  # noqa: E402
from seed_results import SeedResults  # noqa: E402


def test_shard_parses_i_of_n_and_refuses_the_rest():
    assert shard("1/3") == (1, 3)
    for bad in ("3/3", "-1/2", "1", "a/b"):
        with pytest.raises(argparse.ArgumentTypeError, match="--shard"):
            shard(bad)


def _sweep(results: SeedResults, done: list) -> Sweep:
    sweep = Sweep(
        results, Path("."), "preset", Path("d"), 1, run_dir=lambda n, s: Path(n), overrides=lambda n, s: [], summary=str
    )

    def fake_run(name: str, seed: int) -> None:  # records a result as the real run does
        done.append((seed, name))
        results.add(name, seed, {"r": float(seed)})

    sweep._run_one = fake_run  # type: ignore[method-assign]
    return sweep


def test_shards_cover_every_run_once_and_share_the_results_file(tmp_path):
    path = tmp_path / "results.json"
    SeedResults(path).add("b", 0, {"r": 0.0})  # recorded before: skipped by whichever shard owns it
    done0: list = []
    done1: list = []
    s0, s1 = _sweep(SeedResults(path), done0), _sweep(SeedResults(path), done1)
    s0.run([0, 1], ["a", "b", "c"], shard=(0, 2))
    s1.run([0, 1], ["a", "b", "c"], shard=(1, 2))
    assert done0 == [(0, "a"), (0, "c"), (1, "b")]
    assert done1 == [(1, "a"), (1, "c")]  # (0, "b") was recorded
    assert {v: sorted(d) for v, d in SeedResults(path).data.items()} == {
        "a": ["0", "1"],
        "b": ["0", "1"],
        "c": ["0", "1"],
    }


def test_paired_tests_table_gives_t_and_p_per_cell():
    from harness import paired_tests_table

    data = {
        "base": {str(s): {"r": 10.0} for s in range(5)},
        "arm": {str(s): {"r": 10.0 + d} for s, d in enumerate([1.0, 2.0, 3.0, 2.0, 2.0])},
    }
    table = paired_tests_table(data, range(5), ["r"], "base", ["base", "arm", "missing"])
    lines = table.splitlines()
    assert lines[0] == "| variant - base | seeds | r |" and len(lines) == 3
    assert lines[2] == "| arm | 5 | +2.00 ± 0.71 (t 6.32, p 0.0032) |"  # t = 2 / (sqrt(0.5) / sqrt(5))


def test_ltd_matched_dual_arm_runs_after_its_constraint_arm_in_the_same_shard(tmp_path):
    import json

    from ltd_testbed import MATCHED, arms, matched_beta

    names = list(arms(0.05))
    constraint = next(n for n in names if n.startswith("LTD constraint"))
    runs = [(s, v) for s in range(5) for v in names]
    for i in range(2):
        mine = runs[i::2]
        for s in range(5):
            assert ((s, constraint) in mine) == ((s, MATCHED) in mine)
            if (s, MATCHED) in mine:
                assert mine.index((s, constraint)) < mine.index((s, MATCHED))
    run = tmp_path / "constraint_seed0"
    run.mkdir()
    rows = [{"step": 10, "ltd_lambda": 1.0}, {"step": 20, "ltd_lambda": 0.5}, {"step": 30, "loss": 1.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert matched_beta(run, 0.05) == pytest.approx(0.75 / 0.05)  # mean lambda / eta
    with pytest.raises(RuntimeError, match="constraint arm"):
        matched_beta(tmp_path / "missing", 0.05)


def test_holm_rejects_in_order_and_stops_at_the_first_failure():
    from srcl_calibration_report import holm

    assert holm({"a": 0.001, "b": 0.02, "c": 0.03}) == {"a": True, "b": True, "c": True}  # < 0.05/3, 0.05/2, 0.05
    assert holm({"a": 0.001, "b": 0.03, "c": 0.04}) == {"a": True, "b": False, "c": False}  # 0.03 >= 0.025 stops
    assert holm({"a": 0.03, "b": 0.001}) == {"a": True, "b": True}  # 0.001 < 0.025, then 0.03 < 0.05
    assert holm({"a": 0.06, "b": 0.001}) == {"a": False, "b": True}


def test_the_threshold_fit_finds_where_the_gain_crosses_zero():
    from srcl_calibration_report import threshold_with_interval

    # every seed's gains lie on gain = 2 (auc - 0.7): every bootstrap fit crosses at 0.7
    exact = {s: [(a, 2 * (a - 0.7)) for a in (0.6, 0.7 + 0.01 * s, 0.9)] for s in range(5)}
    est, interval, slope = threshold_with_interval(exact, draws=50)
    assert est == pytest.approx(0.7) and interval == pytest.approx((0.7, 0.7)) and slope == pytest.approx(2.0)
    # gains that fall with the AUC: no crossing that means "SRCL needs this AUC", no interval
    falling = {s: [(0.6, 0.5), (0.9, -0.5 + 0.01 * s)] for s in range(5)}
    est, interval, slope = threshold_with_interval(falling, draws=50)
    assert est is None and interval is None and slope < 0


def test_the_shipped_same_image_auc_minimum_is_the_recorded_experiments_rule():
    """``MIN_SAME_IMAGE_AUC`` and its source, recomputed from the recorded results of the calibration
    experiment by its pre-registered rule: the mean same-image AUC of the lowest helper whose paired
    test against plain ITC survives Holm with a positive mean, rounded down to two digits."""
    import json
    import math
    import statistics

    from seed_results import paired_t_test, slug
    from srcl_calibration import ENDPOINT, HELPERS, PLAIN, PRIMARY_ARMS, helper_of
    from srcl_calibration_report import holm

    from vlp.lab.calibration import MIN_AUC_SOURCE, MIN_SAME_IMAGE_AUC

    rec = Path(__file__).resolve().parents[1] / "results" / "srcl_calibration"
    data = json.loads((rec / "results_primary.json").read_text())
    seeds = sorted(data[PLAIN], key=int)
    assert len(seeds) >= 10
    gains = {a: [data[a][s][ENDPOINT] - data[PLAIN][s][ENDPOINT] for s in seeds] for a in PRIMARY_ARMS if a != PLAIN}
    decided = holm({a: paired_t_test(g)[1] for a, g in gains.items()})
    supported = [helper_of(a)[0] for a, g in gains.items() if decided[a] and statistics.mean(g) > 0]
    assert supported

    def auc(helper: str) -> float:
        reports = [rec / "calibration" / f"{slug(helper)}_seed{s}" / "helper_diagnostics.json" for s in seeds]
        return statistics.mean(json.loads(r.read_text())["quality"]["same_image_auc"] for r in reports)

    lowest = min(supported, key=auc)
    assert MIN_SAME_IMAGE_AUC == math.floor(100 * auc(lowest)) / 100
    assert f"ground-truth AUC {HELPERS[lowest]:g}" in MIN_AUC_SOURCE and f"{auc(lowest):.3f}" in MIN_AUC_SOURCE
    g = gains[f"SRCL, {lowest}"]
    assert f"+{statistics.mean(g):.2f} +- {statistics.stdev(g):.2f} over {len(seeds)} seeds" in MIN_AUC_SOURCE


def test_the_docs_quote_the_recorded_primary_tests_of_the_calibration_experiment():
    """docs/experiments.md's table of primary tests and the README's figures are those the recorded
    results give (mean ± std of the paired differences, t, p at the printed precision)."""
    import json
    import statistics

    from seed_results import paired_t_test
    from srcl_calibration import ENDPOINT, PLAIN

    root = Path(__file__).resolve().parents[1]
    data = json.loads((root / "results" / "srcl_calibration" / "results_primary.json").read_text())
    docs, readme = (root / "docs" / "experiments.md").read_text(), (root / "README.md").read_text()
    seeds = sorted(data[PLAIN], key=int)

    def signed(x: float) -> str:
        return f"{x:+.2f}".replace("-", "−")

    def p_as_printed(p: float) -> str:
        return f"{p:.1e}".replace("e-0", "e-") if p < 1e-3 else f"{p:.2f}"

    for arm in (a for a in data if a != PLAIN):
        d = [data[arm][s][ENDPOINT] - data[PLAIN][s][ENDPOINT] for s in seeds]
        t, p = paired_t_test(d)
        m, sd = statistics.mean(d), statistics.stdev(d)
        row = f"| {arm} | {signed(m)} ± {sd:.2f} | {f'{t:.2f}'.replace('-', '−')} | {p_as_printed(p)} |"
        assert row in docs, row
        if arm in ("SRCL, oracle AUC 0.65", "SRCL, learned helper"):
            assert f"{signed(m)} ± {sd:.2f}" + (f", p {p:.2f}" if m < 0 else "") in readme, arm


def test_the_docs_quote_the_recorded_delta_sweep():
    """docs/experiments.md's sweep table: each helper's row holds the recorded paired gains of its
    five deltas (the × 1 arm from the primary grid on the sweep's seeds), in order, and its best."""
    import json
    import statistics

    from srcl_calibration import ENDPOINT, FACTORS, GRIDS, PLAIN, SWEPT

    rec = Path(__file__).resolve().parents[1] / "results" / "srcl_calibration"
    data = {
        **json.loads((rec / "results_primary.json").read_text()),
        **json.loads((rec / "results_sweep.json").read_text()),
    }
    docs = (Path(__file__).resolve().parents[1] / "docs" / "experiments.md").read_text()
    seeds = [str(s) for s in GRIDS["sweep"][1]]
    for helper in SWEPT:
        table = docs[docs.index("| helper | δ × 0.25 | δ × 0.5 | δ × 1 (no-GT) |") :]
        row = next(line for line in table.splitlines() if line.startswith(f"| {helper} | "))
        cells, means = [], {}
        for f in sorted((*FACTORS, 1.0)):
            arm = f"SRCL, {helper}" if f == 1.0 else f"SRCL, {helper}, delta x{f:g}"
            d = [data[arm][s][ENDPOINT] - data[PLAIN][s][ENDPOINT] for s in seeds]
            means[f] = statistics.mean(d)
            cells.append(f"{means[f]:+.2f} ± {statistics.stdev(d):.2f}".replace("-", "−"))
        assert [c.strip(" *") for c in row.split("|")[2:7]] == cells, (helper, row)
        assert f"| × {max(means, key=means.get):g} |" in row


def test_the_sweep_reads_the_nogt_delta_as_good_within_the_best_arms_seed_spread():
    from srcl_calibration_report import nogt_delta_is_good

    # best at x2 (mean 23.0, std 0.71); the no-GT delta's mean 22.6 is 0.4 below: within the spread
    best, spread, good = nogt_delta_is_good({0.5: [22.0, 22.2], 1.0: [22.4, 22.8], 2.0: [22.5, 23.5]})
    assert (best, good) == (2.0, True) and spread == pytest.approx(0.7071, abs=1e-4)
    # the same best, the no-GT delta 1.0 below: not good
    assert nogt_delta_is_good({1.0: [21.9, 22.1], 2.0: [22.5, 23.5]})[2] is False
    # the no-GT delta itself best: good by definition
    assert nogt_delta_is_good({1.0: [23.0, 23.2], 4.0: [22.0, 22.1]}) == (1.0, pytest.approx(0.1414, abs=1e-4), True)
    # a factor with one seed is not compared yet; without the no-GT arm there is no reading
    assert nogt_delta_is_good({1.0: [22.0, 22.1], 2.0: [30.0]})[0] == 1.0
    assert nogt_delta_is_good({2.0: [22.0, 22.1]}) is None


def test_the_paired_sweep_rule_judges_the_no_gt_delta_by_the_best_arms_paired_spread():
    """Issue 51: on the recorded sweep the learned helper's no-GT delta is 0.44 below the best delta
    (x 0.25), whose gains over plain ITC vary by 0.05 seed to seed: not good on the paired scale,
    although the pre-registered between-seed rule says yes."""
    from srcl_calibration_report import factor_one_against_the_rest, nogt_delta_is_good_paired

    gains = {0.25: {0: 0.10, 1: 0.05, 2: 0.06}, 1.0: {0: -0.3, 1: -0.4, 2: -0.5}, 2.0: {0: -0.4, 1: -0.4}}
    best, spread, diff, good = nogt_delta_is_good_paired(gains)
    assert (best, good) == (0.25, False)
    assert spread == pytest.approx(0.0265, abs=1e-4) and diff == pytest.approx(0.47, abs=1e-9)
    # the no-GT delta best: good; a gap within the best arm's paired spread: good
    assert nogt_delta_is_good_paired({1.0: {0: 0.5, 1: 0.3}, 2.0: {0: 0.1, 1: 0.2}})[3] is True
    assert nogt_delta_is_good_paired({1.0: {0: 0.0, 1: 0.2}, 2.0: {0: 0.0, 1: 0.6}}) == (
        2.0,
        pytest.approx(0.4243, abs=1e-4),
        pytest.approx(0.2),
        True,
    )
    assert nogt_delta_is_good_paired({2.0: {0: 0.1, 1: 0.2}}) is None
    rest = factor_one_against_the_rest(gains)
    assert set(rest) == {0.25, 2.0}  # x 2 has the two seeds both have
    mean, std, t, p = rest[0.25]
    assert mean == pytest.approx(-0.47) and std == pytest.approx(0.0819, abs=1e-4) and t < -9 and p < 0.02


def test_calibration_arms_name_their_helper_and_delta_factor():
    from srcl_calibration import GRIDS, PLAIN, helper_of

    assert helper_of(PLAIN) == (None, 1.0)
    assert helper_of("SRCL, oracle AUC 0.65") == ("oracle AUC 0.65", 1.0)
    assert helper_of("SRCL, learned helper, delta x0.25") == ("learned helper", 0.25)
    arms, seeds = GRIDS["primary"]
    assert len(arms) == 6 and len(seeds) == 12 and len(GRIDS["sweep"][0]) == 12


def test_calibration_status_names_live_runs_and_only_the_cut_runs_nobody_took_up(tmp_path):
    from srcl_calibration import PLAIN, status

    SeedResults(tmp_path / "results_primary.json").add(PLAIN, 0, {"img_r_precision": 1.0})
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid whose process is gone
    marks = {
        dead.pid: f"{PLAIN} seed 0 since 01:00:00",  # cut, then finished by a later process
        dead.pid + 100000: "SRCL, oracle AUC 0.65 seed 1 since 01:00:00",  # cut, taken up again now
        dead.pid + 200000: "SRCL, learned helper seed 2 since 01:00:00",  # cut, nobody on it
        os.getpid(): "SRCL, oracle AUC 0.65 seed 1 since 02:00:00",
    }
    for pid, text in marks.items():
        (tmp_path / f"running_{pid}.txt").write_text(text + "\n")
    lines = status(tmp_path).splitlines()
    assert lines[0] == "primary: 1/72 runs done"
    assert f"pid {os.getpid()}: SRCL, oracle AUC 0.65 seed 1 since 02:00:00" in lines
    assert [line for line in lines if "gone" in line] == [
        f"pid {dead.pid + 200000}: SRCL, learned helper seed 2 since 01:00:00 (process gone: rerun to resume)"
    ]


def test_pin_design_writes_the_first_design_and_refuses_another(tmp_path):
    """``harness.pin_design``: no ``design.json`` yet: written; the same design: goes on; another value
    of any key: one error naming the file, the key, the kept and the asked value; no record: no check."""
    import json

    from harness import pin_design

    rec = tmp_path / "rec"
    pin_design(None, {"steps": 1})
    pin_design(rec, {"steps": 300, "precision": "fp32"})
    assert json.loads((rec / "design.json").read_text()) == {"steps": 300, "precision": "fp32"}
    pin_design(rec, {"steps": 300, "precision": "fp32"})
    with pytest.raises(SystemExit, match=r"rec/design\.json: .*precision 'fp32' there, 'bf16' asked"):
        pin_design(rec, {"steps": 300, "precision": "bf16"})


def test_the_calibration_experiment_refuses_a_run_of_another_design_before_it_writes(tmp_path):
    """The neighbour of the learned-helper experiment's check: ``srcl_calibration.py --record`` with the
    kept results' design (results/srcl_calibration/design.json: its defaults) goes on; a run asking other
    steps is refused before its ``--out`` exists."""
    import json

    from srcl_calibration import DESIGN_KEYS, main

    root = Path(__file__).resolve().parents[1]
    kept = json.loads((root / "results" / "srcl_calibration" / "design.json").read_text())
    assert set(kept) == set(DESIGN_KEYS) and kept["steps"] == 300 and kept["helper_steps"] == 600
    rec, out = tmp_path / "rec", tmp_path / "out"
    rec.mkdir()
    (rec / "design.json").write_text(json.dumps(kept))
    with pytest.raises(SystemExit, match=r"design\.json: .*steps 300 there, 2 asked"):
        main(["--out", str(out), "--record", str(rec), "--seeds", "0", "--steps", "2"])
    assert not out.exists()


def test_a_budget_starts_only_runs_expected_to_finish_in_time():
    """``--hours``: before a step is timed every run fits; then a run fits when its steps at the slowest
    measured step time, plus the most a finished run took beyond its steps (else the assumed overhead),
    end before the budget does."""
    from harness import Budget

    b = Budget(end=1000.0, overhead_s=60.0)
    assert b.fits(10**6, now=0.0) and b.estimate(5) is None
    b.timed_step(1.0)
    b.timed_step(0.5)  # a faster window does not lower the estimate
    b.timed_step(None)
    assert b.step_s == 1.0 and b.estimate(800) == 860.0
    assert b.fits(800, now=0.0) and not b.fits(800, now=200.0) and not b.fits(950, now=0.0)
    b.finished(100, wall_s=400.0)  # 300 s beyond its steps: evaluation, features, calibration
    b.finished(100, wall_s=150.0)
    assert b.estimate(100) == 400.0
    assert b.fits(650, now=0.0) and not b.fits(750, now=0.0)


def test_seconds_per_step_is_the_batch_over_the_median_logged_rate(tmp_path):
    import json

    from harness import seconds_per_step

    assert seconds_per_step(tmp_path, 64) is None  # no log yet
    rows = [{"step": s, "pairs_per_s": r} for s, r in ((10, 128.0), (20, 64.0), (30, 32.0), (40, 0.0))]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert seconds_per_step(tmp_path, 64) == 1.0
