"""SRCL's regulation watched for the whole run (issue 40 part 3): N_eff in the step statistics, the
band of the first log windows, one warning per excursion out of it."""

import math

import pytest
import torch

from tests.helpers import QUICK, TINY_ALBEF, pretrain
from vlp.config.loss import SRCLConfig
from vlp.lab.oracle import run_cache_oracle_features
from vlp.losses.srcl import effective_negatives, srcl_weights
from vlp.tasks.regulation import HelperFeatures, SRCLRegulator
from vlp.tasks.regulation_watch import BAND_LOGS, RegulationWatch, band_of
from vlp.train.logging import read_metrics

WORLD = dict(seed=0, n_train=40, n_val=4, n_test=8)


def test_effective_negatives_is_the_mean_over_rows_of_n_eff():
    """(sum w)^2 / sum w^2 over each row's negatives, pooled over both matrices; a row without
    negatives is left out; plain weights give every negative."""
    g = torch.Generator().manual_seed(0)
    pos = torch.zeros(4, 6, dtype=torch.bool)
    pos[0, 0] = pos[1, 1] = pos[1, 2] = True  # row 1: two positives
    pos[3] = True  # row 3: no negative
    w_a, w_b = (srcl_weights(torch.rand(4, 6, generator=g) + 0.5, pos, "softmax", 3.0) for _ in range(2))
    expect_n, expect_share = [], []
    for w in (w_a, w_b):
        for row, p in zip(w, pos):
            neg = row[~p].double()
            if neg.numel():
                n = float(neg.sum() ** 2 / (neg**2).sum())
                expect_n.append(n)
                expect_share.append(n / neg.numel())
    out = effective_negatives([w_a, w_b], pos)
    assert out["srcl_n_eff"].dtype == torch.float32 and out["srcl_n_eff"].dim() == 0
    assert float(out["srcl_n_eff"]) == pytest.approx(sum(expect_n) / len(expect_n), rel=1e-5)
    assert float(out["srcl_n_eff_share"]) == pytest.approx(sum(expect_share) / len(expect_share), rel=1e-5)
    assert max(expect_share) < 1.0  # not trivially plain
    plain = effective_negatives(torch.ones(4, 6), pos)
    assert float(plain["srcl_n_eff_share"]) == pytest.approx(1.0)
    assert float(plain["srcl_n_eff"]) == pytest.approx((5 + 4 + 6) / 3)  # row 2 has no positive
    assert math.isnan(float(effective_negatives(torch.ones(2, 2), torch.ones(2, 2, dtype=torch.bool))["srcl_n_eff"]))


def test_the_regulator_logs_n_eff_of_its_weights():
    reg = SRCLRegulator(SRCLConfig(delta=4.0), "srcl", 10, 0, helper_dim=6)
    g = torch.Generator().manual_seed(1)
    b = 5
    h = HelperFeatures(*torch.nn.functional.normalize(torch.randn(2, b, 6, generator=g), dim=-1))
    cos_live = torch.rand(b, b, generator=g) * 2 - 1
    pos = torch.eye(b, dtype=torch.bool)
    r = reg.regulate(cos_live, cos_live, pos, torch.zeros_like(pos), h, step=0)
    expect = effective_negatives([r.w_i2t, r.w_t2i], pos)
    assert float(r.stats["srcl_n_eff"]) == float(expect["srcl_n_eff"]) < b - 1
    assert float(r.stats["srcl_n_eff_share"]) == pytest.approx(float(r.stats["srcl_n_eff"]) / (b - 1))


def record(step, below_07=0.2, below_02=0.05, n_eff_share=0.8, alpha_h=1.0):
    return {
        "step": step,
        "srcl_alpha_h": alpha_h,
        "srcl_w_below_0_7": below_07,
        "srcl_w_below_0_2": below_02,
        "srcl_n_eff_share": n_eff_share,
    }


def watch() -> RegulationWatch:
    return RegulationWatch("loss.srcl.delta=3.2")


def test_low_regulation_at_the_start_warns_once():
    w = watch()
    msg = w.check(record(10, below_07=0.004, below_02=0.0))
    assert msg is not None and "0.40% of the ITC negatives" in msg and "loss.srcl.delta=3.2" in msg
    assert "hardly regulates" in msg and "vlp analyze helper" in msg
    assert w.check(record(20, below_07=0.004, below_02=0.0)) is None  # once
    assert w.check({"step": 30, "loss": 1.0}) is None  # no SRCL statistics in the record
    # nothing was strong enough to watch: no band warnings later either
    assert all(w.check(record(s, below_07=0.0, below_02=0.0, n_eff_share=1.0)) is None for s in range(40, 400, 10))


def test_regulation_that_fades_late_warns_once_per_excursion():
    """The band comes from the first windows; a window long after them that falls under half of it
    warns, once while it stays out, and again after it came back into the band and left again."""
    w = watch()
    for s in range(1, BAND_LOGS + 1):
        assert w.check(record(10 * s, below_07=0.2 + 0.01 * s, n_eff_share=0.8)) is None
    assert all(w.check(record(s, below_07=0.15, n_eff_share=0.84)) is None for s in range(40, 500, 10))  # in band
    faded = w.check(record(500, below_07=0.08, below_02=0.04, n_eff_share=0.95, alpha_h=0.3))
    assert faded is not None and "step 500 (alpha_h 0.30)" in faded and "faded" in faded
    assert "share below 0.7 8.0% (band 21.0-23.0%)" in faded
    assert "N_eff / negatives 95.0% (band 80.0-80.0%)" in faded
    assert "share below 0.2" not in faded  # 0.04 of a band of 0.05: inside
    assert "loss.srcl.delta=3.2" in faded and "\n" not in faded
    assert all(w.check(record(s, below_07=0.05, n_eff_share=0.97)) is None for s in range(510, 600, 10))
    assert w.check(record(600, below_07=0.13, n_eff_share=0.85)) is None  # out of the inner band still: not re-armed
    assert w.check(record(610, below_07=0.09, n_eff_share=0.92)) is None
    assert w.check(record(620, below_07=0.2, n_eff_share=0.8)) is None  # back in band: re-armed
    again = w.check(record(630, below_07=0.01, n_eff_share=0.99))
    assert again is not None and "step 630" in again


def test_regulation_that_sharpens_warns():
    w = watch()
    for s in range(1, BAND_LOGS + 1):
        w.check(record(10 * s))
    msg = w.check(record(200, below_07=0.5, below_02=0.3, n_eff_share=0.4))
    assert msg is not None and "sharpened" in msg and "share below 0.2 30.0% (band 5.0-5.0%)" in msg


def test_band_of_a_finished_run_is_the_watchs_band():
    rows = [{"step": 0, "loss": 1.0}] + [record(10 * s, below_07=0.1 * s) for s in range(1, 6)]
    band = band_of(rows)
    assert band.values("srcl_w_below_0_7") == pytest.approx((0.1, 0.3))
    assert band.values("srcl_n_eff_share") == pytest.approx((0.8, 0.8))


@pytest.fixture(scope="module")
def exact(world, tmp_path_factory):
    return run_cache_oracle_features(world["root"], [world["pretrain"]], tmp_path_factory.mktemp("c") / "exact")


@pytest.mark.parametrize("regulation", ["annealed", "helper all run", "none"])
def test_a_run_warns_when_its_regulation_fades_late_and_only_then(world, exact, tmp_path, capfd, regulation):
    """12 steps logged one by one, regulated by the exact oracle at delta 4 (false negatives near
    0.1 at alpha_h 1). Annealed to the live model (from scratch: flat similarities), the weights
    fade after the band windows and the loop warns once; with the helper all run (its share of
    negatives below 0.7 moves within 0.07-0.15 here) or without SRCL, it never warns."""
    srcl = ["loss.regulation=srcl", f"loss.srcl.helper_features={exact}", "loss.srcl.delta=4.0"]
    extra = {
        "annealed": [*srcl, "loss.srcl.alpha_h_end=0.0"],
        "helper all run": [*srcl, "loss.srcl.alpha_h_end=1.0"],
        "none": [],
    }[regulation]
    steps = ["train.steps=12", "train.log_every=1", "train.warmup_steps=1", "data.batch_size=16"]
    quick = [o for o in QUICK if not o.startswith("data.batch_size=")]  # a key is given once: batches of 16
    assert pretrain(tmp_path, world["pretrain"], *TINY_ALBEF, *quick, *steps, *extra) == 0
    err = capfd.readouterr().err
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert len(rows) == 12
    if regulation == "none":
        assert "SRCL" not in err and not any(k.startswith("srcl_") for k in rows[-1])
        return
    assert all(0 < r["srcl_n_eff_share"] <= 1 and r["srcl_n_eff"] <= 15 for r in rows)  # 15 negatives per row
    warnings = [line for line in err.splitlines() if "the SRCL regulation has" in line]
    if regulation == "helper all run":
        assert warnings == []
        return
    assert len(warnings) == 1 and "faded" in warnings[0], err
    step = int(warnings[0].split("step ")[1].split(" ")[0])
    assert step > BAND_LOGS
    assert rows[-1]["srcl_n_eff_share"] > rows[0]["srcl_n_eff_share"]  # towards plain ITC
