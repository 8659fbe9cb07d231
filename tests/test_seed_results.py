"""Seed summaries of the experiment scripts: mean ± std, paired differences, the Markdown table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "experiments"))  # the experiments' helpers

from seed_results import (  # noqa: E402
    SeedResults,
    markdown_table,
    paired_differences,
    paired_t_test,
    student_t_two_sided,
    summarise,
)

RESULTS = {
    "plain": {"0": {"r": 20.0, "n": 60.0}, "1": {"r": 22.0, "n": 62.0}, "2": {"r": 24.0, "n": 61.0}},
    "arm": {"0": {"r": 21.0, "n": 61.0}, "1": {"r": 23.5, "n": 61.0}, "2": {"r": 25.0}},
    "late": {"1": {"r": 30.0, "n": 70.0}},
}


def test_summarise_is_mean_and_sample_std_over_present_seeds():
    s = summarise(RESULTS, [0, 1, 2], ["r", "n"])
    assert s["plain"]["r"] == pytest.approx((22.0, 2.0, 3))
    assert s["arm"]["n"] == pytest.approx((61.0, 0.0, 2))  # seed 2 has no "n"
    assert s["late"]["r"] == (30.0, 0.0, 1)


def test_paired_differences_subtract_the_baseline_seed_by_seed():
    d = paired_differences(RESULTS, [0, 1, 2], ["r", "n"], baseline="plain")
    assert set(d) == {"arm", "late"}
    # r: 1.0, 1.5, 1.0 -> mean 7/6, sample std sqrt(((1-7/6)^2*2 + (1.5-7/6)^2)/2) = 0.2887
    assert d["arm"]["r"] == pytest.approx((7 / 6, 0.288675, 3), abs=1e-6)
    assert d["arm"]["n"] == pytest.approx((0.0, 1.414214, 2), abs=1e-6)  # +1, -1 over seeds 0, 1
    assert d["late"]["r"] == (8.0, 0.0, 1)
    # the arms' own spread (about 2) hides what the pairing shows (about 0.3)
    assert summarise(RESULTS, [0, 1, 2], ["r"])["arm"]["r"][1] > 6 * d["arm"]["r"][1]


def test_markdown_table_rows_and_missing_metrics():
    table = markdown_table(summarise(RESULTS, [0, 1], ["r", "x"]), ["r", "x"])
    lines = table.splitlines()
    assert lines[0] == "| variant | seeds | r | x |"
    assert lines[2] == "| plain | 2 | 21.00 ± 1.41 | - |"
    assert lines[4] == "| late | 1 | 30.00 ± 0.00 | - |"


def test_seed_results_writers_side_by_side_keep_each_others_records(tmp_path):
    """Two shards of one experiment record into the same file: neither overwrites the other."""
    path = tmp_path / "results.json"
    a, b = SeedResults(path), SeedResults(path)  # both opened before either wrote
    a.add("plain", 0, {"r1": 1.0})
    b.add("plain", 1, {"r1": 2.0})
    a.add("srcl", 0, {"r1": 3.0})
    on_disk = SeedResults(path)
    assert on_disk.data == {"plain": {"0": {"r1": 1.0}, "1": {"r1": 2.0}}, "srcl": {"0": {"r1": 3.0}}}
    assert a.has("plain", 1)  # a learnt b's record when it merged
    # a newer record of the same (variant, seed) replaces the file's
    b.add("plain", 0, {"r1": 9.0})
    assert SeedResults(path).data["plain"]["0"] == {"r1": 9.0}


@pytest.mark.parametrize(
    ("t", "dof", "p"),
    [
        (1.0, 1, 0.5),  # Cauchy: P(|T| >= 1) = 1/2
        (3.0, 2, 1 - 3 / (11**0.5)),  # dof 2: P(|T| >= t) = 1 - t / sqrt(t^2 + 2)
        (2.776445, 4, 0.05),  # the tables' critical values
        (4.604095, 4, 0.01),
        (8.610302, 4, 0.001),
        (0.0, 4, 1.0),
    ],
)
def test_student_t_two_sided_matches_closed_forms_and_tables(t, dof, p):
    assert student_t_two_sided(t, dof) == pytest.approx(p, abs=2e-6)
    assert student_t_two_sided(-t, dof) == pytest.approx(p, abs=2e-6)


def test_paired_t_test_by_hand():
    d = [1.0, 2.0, 3.0, 2.0, 2.0]  # mean 2, sample std sqrt(0.5), n 5 -> t = 2 / (sqrt(0.5) / sqrt(5))
    t, p = paired_t_test(d)
    assert t == pytest.approx(2 / (0.5**0.5 / 5**0.5))
    assert p == pytest.approx(student_t_two_sided(t, 4))
    assert 0.001 < p < 0.005  # t = 6.32 with 4 dof
    assert paired_t_test([1.0]) != paired_t_test([1.0])  # NaN for one seed
    assert paired_t_test([0.5, 0.5, 0.5]) == (float("inf"), 0.0)
