import math

import pytest
import torch

from vlp.losses.contrastive import itc_targets, soft_infonce


def brute_infonce(logits, targets, log_w=None):
    q, c = logits.shape
    total = 0.0
    for i in range(q):
        row = [logits[i, j] + (0 if log_w is None else log_w[i, j]) for j in range(c)]
        lse = torch.logsumexp(torch.stack(row), 0)
        total = total - sum(targets[i, j] * (row[j] - lse) for j in range(c))
    return total / q


def test_targets_one_hot_and_distilled():
    pos = torch.tensor([[1, 0, 0, 1], [0, 1, 0, 0]], dtype=torch.bool)
    y = itc_targets(pos)
    assert torch.allclose(y, torch.tensor([[0.5, 0, 0, 0.5], [0, 1.0, 0, 0]]))
    m = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]])
    t = itc_targets(pos, m, alpha=0.4)
    sm = torch.softmax(m[1], 0)
    assert torch.allclose(t[0], 0.4 * 0.25 + 0.6 * y[0])
    assert torch.allclose(t[1], 0.4 * sm + 0.6 * y[1])
    assert torch.allclose(t.sum(1), torch.ones(2))


def test_soft_infonce_matches_brute_force_values_and_grads():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.softmax(torch.randn(3, 5, generator=g, dtype=torch.float64), 1)
    log_w = torch.randn(3, 5, generator=g, dtype=torch.float64)
    for lw in (None, log_w):
        ours = soft_infonce(logits, targets, lw)
        ref = brute_infonce(logits, targets, lw)
        assert torch.allclose(ours.double(), ref, atol=1e-6)
        (g1,) = torch.autograd.grad(ours, logits)
        (g2,) = torch.autograd.grad(ref, logits)
        assert torch.allclose(g1.double(), g2, atol=1e-6)


def test_zero_log_weights_are_exactly_unweighted():
    logits = torch.randn(4, 6)
    targets = itc_targets(torch.eye(4, 6, dtype=torch.bool))
    assert soft_infonce(logits, targets, torch.zeros(4, 6)) == soft_infonce(logits, targets)


def test_uniform_logits_give_log_c():
    logits = torch.zeros(2, 8)
    targets = itc_targets(torch.eye(2, 8, dtype=torch.bool))
    assert math.isclose(soft_infonce(logits, targets).item(), math.log(8), rel_tol=1e-6)


def test_removed_candidates_leave_softmax_and_soft_targets():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 6, generator=g)
    pos = torch.eye(3, 6, dtype=torch.bool)
    targets = itc_targets(pos, torch.randn(3, 6, generator=g), alpha=0.4)  # distillation mass everywhere
    lw = torch.zeros(3, 6)
    lw[0, 4] = float("-inf")  # row 0 drops column 4
    loss = soft_infonce(logits, targets, lw, removal=True)
    assert torch.isfinite(loss)
    # reference: row 0 computed on the 5 surviving columns with its target renormalised
    keep = [0, 1, 2, 3, 5]
    t0 = targets[0, keep] / targets[0, keep].sum()
    r0 = -(t0 * torch.log_softmax(logits[0, keep], 0)).sum()
    rest = -(targets[1:] * torch.log_softmax(logits[1:], 1)).sum(1)
    assert loss.item() == pytest.approx(((r0 + rest.sum()) / 3).item(), rel=1e-6)
