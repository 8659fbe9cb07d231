import math

import pytest
import torch
import torch.nn.functional as F

from vlp.config import ContrastiveConfig
from vlp.losses import LOSSES, ContrastiveInputs, build_loss
from vlp.losses.contrastive import infonce, positive_index, smooth_ap, soft_infonce, triplet, triplet_sh


def contrastive_loss(name, sim_i2t, pos_i2t, sim_t2i, pos_t2i, params=None, **inputs):
    """The registered loss ``name`` (its ``params``) on both directions (``inputs``: tau, log-weights)."""
    loss = build_loss(ContrastiveConfig(name=name, params=params or {}))
    return loss(ContrastiveInputs(sim_i2t, pos_i2t, sim_t2i, pos_t2i, **inputs))


# ---- brute-force references: explicit loops over queries, positives and candidates (float64) ----


def _rows(pos):
    q, c = pos.shape
    for i in range(q):
        p = [j for j in range(c) if pos[i, j]]
        if p:
            yield i, p, [j for j in range(c) if not pos[i, j]]


def brute_infonce(sim, pos, tau, lw=None):
    per_query = []
    for q, ps, ns in _rows(pos):
        terms = []
        for p in ps:
            num = torch.exp(sim[q, p] / tau)
            den = num
            for n in ns:
                den = den + torch.exp(sim[q, n] / tau + (0.0 if lw is None else lw[q, n]))
            terms.append(-torch.log(num / den))
        per_query.append(sum(terms) / len(terms))
    return sum(per_query) / len(per_query)


def brute_triplet(sim, pos, margin):
    return sum(torch.relu(margin + sim[q, n] - sim[q, p]) for q, ps, ns in _rows(pos) for p in ps for n in ns)


def brute_triplet_sh(sim, pos, margin):
    return sum(
        torch.stack([torch.relu(margin + sim[q, n] - sim[q, p]) for n in ns]).max()
        for q, ps, ns in _rows(pos)
        for p in ps
    )


def brute_smooth_ap(sim, pos, tau):
    def g(x):
        return torch.sigmoid(torch.clamp(x / tau, -50.0, 50.0))

    aps = []
    for q, ps, _ in _rows(pos):
        ratios = []
        for i in ps:
            r_all = 1 + sum(g(sim[q, j] - sim[q, i]) for j in range(sim.shape[1]) if j != i)
            r_pos = 1 + sum(g(sim[q, j] - sim[q, i]) for j in ps if j != i)
            ratios.append(r_pos / r_all)
        aps.append(sum(ratios) / len(ratios))
    return 1 - sum(aps) / len(aps)


BRUTE = {
    "infonce": lambda s, p: brute_infonce(s, p, 0.05),
    "triplet": lambda s, p: brute_triplet(s, p, 0.2),
    "triplet_sh": lambda s, p: brute_triplet_sh(s, p, 0.2),
    "smoothap": lambda s, p: brute_smooth_ap(s, p, 0.01),
}


def random_case(q, c, seed):
    """Similarities in [-1, 1]; rows with 1-3 positives, row q // 2 with none."""
    g = torch.Generator().manual_seed(seed)
    sim = torch.rand(q, c, generator=g, dtype=torch.float64) * 2 - 1
    pos = torch.zeros(q, c, dtype=torch.bool)
    for i in range(q):
        pos[i, torch.randperm(c, generator=g)[: i % 3 + 1]] = True
    pos[q // 2] = False
    return sim, pos


def _assert_close(ours, ref, leaves):
    assert ours.dtype == torch.float32
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)
    for a, b in zip(torch.autograd.grad(ours, leaves), torch.autograd.grad(ref, leaves)):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", LOSSES.names())
def test_dual_encoder_matches_brute_force(name):
    sim, pos = random_case(8, 8, seed=0)
    sim.requires_grad_(True)
    ours = contrastive_loss(name, sim, pos, sim.T, pos.T, tau=0.05)
    ref_i2t, ref_t2i = BRUTE[name](sim, pos), BRUTE[name](sim.T, pos.T)
    ref = ref_i2t + ref_t2i if name.startswith("triplet") else 0.5 * (ref_i2t + ref_t2i)
    _assert_close(ours, ref, [sim])


@pytest.mark.parametrize("name", LOSSES.names())
def test_bank_matches_brute_force(name):
    sim_i2t, pos_i2t = random_case(6, 9, seed=1)  # different, non-square matrices per direction
    sim_t2i, pos_t2i = random_case(5, 11, seed=2)
    leaves = [sim_i2t.requires_grad_(True), sim_t2i.requires_grad_(True)]
    ours = contrastive_loss(name, sim_i2t, pos_i2t, sim_t2i, pos_t2i, tau=0.05)
    ref_i2t, ref_t2i = BRUTE[name](sim_i2t, pos_i2t), BRUTE[name](sim_t2i, pos_t2i)
    ref = ref_i2t + ref_t2i if name.startswith("triplet") else 0.5 * (ref_i2t + ref_t2i)
    _assert_close(ours, ref, leaves)


def test_infonce_log_weights_and_tensor_tau_match_brute_force():
    sim, pos = random_case(6, 9, seed=3)
    lw = torch.randn(6, 9, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    sim.requires_grad_(True)
    tau = torch.tensor(0.07, dtype=torch.float64, requires_grad=True)
    ours = infonce(sim, pos, tau, lw)
    ref = brute_infonce(sim, pos, tau, lw)
    _assert_close(ours, ref, [sim, tau])
    assert torch.autograd.grad(infonce(sim, pos, tau, lw), tau)[0].abs() > 0
    # log-weights act on negatives only: changing them at positive entries changes nothing
    assert infonce(sim, pos, 0.07, lw + 5.0 * pos).item() == pytest.approx(infonce(sim, pos, 0.07, lw).item(), rel=1e-6)


def test_infonce_single_positive_is_cross_entropy():
    g = torch.Generator().manual_seed(5)
    sim = torch.rand(5, 12, generator=g) * 2 - 1
    targets = torch.randperm(12, generator=g)[:5]
    pos = F.one_hot(targets, 12).bool()
    for tau in (0.05, 0.1, 1.0):
        assert infonce(sim, pos, tau).item() == pytest.approx(F.cross_entropy(sim / tau, targets).item(), rel=1e-6)


def test_rows_without_positives_are_skipped():
    sim, pos = random_case(6, 9, seed=6)
    keep = pos.any(1)
    for fn, arg in ((infonce, 0.05), (triplet, 0.2), (triplet_sh, 0.2), (smooth_ap, 0.01)):
        s = sim.clone().requires_grad_(True)
        loss = fn(s, pos, arg)
        assert loss.item() == pytest.approx(fn(sim[keep], pos[keep], arg).item(), rel=1e-6)
        (grad,) = torch.autograd.grad(loss, s)
        assert torch.all(grad[~keep] == 0)


def test_rows_without_negatives_are_finite():
    sim = torch.tensor([[0.3, 0.1, -0.2], [0.5, 0.4, 0.0]], requires_grad=True)
    pos = torch.tensor([[True, True, True], [True, False, False]])
    for fn, arg in ((infonce, 0.05), (triplet, 0.2), (triplet_sh, 0.2), (smooth_ap, 0.01)):
        (grad,) = torch.autograd.grad(fn(sim, pos, arg), sim)
        assert torch.isfinite(grad).all() and grad[0].abs().max() < 1e-6
    row1 = F.cross_entropy(sim[1:] / 0.05, torch.tensor([0])).item()
    assert infonce(sim, pos, 0.05).item() == pytest.approx(row1 / 2, rel=1e-5)  # row 0 counts as a zero term


def test_positive_index_pads_and_masks():
    pos = torch.tensor([[False, True, False, True], [False, False, False, False], [True, False, False, False]])
    idx, mask = positive_index(pos)
    assert mask.tolist() == [[True, True], [False, False], [True, False]]
    assert idx[0].tolist() == [1, 3] and idx[2, 0].item() == 0


def exact_ap(scores, positives):
    """AP from ranks (no ties): mean over positives of (#positives ranked at or above i) / rank(i)."""
    ranks = {j: 1 + sum(s > scores[j] for s in scores) for j in range(len(scores))}
    p = [j for j in range(len(scores)) if positives[j]]
    return sum(sum(ranks[k] <= ranks[i] for k in p) / ranks[i] for i in p) / len(p)


def test_smooth_ap_approaches_exact_ap():
    g = torch.Generator().manual_seed(7)
    q, c = 4, 12
    sim = torch.stack([torch.randperm(c, generator=g) for _ in range(q)]).double() / (2 * c)  # gaps 1/24, no ties
    pos = torch.zeros(q, c, dtype=torch.bool)
    for i in range(q):
        pos[i, torch.randperm(c, generator=g)[: i + 1]] = True
    exact = 1 - sum(exact_ap(sim[i].tolist(), pos[i].tolist()) for i in range(q)) / q
    errors = [abs(smooth_ap(sim, pos, tau).item() - exact) for tau in (1e-1, 1e-2, 1e-3)]
    assert errors[0] > errors[1] > errors[2] and errors[0] > 1e-2 and errors[2] < 1e-6
    assert exact > 0.1  # a non-trivial ranking


def test_smooth_ap_materialises_positive_rows_only():
    # [Q, C, C] would be 2 x 20000 x 20000 fp32 = 3.2 GB; the positive-row layout is [2, 3, 20000].
    # Every tensor autograd keeps for the backward pass is recorded: none may exceed Q x P_max x C.
    sim = (torch.rand(2, 20000, generator=torch.Generator().manual_seed(8)) * 2 - 1).requires_grad_(True)
    pos = torch.zeros(2, 20000, dtype=torch.bool)
    pos[0, [5, 700, 19999]] = True
    pos[1, 123] = True
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = smooth_ap(sim, pos, 0.01)
    loss.backward()
    assert saved and max(saved) <= 2 * 3 * 20000
    assert 0.0 <= loss.item() <= 1.0 and torch.isfinite(sim.grad).all()


def test_triplet_sh_bounded_by_triplet_and_zero_when_separated():
    sim, pos = random_case(6, 9, seed=9)
    for margin in (0.0, 0.2, 0.5):
        assert triplet_sh(sim, pos, margin).item() <= triplet(sim, pos, margin).item() + 1e-6
    # positives strictly above every negative of their row: margin 0 gives 0 loss for both
    separated = torch.where(pos, 0.5 + 0.4 * sim.abs(), -0.5 + 0.4 * sim.abs())
    assert triplet(separated, pos, 0.0).item() == 0.0 and triplet_sh(separated, pos, 0.0).item() == 0.0
    assert triplet(separated, pos, 1.5).item() > 0.0


def test_contrastive_loss_direction_reductions_and_errors():
    sim_i2t, pos_i2t = random_case(6, 9, seed=10)
    sim_t2i, pos_t2i = random_case(5, 11, seed=11)
    args = (sim_i2t, pos_i2t, sim_t2i, pos_t2i)
    both = {
        "infonce": (infonce(sim_i2t, pos_i2t, 0.1), infonce(sim_t2i, pos_t2i, 0.1)),
        "triplet": (triplet(sim_i2t, pos_i2t, 0.3), triplet(sim_t2i, pos_t2i, 0.3)),
        "triplet_sh": (triplet_sh(sim_i2t, pos_i2t, 0.3), triplet_sh(sim_t2i, pos_t2i, 0.3)),
        "smoothap": (smooth_ap(sim_i2t, pos_i2t, 0.02), smooth_ap(sim_t2i, pos_t2i, 0.02)),
    }
    for name, (a, b) in both.items():
        expected = a + b if name in ("triplet", "triplet_sh") else 0.5 * (a + b)
        params = {"infonce": {}, "triplet": {"margin": 0.3}, "triplet_sh": {"margin": 0.3}, "smoothap": {"tau": 0.02}}[
            name
        ]
        got = contrastive_loss(name, *args, params, tau=0.1)
        assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    lw = torch.zeros(6, 9)
    assert contrastive_loss("infonce", *args, tau=0.1, log_weights_i2t=lw).item() == pytest.approx(
        both["infonce"][0].add(both["infonce"][1]).item() / 2, rel=1e-6
    )
    for name in ("triplet", "triplet_sh", "smoothap"):
        with pytest.raises(ValueError, match="log_weights"):
            contrastive_loss(name, *args, log_weights_i2t=lw)
        with pytest.raises(ValueError, match="log_weights"):
            contrastive_loss(name, *args, log_weights_t2i=torch.zeros(5, 11))
        with pytest.raises(ValueError, match="targets are only supported"):
            contrastive_loss(name, *args, targets_i2t=torch.full((6, 9), 1 / 9))
    with pytest.raises(ValueError, match="tau"):
        contrastive_loss("infonce", *args)
    with pytest.raises(ValueError, match="unknown"):
        contrastive_loss("hinge", *args)


def test_infonce_with_soft_targets_is_the_soft_cross_entropy_of_sim_over_tau():
    sim_i2t, pos_i2t = random_case(6, 9, seed=12)
    sim_t2i, pos_t2i = random_case(5, 11, seed=13)
    t_i2t, t_t2i = torch.softmax(sim_i2t * 3, 1), torch.softmax(sim_t2i * 3, 1)
    lw = torch.zeros(5, 11).masked_fill(torch.eye(5, 11, dtype=torch.bool).roll(1, 1), float("-inf"))
    got = contrastive_loss(
        "infonce",
        sim_i2t,
        pos_i2t,
        sim_t2i,
        pos_t2i,
        tau=0.1,
        targets_i2t=t_i2t,
        targets_t2i=t_t2i,
        log_weights_t2i=lw,
        removal=True,
    )
    expected = 0.5 * (soft_infonce(sim_i2t / 0.1, t_i2t) + soft_infonce(sim_t2i / 0.1, t_t2i, lw, True))
    assert got.item() == pytest.approx(expected.item(), rel=1e-6) and torch.isfinite(got)


def test_uniform_similarities_give_log_of_contrast_size():
    pos = torch.eye(3, 7, dtype=torch.bool)
    pos[0, 5] = True  # two positives: each term contrasts with the 5 negatives only
    loss = infonce(torch.zeros(3, 7), pos, 0.05).item()
    assert loss == pytest.approx((math.log(6) + 2 * math.log(7)) / 3, rel=1e-6)
