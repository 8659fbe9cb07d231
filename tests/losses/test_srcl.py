import math

import pytest
import torch

from vlp.losses.contrastive import itc_targets, soft_infonce
from vlp.losses.srcl import (
    alpha_h_at,
    calibrate_delta,
    mixed_similarity,
    removal_log_weights,
    srcl_weights,
    to_log_weights,
    weight_stats,
)


def setup(q=4, c=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    cos = torch.rand(q, c, generator=g) * 2 - 1
    pos = torch.zeros(q, c, dtype=torch.bool)
    pos[torch.arange(q), torch.arange(q)] = True
    pos[0, 5] = True  # a second positive (same image id in the queue)
    return cos, pos


@pytest.mark.parametrize("mode", ["softmax", "mean"])
def test_row_mean_over_negatives_is_one_and_positives_are_one(mode):
    cos, pos = setup()
    w = srcl_weights(torch.exp(cos), pos, mode, delta=2.0)
    neg = ~pos
    row_mean = (w * neg).sum(1) / neg.sum(1)
    assert torch.allclose(row_mean, torch.ones(4), atol=1e-5)
    assert (w[pos] == 1).all()


@pytest.mark.parametrize("mode", ["softmax", "mean"])
def test_weights_fall_as_similarity_grows(mode):
    s = torch.exp(torch.linspace(-1, 1, 8))[None]  # increasing similarity along the row
    pos = torch.zeros(1, 8, dtype=torch.bool)
    w = srcl_weights(s, pos, mode, delta=3.0)[0]
    assert (w[1:] < w[:-1]).all()


def test_uniform_weights_give_exactly_the_plain_loss():
    cos, pos = setup()
    const = srcl_weights(torch.full((4, 9), 2.0), pos, "mean")
    tiny_delta = srcl_weights(torch.exp(cos), pos, "softmax", delta=1e-9)
    assert torch.equal(const, torch.ones(4, 9))
    assert torch.allclose(tiny_delta, torch.ones(4, 9), atol=1e-6)
    logits = cos / 0.07
    targets = itc_targets(pos, torch.randn(4, 9), alpha=0.4)  # momentum distillation included
    assert soft_infonce(logits, targets, to_log_weights(const, pos)) == soft_infonce(logits, targets)


def test_weighted_loss_matches_paper_equation_and_weights_carry_no_gradient():
    cos, pos = setup(3, 6)
    pos = torch.eye(3, 6, dtype=torch.bool)
    cos_live = cos.clone().requires_grad_()
    w = srcl_weights(mixed_similarity(cos_live, cos.flip(1), alpha_h=0.3), pos, "softmax", delta=1.5)
    assert not w.requires_grad
    tau = 0.07
    loss = soft_infonce(cos_live / tau, itc_targets(pos), to_log_weights(w, pos))
    # Eq. 4/5: -log f(pos) / (f(pos) + sum_neg w f(neg))
    f = torch.exp(cos_live / tau)
    ref = -sum(torch.log(f[i, i] / (f[i, i] + (w[i] * f[i] * ~pos[i]).sum())) for i in range(3)) / 3
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    (g1,) = torch.autograd.grad(loss, cos_live)
    (g2,) = torch.autograd.grad(ref, cos_live)
    assert torch.allclose(g1, g2, atol=1e-5)


def test_removal_masks_exactly_the_entries_below_threshold():
    w = torch.tensor([[1.0, 0.1, 0.25, 0.9, 1.75], [0.05, 1.0, 0.3, 2.0, 1.65]])
    pos = torch.tensor([[True, False, False, False, False], [True, True, False, False, False]])
    lw = removal_log_weights(w, pos, threshold=0.2)
    expected_drop = torch.tensor([[False, True, False, False, False], [False, False, False, False, False]])
    assert torch.equal(torch.isinf(lw), expected_drop)  # row 1: the 0.05 entry is a positive, kept
    assert (lw[~expected_drop] == 0).all()  # survivors unweighted
    assert (removal_log_weights(w, pos, 0.0) == 0).all()  # threshold 0 = vanilla


def test_alpha_h_schedule_endpoints():
    assert alpha_h_at(0, 100) == 1.0
    assert alpha_h_at(25, 100) == 0.75
    assert alpha_h_at(100, 100) == 0.0 and alpha_h_at(500, 100) == 0.0
    assert alpha_h_at(0, 0) == 0.0  # fine-tuning: live model only


def test_mixed_similarity_formula():
    live, helper = torch.tensor([[0.2, -0.5]]), torch.tensor([[0.9, 0.1]])
    s = mixed_similarity(live, helper, 0.25, tau_w=0.5)
    assert torch.allclose(s, 0.25 * torch.exp(helper / 0.5) + 0.75 * torch.exp(live / 0.5))
    assert torch.allclose(mixed_similarity(live, None, 0.0), torch.exp(live))
    with pytest.raises(ValueError, match="helper"):
        mixed_similarity(live, None, 0.5)


def test_weight_stats():
    w = torch.tensor([[1.0, 0.1, 0.5, 2.4]])
    pos = torch.tensor([[True, False, False, False]])
    st = {k: float(v) for k, v in weight_stats(w, pos).items()}
    assert st == pytest.approx(
        {"srcl_w_mean": 1.0, "srcl_w_min": 0.1, "srcl_w_below_0_2": 1 / 3, "srcl_w_below_0_7": 2 / 3}
    )
    assert not math.isnan(float(weight_stats(torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool))["srcl_w_mean"]))


def test_removal_reweight_keeps_srcl_weights_on_survivors():
    w = torch.tensor([[1.0, 0.1, 0.5, 2.4]])
    pos = torch.tensor([[True, False, False, False]])
    lw = removal_log_weights(w, pos, threshold=0.2, reweight=True)
    assert torch.isneginf(lw[0, 1]) and lw[0, 0] == 0
    kept = lw[0, 2:].exp()
    assert torch.allclose(kept, torch.tensor([0.5, 2.4]) / 1.45) and kept.mean() == pytest.approx(1.0)


def test_calibrate_delta_hits_the_target_fraction():
    g = torch.Generator().manual_seed(0)
    cos = torch.rand(32, 96, generator=g) * 1.6 - 0.6
    pos = torch.zeros(32, 96, dtype=torch.bool)
    pos[torch.arange(32), torch.arange(32)] = True
    s = torch.exp(cos)
    delta = calibrate_delta(s, pos, frac_below=0.2, level=0.7)
    w = srcl_weights(s, pos, "softmax", delta)
    assert float((w[~pos] < 0.7).float().mean()) == pytest.approx(0.2, abs=0.01)
    # sharper than that puts more below 0.7
    assert float((srcl_weights(s, pos, "softmax", 2 * delta)[~pos] < 0.7).float().mean()) > 0.3
