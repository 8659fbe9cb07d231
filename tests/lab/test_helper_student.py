"""``vlp analyze helper --student``: the helper measured against the student (vlp.lab.helper_student).

Each measure is checked on small rows whose answer is counted by hand (in the comments), chosen so
that the plausible wrong versions (the helper's hardest negatives instead of the student's, a
softmax over the negatives alone, same-image columns left out of the rank correlation, a tie
counted as an R@1 hit) give another number; then the whole command on a tiny shapes world.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.helpers import NO_TASKS, QUICK, TINY_ALBEF, dual_checkpoint, untrained_checkpoint
from vlp.cli import main
from vlp.data.formats import load_pairs
from vlp.errors import ConfigError, DataError
from vlp.features.helper_cache import HelperCache, cache_rows, write_cache
from vlp.lab.calibration import CalibrationRows, calibration_rows, same_image_auc
from vlp.lab.helper_student import (
    NO_PREDICTOR,
    STUDENT_CACHE,
    Predictor,
    advice,
    cache_temperature,
    check_aligned,
    checkpoint_temperature,
    hardest,
    pair_r1,
    pairwise_auc,
    spearman_rows,
    student_measures,
)
from vlp.weights import find_checkpoint

NAN = float("nan")
WORLD = dict(seed=2, n_train=16, n_val=2, n_test=2, image_size=32, **NO_TASKS)
PRETRAIN = ["train.steps=2", *TINY_ALBEF, *QUICK]
KEYS = {
    "hard_same_image_auc",
    "student_weighted_same_image_auc",
    "student_same_image_auc",
    "rank_agreement",
    "helper_pair_r1",
    "student_pair_r1",
    "pair_r1_gap",
    "k",
    "student_temperature",
    "rows",
    "batches",
}


def rows(sim, probes=None, same_image=None, positives=None) -> CalibrationRows:
    """Rows of similarities ``sim`` [R, C] whose column 0 is the positive (unless ``positives``)."""
    sim = torch.tensor(sim, dtype=torch.float32)
    if positives is None:
        positives = torch.zeros_like(sim, dtype=torch.bool)
        positives[:, 0] = True
    same = torch.zeros_like(positives) if same_image is None else torch.tensor(same_image)
    probes = torch.full((len(sim), 1), NAN) if probes is None else torch.tensor(probes, dtype=torch.float32)
    return CalibrationRows(sim, positives, same, probes, torch.zeros(len(sim), dtype=torch.long))


def test_pairwise_auc_weighs_each_pair_by_its_column():
    probes = torch.tensor([[0.4, 0.3, NAN], [NAN, NAN, NAN]])
    scores = torch.tensor([[0.1, 0.3, 0.5], [0.0, 0.0, 0.0]])
    weights = torch.tensor([[1.0, 2.0, 0.0], [1.0, 1.0, 1.0]])
    # probe 0.4 beats 0.1 (weight 1) and 0.3 (2); probe 0.3 beats 0.1 (1) and ties 0.3 (2 x 1/2); column 2 has weight 0
    # row 1 has no probe: group 1 has no pair
    for budget in (1, 2**24):  # one row at a time, or all at once
        won, pairs = pairwise_auc(probes, scores, weights, torch.tensor([0, 1]), 2, budget=budget)
        assert won.tolist() == [5.0, 0.0] and pairs.tolist() == [6.0, 0.0]
    won, pairs = pairwise_auc(probes, scores, weights.bool())  # a mask: every pair counts 1, column 2 not at all
    assert (won.item(), pairs.item()) == (3.5, 4.0)


def test_pairwise_auc_with_a_mask_is_the_plain_count():
    probes = torch.tensor([[0.4, 0.3, NAN]])
    scores = torch.tensor([[0.1, 0.3, 0.5]])
    won, pairs = pairwise_auc(probes, scores, torch.tensor([[True, True, True]]))
    # 0.4: beats 0.1, 0.3; 0.3: beats 0.1, ties 0.3: 3.5 of 6 pairs
    assert (won.item(), pairs.item()) == (3.5, 6.0)


#: one row: the positive, five other negatives n1..n5 and a same-image negative (the last column)
HELPER_ROW = [0.9, 0.1, 0.5, 0.3, 0.7, 0.2, 0.99]
STUDENT_ROW = [0.8, 0.9, 0.1, 0.8, 0.2, 0.3, 0.95]
SAME = [[False] * 6 + [True]]


def test_hard_same_image_auc_by_hand():
    """The student's two hardest other negatives are n1 (0.9) and n3 (0.8), the same-image column
    (0.95) and the positive not being others; the helper has them at 0.1 and 0.3. Probe 0.3 beats
    0.1 and ties 0.3, probe 0.6 beats both: 3.5 of 4. (The helper's own hardest, n4 0.7 and n2 0.5,
    would give 1 of 4; the same-image column taken in, 2 of 4.) All five others: 0.3 beats 0.1
    and 0.2 and ties 0.3 (2.5), 0.6 beats four (4): 6.5 of 10."""
    h = rows([HELPER_ROW], probes=[[0.3, 0.6]], same_image=SAME)
    s = rows([STUDENT_ROW], probes=[[0.5, 0.5]], same_image=SAME)
    assert student_measures(h, s, 1.0, k=2)["hard_same_image_auc"] == 3.5 / 4
    assert student_measures(h, s, 1.0, k=10)["hard_same_image_auc"] == 6.5 / 10  # fewer than k: all of them
    assert same_image_auc(h, 1)[0] == 6.5 / 10


def test_hardest_breaks_ties_at_the_kth_place_by_column():
    student = torch.tensor([[0.5, 0.9, 0.9, 0.1, 0.95]])
    candidates = torch.tensor([[False, True, True, True, False]])
    assert hardest(student, candidates, 1).tolist() == [[False, True, False, False, False]]
    assert hardest(student, candidates, 2).tolist() == [[False, True, True, False, False]]
    assert hardest(student, candidates, 5, budget=1).tolist() == candidates.tolist()


def test_student_weighted_same_image_auc_by_hand():
    """One row, student [0, 1, 0] at temperature 1: the negatives weigh e / (e + 2) and 1 / (e + 2);
    probe 0.3 beats only the light one (helper 0.1): AUC 1 / (e + 1), against 1/2 unweighted."""
    h = rows([[0.9, 0.5, 0.1]], probes=[[0.3]])
    s = rows([[0.0, 1.0, 0.0]], probes=[[0.0]])
    assert student_measures(h, s, 1.0)["student_weighted_same_image_auc"] == pytest.approx(1 / (math.e + 1))


def test_the_softmax_is_over_the_whole_row_and_pooled_over_rows():
    """Two rows with the same helper [0.9, 0.5, 0.1]: row A's student is sure of its positive
    ([1, 0, 0]: each negative weighs 1 / (e^(1/T) + 2)), row B's is not ([0, 0, 0]: 1/3). A's probe
    (0.3) wins 1 of 2 pairs, B's (0.6) 2 of 2. Pooled: (w_A + 2 w_B) / (2 w_A + 2 w_B). A softmax
    over the negatives alone weighs both rows alike: 3/4, the unweighted AUC."""
    h = rows([[0.9, 0.5, 0.1]] * 2, probes=[[0.3], [0.6]])
    s = rows([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], probes=[[0.0], [0.0]])
    for t in (1.0, 0.5):
        wa, wb = 1 / (math.exp(1 / t) + 2), 1 / 3
        got = student_measures(h, s, t)["student_weighted_same_image_auc"]
        assert got == pytest.approx((wa + 2 * wb) / (2 * wa + 2 * wb)) and abs(got - 0.75) > 0.04


def test_rank_agreement_by_hand():
    """Row 0: negatives helper [1, 2, 2, 3], student [1, 2, 3, 4] (the last a same-image column):
    ranks [1, 2.5, 2.5, 4] and [1, 2, 3, 4], Spearman 4.5 / sqrt(4.5 * 5) (without the same-image
    column it would be 1.5 / sqrt(3); the positive, helper lowest and student highest, is not
    ranked). Row 1: the helper reverses the student: -1. Row 2: a constant helper has no
    correlation and is left out of the mean."""
    same = [[False, False, False, False, True], [False] * 5, [False] * 5]
    h = rows([[0.0, 1, 2, 2, 3], [9.0, 4, 3, 2, 1], [0.5, 0.2, 0.2, 0.2, 0.2]], same_image=same)
    s = rows([[10.0, 1, 2, 3, 4], [0.0, 1, 2, 3, 4], [0.5, 0.1, 0.2, 0.3, 0.4]], same_image=same)
    rho = 4.5 / math.sqrt(4.5 * 5)
    per_row = spearman_rows(h.helper, s.helper, h.negatives, budget=5)
    assert per_row[:2].tolist() == pytest.approx([rho, -1.0]) and math.isnan(per_row[2])
    assert student_measures(h, s, 1.0)["rank_agreement"] == pytest.approx((rho - 1) / 2)


def test_a_helper_equal_to_the_student_agrees_with_it():
    gen = torch.Generator().manual_seed(0)
    sim = torch.rand(6, 9, generator=gen)
    probes = torch.rand(6, 2, generator=gen)
    probes[::2, 1] = NAN
    same = torch.zeros(6, 9, dtype=torch.bool)
    same[1, 4] = True
    h = rows(sim.tolist(), probes=probes.tolist(), same_image=same.tolist())
    m = student_measures(h, h, 0.07, k=3)
    assert m["rank_agreement"] == pytest.approx(1.0) and m["pair_r1_gap"] == 0.0
    assert m["helper_pair_r1"] == m["student_pair_r1"] == pair_r1(sim, h.positives)
    assert m["student_same_image_auc"] == same_image_auc(h, 1)[0]
    assert (m["k"], m["student_temperature"], m["rows"]) == (3, 0.07, 6)
    reversed_negatives = rows((-sim).tolist(), probes=probes.tolist(), same_image=same.tolist())
    reversed_negatives.helper[:, 0] = 5.0  # the positive's own value does not enter the ranking
    assert student_measures(reversed_negatives, h, 0.07)["rank_agreement"] == pytest.approx(-1.0)


def test_pair_r1_by_hand_a_tie_is_a_miss():
    h = rows([[0.9, 0.5, 0.1], [0.5, 0.5, 0.1], [0.2, 0.4, 0.1], [0.3, 0.2, 0.1]])
    s = rows([[0.9, 0.5, 0.1], [0.6, 0.5, 0.1], [0.5, 0.4, 0.1], [0.3, 0.2, 0.1]])
    m = student_measures(h, s, 1.0)
    # helper: rows 0 and 3 hit, row 1 ties its best negative (a miss), row 2 loses: 2 of 4; the student hits all 4
    assert (m["helper_pair_r1"], m["student_pair_r1"], m["pair_r1_gap"]) == (0.5, 1.0, -0.5)
    several = torch.tensor([[True, True, False], [True, False, False]])  # the best of several positives counts
    assert pair_r1(torch.tensor([[0.1, 0.8, 0.5], [0.4, 0.3, 0.1]]), several) == 1.0


def test_rows_of_another_sampling_are_refused():
    h = rows([HELPER_ROW], probes=[[0.3, 0.6]], same_image=SAME)
    s = rows([STUDENT_ROW], probes=[[0.5, 0.5]])
    with pytest.raises(DataError, match=r"not the same pairs \(same_image differ"):
        student_measures(h, s, 1.0)
    with pytest.raises(DataError, match=r"positives, same_image, sources, probe slots differ"):
        check_aligned(h, rows([HELPER_ROW] * 2, probes=[[0.3, NAN]] * 2))
    with pytest.raises(ValueError, match="temperature must be a positive number"):
        student_measures(h, h, 0.0)


def _random_cache(folder: Path, data: Path, seed: int) -> HelperCache:
    """A cache of random unit features (seed ``seed``) of every image and caption of ``data``."""
    _, keys, texts = cache_rows(load_pairs([data]))
    gen = torch.Generator().manual_seed(seed)
    image = torch.nn.functional.normalize(torch.randn(len(keys), 8, generator=gen), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(len(texts), 8, generator=gen), dim=-1)
    return HelperCache.load(write_cache(folder, keys, image, texts, text, {"helper": f"random {seed}"}))


def test_two_caches_of_the_same_data_give_the_same_rows(tmp_path):
    """calibration_rows draws its batches from the seed alone: two caches of the same data (other
    features) give the same pairs, and another seed does not."""
    entries = [{"image": f"{i}.png", "image_id": i, "caption": [f"a {i}", f"b {i}", f"c {i}"]} for i in range(12)]
    data = tmp_path / "train.json"
    data.write_text(json.dumps(entries))
    helper, student = _random_cache(tmp_path / "h", data, 0), _random_cache(tmp_path / "s", data, 1)
    samples = load_pairs([data])
    h, s = calibration_rows(helper, samples, 4, 4, 3, 0), calibration_rows(student, samples, 4, 4, 3, 0)
    check_aligned(h, s)
    assert not torch.equal(h.helper, s.helper)
    m = student_measures(h, s, 0.1)
    assert m["rows"] == 2 * 3 * 4 and all(math.isfinite(v) for v in m.values())
    with pytest.raises(DataError, match="not the same pairs"):
        check_aligned(h, calibration_rows(student, samples, 4, 4, 3, 1))
    with pytest.raises(ConfigError, match="give --student-temperature"):
        cache_temperature(student)  # written from no checkpoint


def test_the_temperature_is_the_checkpoints(tmp_path):
    """A learned temperature from model.safetensors ('temp'), a fixed loss.contrastive.tau from the config."""
    learned = untrained_checkpoint(tmp_path / "albef", [*TINY_ALBEF, "model.temp=0.123"])
    assert checkpoint_temperature(learned) == pytest.approx(0.123)
    fixed = untrained_checkpoint(tmp_path / "fixed", [*TINY_ALBEF, "loss.contrastive.tau=0.2"])
    assert checkpoint_temperature(fixed) == 0.2
    assert checkpoint_temperature(dual_checkpoint(tmp_path / "dual")) == 0.05  # the dual encoder has no learned one


def test_analyze_helper_against_a_student_run(world, pretrained, tmp_path, capsys):
    """``vlp analyze helper --student RUN`` on a shapes world: the student's features cached in
    OUT/student_cache (and reused), its learned temperature read from the run's checkpoint, every
    measure finite; the student measured against itself agrees with itself; refused with --world."""
    data = str(world["pretrain"])
    helper = _random_cache(tmp_path / "helper", world["pretrain"], 0).path
    out = tmp_path / "a"
    sampling = ["--batch-size", "8", "--queue", "16", "--batches", "2"]  # rows of 8 + 16 columns
    argv = ["analyze", "helper", "--cache", str(helper), "--data", data, *sampling]
    assert main([*argv, "--out", str(out), "--student", str(pretrained), "--force"]) == 0
    printed = capsys.readouterr().out
    assert "against the student (temperature" in printed and "rank agreement with the student" in printed
    report = json.loads((out / "helper_diagnostics.json").read_text())
    got = report["against_student"]
    # the gate's line: rows of 8 + 16 columns are not the experiment's 63 negatives, so neither go nor stop
    assert f"  {report['advice']}\n" in printed and report["advice"].startswith("no go or stop: N_eff at the no-GT")
    assert report["advice"].endswith("was measured with at_delta.negatives_per_row 63.0; this report has 23.0")
    ckpt = find_checkpoint(pretrained)
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        temp = float(f.get_tensor("temp"))
    assert KEYS <= set(got) and all(isinstance(got[k], (int, float)) and math.isfinite(got[k]) for k in KEYS)
    assert got["student_temperature"] == pytest.approx(temp) and got["temperature_from"] == "checkpoint"
    assert (got["k"], got["rows"], got["batches"]) == (10, 2 * 2 * 8, 2)
    assert got["student_checkpoint"] == str(ckpt.resolve()) and got["student_cache"] == str(out / STUDENT_CACHE)
    assert got["pair_r1_gap"] == pytest.approx(got["helper_pair_r1"] - got["student_pair_r1"])
    features = out / STUDENT_CACHE / "features.safetensors"
    written = features.stat().st_mtime_ns
    assert main([*argv, "--out", str(out), "--student", str(pretrained), "--force"]) == 0  # the cache reused
    assert features.stat().st_mtime_ns == written
    assert json.loads((out / "helper_diagnostics.json").read_text())["against_student"] == got

    # the student against itself, from its cache, at a temperature given (mean norm: no delta search to fail)
    cache = str(out / STUDENT_CACHE)
    argv = ["analyze", "helper", "--cache", cache, "--data", data, *sampling, "--mode", "mean", "--force"]
    assert main([*argv, "--out", str(tmp_path / "b"), "--student-cache", cache, "--student-temperature", "0.5"]) == 0
    rep = json.loads((tmp_path / "b" / "helper_diagnostics.json").read_text())
    itself = rep["against_student"]
    assert itself["rank_agreement"] == pytest.approx(1.0) and itself["pair_r1_gap"] == 0.0
    assert itself["student_same_image_auc"] == rep["quality"]["same_image_auc"] == got["student_same_image_auc"]
    assert (itself["student_temperature"], itself["temperature_from"]) == (0.5, "given")


def test_analyze_helper_student_options_are_refused_where_they_do_not_apply(world, tmp_path, capsys):
    data, helper = str(world["pretrain"]), str(_random_cache(tmp_path / "helper", world["pretrain"], 0).path)
    argv = ["analyze", "helper", "--cache", helper, "--data", data, "--out", str(tmp_path / "o")]
    assert main([*argv, "--world", str(world["root"]), "--student", "run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--world: --student belong to the calibration without ground truth" in err[0]
    assert main([*argv, "--student-temperature", "0.1"]) == 2
    assert "--student-temperature needs --student or --student-cache" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one student, named once
        main([*argv, "--student", "run", "--student-cache", "cache"])
    assert "argument --student-cache: not allowed with argument --student" in capsys.readouterr().err
    # a student cache already in OUT from another checkpoint is not silently reused
    (tmp_path / "o").mkdir()
    _random_cache(tmp_path / "o" / STUDENT_CACHE, world["pretrain"], 1)
    assert main([*argv, "--student", str(dual_checkpoint(tmp_path / "dual"))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "student_cache holds features of random 1, not of the student" in err[0]


def test_the_advice_is_go_stop_or_neither_by_a_predictor_and_says_so_without_one():
    report = {
        "against_student": {"hard_same_image_auc": 0.71, "pair_r1_gap": -0.02},
        "at_delta": {"n_eff_mean": 30.5, "negatives_per_row": 63.0},
    }
    assert advice(report) == advice(report, None) == NO_PREDICTOR
    assert "no measure, same-image AUC included, is yet shown" in NO_PREDICTOR and "docs/methods.md" in NO_PREDICTOR
    shown = "the measure shown to predict SRCL's gain with a learned helper (docs/experiments.md, issue 51)"
    rising = Predictor(
        "hard AUC", ("against_student", "hard_same_image_auc"), 0.7, True, (0.5, 0.9), "docs/experiments.md, issue 51"
    )
    assert advice(report, rising) == f"go: hard AUC 0.71 >= 0.7, hard AUC, {shown}"
    assert advice(report, replace(rising, threshold=0.75)).startswith("stop: hard AUC 0.71 < 0.75, hard AUC, ")
    # a falling line: go at or below the threshold; a measure counted over a row's negatives needs rows of its size
    rows = ((("at_delta", "negatives_per_row"), 63.0),)
    falling = Predictor("N_eff", ("at_delta", "n_eff_mean"), 31.0, False, (20.0, 40.0), "src", conditions=rows)
    assert advice(report, falling).startswith("go: N_eff 30.5 <= 31, N_eff, the measure shown")
    assert advice(report, replace(falling, threshold=30.0)).startswith("stop: N_eff 30.5 > 30, ")
    other_rows = {**report, "at_delta": {"n_eff_mean": 30.5, "negatives_per_row": 127.0}}
    assert advice(other_rows, falling).endswith(
        "was measured with at_delta.negatives_per_row 63.0; this report has 127.0"
    )
    oracle = replace(falling, conditions=((("kind",), "learned"),))
    assert advice({**report, "kind": "oracle"}, oracle).endswith(
        "was measured with kind learned; this report has oracle"
    )
    # neither go nor stop outside the span measured, or without the measure
    assert advice(report, replace(falling, span=(31.0, 40.0))).startswith(
        "no go or stop: N_eff 30.5 lies outside what was measured (31 to 40); N_eff, the measure shown"
    )
    assert advice({"at_delta": report["at_delta"]}, rising).endswith(
        "is not in this report (against_student.hard_same_image_auc; give --student)"
    )
    assert advice({}, falling).endswith("is not in this report (at_delta.n_eff_mean)")


def test_the_cli_prints_the_gate_of_the_predictor_named(world, tmp_path, capsys, monkeypatch):
    """``vlp analyze helper`` prints and records the advice of whatever PREDICTOR names (read when it runs)."""
    from vlp.lab import helper_student

    data, helper = str(world["pretrain"]), str(_random_cache(tmp_path / "helper", world["pretrain"], 0).path)
    argv = ["analyze", "helper", "--cache", helper, "--data", data, "--batch-size", "8", "--batches", "2"]
    rule = Predictor("N_eff", ("at_delta", "n_eff_mean"), 1000.0, False, (0.0, 2000.0), "a test")
    monkeypatch.setattr(helper_student, "PREDICTOR", rule)
    assert main([*argv, "--out", str(tmp_path / "o"), "--force"]) == 0
    report = json.loads((tmp_path / "o" / "helper_diagnostics.json").read_text())
    n_eff = report["at_delta"]["n_eff_mean"]
    shown = "the measure shown to predict SRCL's gain with a learned helper (a test)"
    assert 0 < n_eff <= 7 and report["advice"] == f"go: N_eff {n_eff:.4g} <= 1000, N_eff, {shown}"  # 7 negatives a row
    assert f"  {report['advice']}\n" in capsys.readouterr().out
