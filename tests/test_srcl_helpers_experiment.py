"""The learned-helper experiment (scripts/experiments/srcl_helpers.py, issue 51): helpers never start
from the student's weights, grades draw nested images per seed, arms differ only where they should, and
its records round-trip."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "experiments"))
from harness import helper_seed, train_once  # noqa: E402

WORLD = dict(seed=0, n_train=64, n_val=8, n_test=8)


def _initial_state(preset: str, data: Path, seed: int) -> dict[str, torch.Tensor]:
    """The weights a run of ``preset`` with ``train.seed=seed`` starts from (the training's own path)."""
    from vlp.config import PretrainConfig, load_config
    from vlp.runs.training.pretrain import build_pretraining

    cfg = load_config(PretrainConfig, preset, [f"data.train=[{data}]", f"train.seed={seed}", "data.num_workers=0"])
    return {k: v.detach().clone() for k, v in build_pretraining(cfg).model.state_dict().items()}


def test_a_helper_and_its_student_share_no_initial_tensor(world):
    """Issue 51: the calibration experiment's learned helper and its student were both built after
    ``set_seed(seed)``, and for a seed all 166 randomly initialised tensors were bit-identical. With
    ``helper_seed``, none of the random tensors (those that differ between two student seeds) of a helper
    equals the student's, nor another grade's helper's. Fails with ``train.seed = seed`` for both."""
    student, other = (_initial_state("configs/pretrain/shapes_tiny.yaml", world["pretrain"], s) for s in (3, 4))
    helpers = [_initial_state("configs/helper/shapes_tiny.yaml", world["pretrain"], helper_seed(3, i)) for i in (0, 1)]
    random = [k for k in student if k in other and not torch.equal(student[k], other[k])]
    assert len(random) > 100  # the towers' initialised weights, not only a few
    for k in random:
        assert not torch.equal(helpers[0][k], student[k]), k
        assert not torch.equal(helpers[1][k], helpers[0][k]), k
    same_seed = _initial_state("configs/helper/shapes_tiny.yaml", world["pretrain"], 3)
    assert all(torch.equal(same_seed[k], student[k]) for k in random)  # the defect: the same seed, the same tensors


def test_helper_seeds_are_never_a_students():
    seeds = {helper_seed(s, i) for s in range(1000) for i in range(4)}
    assert len(seeds) == 4000 and min(seeds) >= 1000
    with pytest.raises(ValueError, match="student seeds"):
        helper_seed(1000)


@pytest.mark.parametrize("overrides", [["train.seed=3"], []])
def test_a_helper_run_without_a_helper_seed_is_refused_before_training(tmp_path, overrides):
    with pytest.raises(ValueError, match="its own seed"):
        train_once(tmp_path / "h", "configs/helper/shapes_tiny.yaml", tmp_path / "none.json", 1, overrides, helper=True)
    assert not (tmp_path / "h").exists()


def test_grades_are_nested_per_seed_and_differ_between_seeds():
    from srcl_helpers import pool_subset

    pool = [{"image": f"images/helper/helper_{i:06d}.png"} for i in range(64 * 5)]
    by_grade = {g: [r["image"] for r in pool_subset(pool, 3, g, 5)] for g in (1, 4, 16, 64)}
    assert [len(v) for v in by_grade.values()] == [5, 20, 80, 320]
    for small, big in ((1, 4), (4, 16), (16, 64)):
        assert by_grade[big][: len(by_grade[small])] == by_grade[small]
    assert [r["image"] for r in pool_subset(pool, 4, 16, 5)] != by_grade[16]
    with pytest.raises(ValueError, match="pool images"):
        pool_subset(pool, 0, 128, 5)


def test_arms_differ_only_in_the_helper_and_alpha_hs_schedule():
    from srcl_helpers_design import ARMS, CONTROL, GRADES, PLAIN, alone, annealed

    assert ARMS[:2] == [PLAIN, CONTROL] and len(ARMS) == 2 + 2 * len(GRADES)
    assert [ARMS.index(alone(g)) < ARMS.index(annealed(g)) for g in GRADES] == [True] * 4


def test_shards_split_each_seeds_work_and_start_with_the_largest_helper():
    from srcl_helpers_design import ARMS, alone, shard_arms

    assert sorted(shard_arms(0, 1)) == sorted(ARMS) and shard_arms(0, 1)[:2] == [alone(64), "SRCL annealed, helper x64"]
    # the smallest jobs last: with --hours they fill a session's end
    assert shard_arms(0, 1)[-2:] == ["plain ITC", "SRCL alone, oracle AUC 0.75"]
    for n in (2, 3, 5):
        parts = [shard_arms(i, n) for i in range(n)]
        assert sorted(arm for part in parts for arm in part) == sorted(ARMS)
        assert parts[0][0] == alone(64)
    assert shard_arms(0, 2)[:3] == [alone(64), "SRCL annealed, helper x64", alone(1)]


def test_records_round_trip_through_the_record_list(tmp_path):
    from seed_results import SeedResults
    from srcl_helpers import adopt_records, as_records, write_records

    r = SeedResults(tmp_path / "a.json")
    r.add("plain ITC", 1, {"img_r_precision": 22.0, "seconds": 5.0})
    r.add("SRCL alone, helper x4", 0, {"img_r_precision": 23.5})
    write_records(r, tmp_path / "rec")
    recs = SeedResults  # noqa: F841  (the list is what results_primary.json keeps)
    listed = __import__("json").loads((tmp_path / "rec" / "results_primary.json").read_text())
    assert {"arm": "plain ITC", "seed": 1, "t2i_r_precision": 22.0, "img_r_precision": 22.0, "seconds": 5.0} in listed
    assert listed == as_records(r)
    fresh = SeedResults(tmp_path / "b.json")
    adopt_records(fresh, tmp_path / "rec" / "results_primary.json")
    assert fresh.data == r.data


def test_status_on_a_new_machine_counts_what_the_record_keeps(tmp_path, capsys):
    """A fresh --out (a new machine) with the repository's record: --status counts the recorded runs
    and helpers (it printed 0 done while 15 runs were recorded)."""
    import json

    from seed_results import SeedResults
    from srcl_helpers import main, write_records
    from srcl_helpers_design import ARMS, CONTROL, PLAIN

    r = SeedResults(tmp_path / "a.json")
    r.add(PLAIN, 0, {"img_r_precision": 22.0})
    r.add(CONTROL, 0, {"img_r_precision": 22.5})
    r.add(PLAIN, 13, {"img_r_precision": 21.0})
    write_records(r, tmp_path / "rec")
    own = tmp_path / "rec" / "helpers" / "x64_steps6400_seed0" / "eval" / "metrics.json"
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps({"img_r_precision": 36.0}))
    assert main(["--out", str(tmp_path / "out"), "--record", str(tmp_path / "rec"), "--status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "primary: 3/200 runs done (2/120 of the interim look's 12 seeds)"
    assert lines[1] == "helpers trained and evaluated: 1/80"
    assert lines[2] == "seeds with every arm: none"
    assert lines[3].startswith("seed 0 lacks 8 arms: SRCL alone, helper x1; ")  # what a session plans by
    assert lines[4] == "seed 13 lacks 9 arms: " + "; ".join(ARMS[1:])
    assert not (tmp_path / "out").exists()  # --status writes nothing


def _data(gains: dict[str, list[float]], base: float = 22.0) -> dict:
    n = len(next(iter(gains.values())))
    data = {"plain ITC": {str(s): {"img_r_precision": base + 0.1 * s} for s in range(n)}}
    for arm, g in gains.items():
        data[arm] = {str(s): {"img_r_precision": base + 0.1 * s + x} for s, x in enumerate(g)}
    return data


def test_the_primary_reading_holm_slope_and_interim():
    from srcl_helpers_design import CONTROL, GRADES, alone, annealed
    from srcl_helpers_report import primary_reading

    noise = [0.05, -0.05, 0.1, -0.1, 0.0, 0.02, -0.02, 0.04, -0.04, 0.03, -0.03, 0.01]
    gains = {CONTROL: [0.5 + e for e in noise]}
    for k, g in enumerate(GRADES):  # alone: +0.1 per doubling (x = 0, 2, 4, 6); annealed: only x64 helps
        gains[alone(g)] = [0.2 * k + e for e in noise]
        gains[annealed(g)] = [(0.6 if g == 64 else 0.0) + e * (k + 1) for e in noise]
    r = primary_reading(_data(gains), list(range(12)))
    assert r["seeds"] == 12 and r["final"] is False and r["look"] == "interim"
    assert r["q2"]["mean"] == pytest.approx(0.1) and r["q2"]["reading"] == "supported"  # p < 0.001 at the interim
    assert r["q1"][64]["reading"] == "supported" and r["q1"][1]["reading"] == "inconclusive so far (interim)"
    assert r["control"]["reading"] == "supported"
    import statistics

    q = r["q1"][64]  # the 95% CI: mean +- t(0.975, 11 dof) = 2.2010 x std / sqrt(12)
    half = 2.2010 * statistics.stdev([0.6 + 4 * e for e in noise]) / 12**0.5
    assert (q["ci_low"], q["ci_high"]) == (
        pytest.approx(q["mean"] - half, abs=1e-3),
        pytest.approx(q["mean"] + half, abs=1e-3),
    )


def _strong_gains(n: int) -> dict[str, list[float]]:
    """Every arm with a gain far beyond its noise: each primary test has p < 0.001 at 4 seeds."""
    from srcl_helpers_design import ARMS, PLAIN

    noise = [0.01, -0.01, 0.02, -0.02] * 5
    return {arm: [1.0 + e for e in noise[:n]] for arm in ARMS if arm != PLAIN}


def test_no_primary_test_is_read_before_the_interim_looks_seeds_have_every_arm():
    """The pre-registration reads the primary tests at 12 seeds (p < 0.001) and at 20; the report read
    "supported" at any seed count whose p fell below 0.001 (4 seeds with every arm were enough)."""
    from srcl_helpers_report import primary_reading, primary_tables

    r = primary_reading(_data(_strong_gains(4)), list(range(20)))
    assert r["look"] == "none" and r["seeds"] == 4 and r["final"] is False
    assert r["q1"][64]["p"] < 0.001 and r["q1"][64]["reading"] == "not read (no look yet)"
    assert r["q2"]["reading"] == "not read (no look yet)" and r["control"]["reading"] == "not read (no look yet)"
    assert "no look yet: 4 of the interim look's 12 seeds have every arm" in primary_tables(r)


def test_the_interim_look_reads_its_twelve_seeds_only_until_all_twenty_have_every_arm():
    from srcl_helpers_design import annealed
    from srcl_helpers_report import primary_reading

    data = _data(_strong_gains(15))
    r = primary_reading(data, list(range(20)))
    assert r["look"] == "interim" and r["seeds"] == 12 and r["q1"][64]["n"] == 12
    assert r["q1"][64]["reading"] == "supported"
    del data[annealed(4)]["3"]  # one of the interim seeds lacks an arm: no look
    assert primary_reading(data, list(range(20)))["look"] == "none"
    final = primary_reading(_data(_strong_gains(20)), list(range(20)))
    assert final["look"] == "final" and final["final"] is True and final["q1"][1]["n"] == 20


def test_the_secondary_says_whether_a_measure_predicts_only_at_twenty_seeds(tmp_path):
    """The secondary is pre-registered on 4 grades x 20 seeds; the report said "predicts: yes" at 4."""
    import json

    from srcl_helpers_design import GRADES, annealed
    from srcl_helpers_report import secondary_table

    gains = {annealed(g): [0.3 * i + 0.01 * s for s in range(4)] for i, g in enumerate(GRADES)}
    for i, g in enumerate(GRADES):
        for s in range(4):
            path = tmp_path / "calibration" / f"helper_x{g}_seed{s}" / "helper_diagnostics.json"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps({"quality": {"same_image_auc": 0.7 + 0.03 * i + 0.001 * s}}))
    row = [r for r in secondary_table(tmp_path, _data(gains), range(4), final=False).splitlines()
           if r.startswith("| same-image AUC | annealed")]  # fmt: skip
    assert row and row[0].endswith("| not read (at 20 seeds) |") and "+1.00" in row[0]
    final = secondary_table(tmp_path, _data(gains), range(4), final=True)
    assert "| same-image AUC | annealed | 16 | +1.00" in final and "not read" not in final.split("alone")[0]
    # the gate's line only at the final look: gain = 10 x AUC - 7 exactly, so 0 at 0.7, rising
    assert "The gate" not in secondary_table(tmp_path, _data(gains), range(4), final=False)
    assert final.endswith(
        "The gate: same-image AUC, the best measure that predicts the annealed arms' gain; the least-squares line "
        "gain = -7.000 +10 x measure crosses 0 at 0.7 (go at or above it); the points span 0.7 to 0.793."
    )
    from srcl_helpers_report import plot_gate

    plot = plot_gate(tmp_path, _data(gains), range(4), tmp_path / "gate.png")
    assert plot == tmp_path / "gate.png" and plot.stat().st_size > 1000


def test_the_gate_line_crosses_zero_where_the_fit_does_and_is_none_where_nothing_predicts(tmp_path):
    import json
    import random

    from srcl_helpers_design import GRADES, annealed
    from srcl_helpers_report import gate_line, gate_sentence, plot_gate, the_gate

    falling = gate_line([(g, s, float(i) + s, 1.0 - 0.5 * (i + s)) for i, g in enumerate(GRADES) for s in range(3)])
    assert falling["threshold"] == pytest.approx(2.0) and not falling["rising"] and falling["span"] == (0.0, 5.0)
    assert "(go at or below it)" in gate_sentence(("N_eff", falling))
    rng = random.Random(1)
    gains = {annealed(g): [rng.gauss(0, 1) for _ in range(6)] for g in GRADES}
    for g in GRADES:
        for s in range(6):
            path = tmp_path / "calibration" / f"helper_x{g}_seed{s}" / "helper_diagnostics.json"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps({"quality": {"same_image_auc": rng.random()}}))
    assert the_gate(tmp_path, _data(gains), range(6)) is None
    assert (
        plot_gate(tmp_path, _data(gains), range(6), tmp_path / "gate.png") is None
        and not (tmp_path / "gate.png").exists()
    )
    assert gate_sentence(None) == "The gate: no measure predicts the annealed arms' gain; `PREDICTOR` stays None."


def test_the_shipped_gate_is_the_final_looks_reading_of_the_recorded_runs():
    """PREDICTOR (vlp/lab/helper_student.py) is what the_gate reads from results/srcl_helpers, at the
    experiment's settings: its measure and path, threshold and span (to 2 decimals), direction."""
    import json

    from srcl_helpers_design import ARMS
    from srcl_helpers_report import MEASURES, the_gate

    from vlp.lab.helper_student import PREDICTOR

    record = Path(__file__).resolve().parents[1] / "results" / "srcl_helpers"
    data: dict = {}
    for r in json.loads((record / "results_primary.json").read_text()):
        data.setdefault(r["arm"], {})[str(r["seed"])] = r
    assert all(len(data[arm]) == 20 for arm in ARMS)
    gate = the_gate(record, data, range(20))
    assert gate is not None and PREDICTOR is not None
    measure, line = gate
    assert MEASURES[measure] == PREDICTOR.path and PREDICTOR.measure == measure.replace("δ", "delta")
    assert (PREDICTOR.threshold, PREDICTOR.rising) == (round(line["threshold"], 2), line["rising"])
    assert PREDICTOR.span == tuple(round(v, 2) for v in line["span"])
    report = json.loads((record / "calibration" / "helper_x1_seed0" / "helper_diagnostics.json").read_text())
    for keys, want in PREDICTOR.conditions:  # the experiment's own reports meet every condition
        got = report
        for k in keys:
            got = got[k]
        assert got == want, keys


def test_the_secondary_ranks_a_measure_that_tracks_the_gain_and_not_one_that_does_not():
    import random

    from srcl_helpers_report import logo_r2, rank_measure, spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 2, 3], [3, 2, 2, 1]) == pytest.approx(-1.0)
    rng = random.Random(0)
    grades = (1, 4, 16, 64)
    good = [(g, s, i + rng.gauss(0, 0.1), 0.3 * i + rng.gauss(0, 0.1)) for i, g in enumerate(grades) for s in range(12)]
    bad = [(g, s, rng.gauss(0, 1), gain) for g, s, _, gain in good]
    r_good, r_bad = rank_measure(good, n_boot=300), rank_measure(bad, n_boot=300)
    assert r_good["predicts"] and r_good["spearman"] > 0.8 and r_good["r2_logo"] > 0.5
    assert not r_bad["predicts"] and r_bad["r2_logo"] < 0.1
    # a perfectly linear measure is predicted exactly, leaving any grade out
    assert logo_r2([(g, 0, float(i), 2.0 * i + 1.0) for i, g in enumerate(grades)]) == pytest.approx(1.0)


def test_only_the_annealed_arms_anneal_alpha_h(monkeypatch):
    import srcl_calibration
    from srcl_helpers import HelperExperiment
    from srcl_helpers_design import CONTROL, alone, annealed

    monkeypatch.setattr(srcl_calibration.Experiment, "overrides", lambda self, arm, seed: [f"of {arm}"])
    exp = object.__new__(HelperExperiment)
    assert exp.overrides(annealed(4), 0) == [f"of {annealed(4)}", "loss.srcl.alpha_h_end=0.0"]
    assert exp.overrides(alone(4), 0) == [f"of {alone(4)}"] and exp.overrides(CONTROL, 0) == [f"of {CONTROL}"]


def test_the_experiment_runs_end_to_end_on_a_small_world(tmp_path):
    """One seed, tiny sizes, plain ITC, the oracle control and the annealed arm of the x1 helper: world,
    pool, warm-up, the helper (its own seed and evaluation), caches, both calibrations with the measures
    against the student, the arms, the record list and the report. The 2-step helper is random, so its
    no-GT calibration finds no delta: the arm is recorded as such, not trained (as pre-registered)."""
    import json

    from srcl_helpers import main
    from srcl_helpers_design import CONTROL

    rec = tmp_path / "rec"
    args = ["--out", str(tmp_path / "out"), "--record", str(rec), "--seeds", "0", "--images", "64",
            "--test-images", "16", "--steps", "2", "--warmup-steps", "2", "--helper-base-steps", "2",
            "--batch-size", "8", "--precision", "fp32"]  # fmt: skip
    assert main([*args, "--arms", "plain ITC", CONTROL, "SRCL annealed, helper x1"]) == 0
    listed = {r["arm"]: r for r in json.loads((rec / "results_primary.json").read_text())}
    assert set(listed) == {"plain ITC", CONTROL, "SRCL annealed, helper x1"}
    assert not (rec / "seed_results_primary.json").exists()
    assert listed["plain ITC"]["t2i_r_precision"] > 0 and listed[CONTROL]["t2i_r_precision"] > 0
    assert listed["SRCL annealed, helper x1"] == {
        "arm": "SRCL annealed, helper x1", "seed": 0, "t2i_r_precision": None, "no_delta": 1.0}  # fmt: skip
    cal = json.loads((rec / "calibration" / "helper_x1_seed0" / "helper_diagnostics.json").read_text())
    assert cal["refused"] and set(cal["against_student"]) >= {"hard_same_image_auc", "rank_agreement", "pair_r1_gap"}
    helper_cfg = (tmp_path / "out" / "helpers" / "x1_steps2_seed0" / "config.yaml").read_text()
    assert "seed: 1000" in helper_cfg
    control_cfg = (tmp_path / "out" / "primary" / "srcl_alone__oracle_auc_0_75_seed0" / "config.yaml").read_text()
    assert "alpha_h_end: 1.0" in control_cfg
    assert main([*args, "--report"]) == 0
    report = (rec / "report_primary.md").read_text()
    assert f"control: {CONTROL} − plain ITC | 1 |" in report


def test_a_run_whose_design_differs_from_the_recorded_runs_is_refused(tmp_path):
    """The records of one experiment come from one design: a run asking another precision (bf16 records
    were once about to be paired with fp32 arms) or another helper scale, batch or step count than the
    record's ``design.json`` is refused before it trains anything, naming the file and the key; a run
    with the same design goes on, and a first run writes the design."""
    import json

    from srcl_helpers import main

    rec, out = tmp_path / "rec", tmp_path / "out"
    base = ["--out", str(out), "--record", str(rec), "--seeds", "0", "--images", "64", "--test-images", "16",
            "--steps", "2", "--warmup-steps", "2", "--helper-base-steps", "2", "--batch-size", "8"]  # fmt: skip
    assert main([*base, "--precision", "fp32", "--status"]) == 0  # --status only reads: writes no design
    assert not (rec / "design.json").exists()
    assert main([*base, "--precision", "fp32", "--arms", "plain ITC"]) == 0
    design = json.loads((rec / "design.json").read_text())
    assert design["precision"] == "fp32" and design["helper_base_steps"] == 2 and design["batch_size"] == 8
    before = sorted(out.rglob("*"))
    for change, key in (
        (["--precision", "bf16"], "precision"),
        (["--precision", "fp32", "--batch-size", "4"], "batch_size"),
    ):
        with pytest.raises(SystemExit, match=rf"design\.json.*{key}"):
            main([*base, *change, "--arms", "plain ITC"])
    assert sorted(out.rglob("*")) == before  # refused before anything was written
    assert main([*base, "--precision", "fp32", "--arms", "plain ITC"]) == 0  # the same design: nothing to redo


def test_an_arms_steps_left_count_the_warm_up_and_helper_not_yet_trained(tmp_path, monkeypatch):
    """What ``--hours`` weighs: an arm's own steps, plus its seed's warm-up and its grade's helper where
    their last checkpoints fall short (a helper of a finished session is gone: trained again)."""
    from types import SimpleNamespace

    import srcl_helpers
    from srcl_helpers import HelperExperiment
    from srcl_helpers_design import CONTROL, PLAIN, alone, annealed

    done = {"warmup_seed0": 200, "x64_steps6400_seed0": 4000, "x16_steps3200_seed0": 3200}
    monkeypatch.setattr(srcl_helpers, "steps_done", lambda run: done.get(run.name, 0))
    exp = object.__new__(HelperExperiment)
    exp.out, exp.a = tmp_path, SimpleNamespace(steps=300, warmup_steps=200, helper_base_steps=800)
    assert exp.steps_left(PLAIN, 0) == exp.steps_left(CONTROL, 0) == 300
    assert exp.steps_left(alone(64), 0) == exp.steps_left(annealed(64), 0) == 300 + 2400
    assert exp.steps_left(alone(16), 0) == 300
    assert exp.steps_left(alone(4), 0) == 300 + 1600
    assert exp.steps_left(alone(4), 1) == 300 + 200 + 1600  # seed 1: no warm-up yet either


def test_with_hours_an_arm_that_would_not_finish_is_skipped_and_said(tmp_path, capsys):
    """``--hours``: the seed's warm-up is trained (every arm needs it, and it times a step), then an arm
    expected to end after the budget is not started; nothing is recorded for it and the run says so."""
    import json

    from srcl_helpers import main

    rec = tmp_path / "rec"
    args = ["--out", str(tmp_path / "out"), "--record", str(rec), "--seeds", "0", "--images", "64",
            "--test-images", "16", "--steps", "2", "--warmup-steps", "2", "--helper-base-steps", "2",
            "--batch-size", "8", "--precision", "fp32", "--arms", "plain ITC"]  # fmt: skip
    assert main([*args, "--hours", "1e-6"]) == 0
    out = capsys.readouterr().out
    assert "skipped plain ITC, seed 0: 2 steps" in out and "1 (arm, seed) left for a later run" in out
    assert (tmp_path / "out" / "warmup_seed0" / "metrics.jsonl").exists()
    assert not (rec / "results_primary.json").exists() or json.loads((rec / "results_primary.json").read_text()) == []
    assert main([*args, "--hours", "1", "--arm-overhead-minutes", "1"]) == 0
    assert [r["arm"] for r in json.loads((rec / "results_primary.json").read_text())] == ["plain ITC"]
