"""δ by a target false-negative weight, the α_h floor, the oracle lookup, weight summaries and the
optimum of weighted ITC with momentum distillation (vlp.losses.srcl)."""

import math

import pytest
import torch

from vlp.losses.srcl import (
    alpha_h_at,
    calibrate_delta,
    calibrate_delta_for_weight,
    distillation_optimum,
    relevance_lookup,
    srcl_weights,
    weight_distribution,
)


def two_levels(rows: int, n_fn: int, n_tn: int):
    """Rows of [positive | n_fn false negatives with s = e | n_tn true negatives with s = 1]."""
    c = 1 + n_fn + n_tn
    s = torch.ones(rows, c)
    s[:, 1 : 1 + n_fn] = math.e
    s[:, 0] = math.e**2
    pos = torch.zeros(rows, c, dtype=torch.bool)
    pos[:, 0] = True
    fn = torch.zeros_like(pos)
    fn[:, 1 : 1 + n_fn] = True
    return s, pos, fn


@pytest.mark.parametrize("statistic", ["median", "mean"])
@pytest.mark.parametrize("target", [0.12, 0.15, 0.5])
def test_delta_for_target_weight_in_closed_form(statistic, target):
    # u = 1/s: 1/e for a false negative, 1 for a true one, so w_fn / w_tn = exp(delta (1/e - 1)) = r;
    # equal counts and mean 1 give w_fn = 2 r / (1 + r) = target  =>  r = target / (2 - target)
    s, pos, fn = two_levels(rows=3, n_fn=4, n_tn=4)
    expected = math.log(target / (2 - target)) / (1 / math.e - 1)
    delta = calibrate_delta_for_weight(s, pos, fn, target, statistic)
    assert delta == pytest.approx(expected, rel=1e-6)
    w = srcl_weights(s, pos, "softmax", delta)
    assert torch.allclose(w[fn], torch.full((12,), target), atol=1e-6)


def test_delta_for_target_weight_errors():
    s, pos, fn = two_levels(rows=2, n_fn=2, n_tn=2)
    with pytest.raises(ValueError, match="no false negatives"):
        calibrate_delta_for_weight(s, pos, torch.zeros_like(fn))
    with pytest.raises(ValueError, match="no false negatives"):
        calibrate_delta_for_weight(s, pos, pos)  # positives are never false negatives
    with pytest.raises(ValueError, match="outside that range"):  # a useless helper: equal similarities
        calibrate_delta_for_weight(torch.ones_like(s), pos, fn, 0.15)
    with pytest.raises(ValueError, match="outside that range"):  # needs delta > 1e3 ... not reachable at 1e-2
        calibrate_delta_for_weight(s, pos, fn, 0.15, hi=1e-2)
    with pytest.raises(ValueError, match="statistic"):
        calibrate_delta_for_weight(s, pos, fn, 0.15, "p10")
    with pytest.raises(ValueError, match="target"):
        calibrate_delta_for_weight(s, pos, fn, 1.0)


def test_twenty_percent_rule_is_unchanged():
    # one false negative (s = e) and four true ones (s = 1) per row: 20% of the negatives fall below
    # 0.7 exactly when w_fn = 5 r / (r + 4) < 0.7, i.e. the rule's delta is ln(2.8 / 4.3) / (1/e - 1)
    s, pos, _ = two_levels(rows=4, n_fn=1, n_tn=4)
    assert calibrate_delta(s, pos) == pytest.approx(math.log(2.8 / 4.3) / (1 / math.e - 1), rel=1e-6)


def test_alpha_h_floor_schedule():
    assert [alpha_h_at(k, 100, 0.2) for k in (0, 50, 100, 500)] == pytest.approx([1.0, 0.6, 0.2, 0.2])
    assert [alpha_h_at(k, 100, 1.0) for k in (0, 50, 100, 500)] == [1.0, 1.0, 1.0, 1.0]  # constant
    # the default is the paper's fade-out, bit for bit
    assert [alpha_h_at(k, 100) for k in (0, 25, 100, 500)] == [1.0, 0.75, 0.0, 0.0]
    assert alpha_h_at(3, 0, 0.5) == 0.0  # no span (fine-tuning): never a helper


def test_relevance_lookup_and_empty_slots():
    rel = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.25]])  # 2 texts x 3 images
    got = relevance_lookup(rel, torch.tensor([[1.0], [0.0], [-1.0]]), torch.tensor([2.0, 0.0, -1.0]))
    assert torch.equal(got, torch.tensor([[0.25, 0.0, 0.0], [0.5, 1.0, 0.0], [0.0, 0.0, 0.0]]))


def test_weight_distribution():
    w = torch.tensor([0.1, 0.15, 0.3, 0.8, 1.0, 1.2, 1.4, 1.5, 1.6, 1.95])
    d = weight_distribution(w)
    assert d == pytest.approx(
        dict(count=10, mean=1.0, median=1.0, p10=0.1, p90=1.6, below_0_2=0.2, below_0_7=0.3), abs=1e-6
    )
    empty = weight_distribution(torch.zeros(0))
    assert empty["count"] == 0 and math.isnan(empty["median"])


def worked_row(n_tn: int = 44):
    """The docs' worked row: momentum logits 5.0 (positive), 4.5 (a false negative), 0 (n_tn true
    negatives); SRCL weights 0.12 for the false negative, the rest so that the mean is 1."""
    m = torch.tensor([5.0, 4.5] + [0.0] * n_tn)
    w = torch.tensor([1.0, 0.12] + [(n_tn + 1 - 0.12) / n_tn] * n_tn)
    return m, w.log().masked_fill(torch.arange(len(w)) == 0, 0.0)


def test_distillation_optimum_unweighted_targets_lift_the_false_negative_over_the_positive():
    m, lw = worked_row()
    p = distillation_optimum(m, 0, lw, alpha=0.4, weight_targets=False)
    assert float(p.sum()) == pytest.approx(1.0)
    assert round(float(p[1]), 3) == 0.549 and round(float(p[0]), 3) == 0.419  # the false negative wins
    # by hand: t = 0.4 softmax(m) + 0.6 y, p ∝ t / w
    q = torch.softmax(m.double(), 0)
    t = 0.4 * q + 0.6 * (torch.arange(len(m)) == 0)
    ref = t / lw.double().exp()
    assert torch.allclose(p, ref / ref.sum(), atol=1e-7)


def test_distillation_optimum_weighted_targets_keep_the_momentum_ordering():
    m, lw = worked_row()
    p = distillation_optimum(m, 0, lw, alpha=0.4, weight_targets=True)
    assert int(p.argmax()) == 0  # the positive stays on top
    # negatives: p_j ∝ 0.4 exp(m_j) / Z_w, the momentum model's ratios exactly
    assert float(p[1] / p[2]) == pytest.approx(math.exp(4.5), rel=1e-5)
    assert torch.allclose(p[2:], p[2].expand(len(p) - 2))
    qw = torch.softmax(m.double() + lw.double(), 0)
    z = 0.4 * qw[0] + 0.6 + (0.4 * qw[1:] / lw[1:].double().exp()).sum()
    assert float(p[0]) == pytest.approx(float((0.4 * qw[0] + 0.6) / z), rel=1e-6)
    assert round(float(p[0]), 3) == 0.772 and round(float(p[1]), 3) == 0.153


def test_distillation_optimum_without_weights_is_the_target_and_refuses_removal():
    m, _ = worked_row(4)
    zero = torch.zeros_like(m)
    for wt in (False, True):
        p = distillation_optimum(m, 0, zero, 0.4, wt)
        ref = 0.4 * torch.softmax(m.double(), 0) + 0.6 * (torch.arange(len(m)) == 0)
        assert torch.allclose(p, ref, atol=1e-7)
    with pytest.raises(ValueError, match="finite"):
        distillation_optimum(m, 0, zero.index_fill(0, torch.tensor([2]), float("-inf")), 0.4, False)
