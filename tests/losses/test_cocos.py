import json
import math

import pytest
import torch

from vlp.config import ContrastiveConfig
from vlp.losses import CocosInputs, build_loss
from vlp.losses.cocos import cocos_infonce, cocos_smoothap, cocos_triplet


def cocos(name, sim, positives, params=None, **question):
    """COCOS of the registered loss ``name`` (its ``params``) for one direction (``question``: tau,
    threshold, inv_tau)."""
    return build_loss(ContrastiveConfig(name=name, params=params or {})).cocos(CocosInputs(sim, positives, **question))


# Dual encoder, diagonal positives, margin 0.2. Triplet hinges 0.2 + s_qn - s_qp:
#   i2t q0 (pos 0.9): n=0.8 -> 0.1 yes, n=0.75 -> 0.05 yes      -> 2 (hardest: 1)
#   i2t q1 (pos 0.5): n=0.2 -> -0.1,    n=0.6 -> 0.3 yes        -> 1 (hardest: 1)
#   i2t q2 (pos 0.7): n=0.2 -> -0.3,    n=0.1 -> -0.4           -> 0
#   t2i c0 (pos 0.9): n=0.2 -> -0.5,    n=0.2 -> -0.5           -> 0
#   t2i c1 (pos 0.5): n=0.8 -> 0.5 yes, n=0.1 -> -0.2           -> 1 (hardest: 1)
#   t2i c2 (pos 0.7): n=0.75 -> 0.25 yes, n=0.6 -> 0.1 yes      -> 2 (hardest: 1)
S3 = torch.tensor([[0.9, 0.8, 0.75], [0.2, 0.5, 0.6], [0.2, 0.1, 0.7]])
EYE3 = torch.eye(3, dtype=torch.bool)

# Image-level batch: 2 images x 2 captions, caption c belongs to image c // 2.
S24 = torch.tensor([[0.9, 0.3, 0.6, 0.05], [0.45, 0.4, 0.7, 0.8]])
POS24 = torch.tensor([[True, True, False, False], [False, False, True, True]])


def _check(stats, counts, zeros, total, mean):
    assert stats["counts"].tolist() == pytest.approx(counts)
    assert (stats["zeros"], stats["count_total"]) == (zeros, pytest.approx(total))
    assert stats["count_mean"] == pytest.approx(mean, nan_ok=True)


def test_triplet_counts_hand_worked_square():
    _check(cocos_triplet(S3, EYE3, 0.2, hardest=False), [2, 1, 0], 1, 3, 3 / 2)
    _check(cocos_triplet(S3, EYE3, 0.2, hardest=True), [1, 1, 0], 1, 2, 2 / 2)
    _check(cocos_triplet(S3.T, EYE3, 0.2, hardest=False), [0, 1, 2], 1, 3, 3 / 2)
    _check(cocos_triplet(S3.T, EYE3, 0.2, hardest=True), [0, 1, 1], 1, 2, 2 / 2)
    assert cocos("triplet_sh", S3.T, EYE3, {"margin": 0.2})["counts"].tolist() == [0, 1, 1]


def test_triplet_counts_are_per_caption_query_for_t2i():
    # t2i: caption c ranks the 2 images, positive image c // 2, one negative each:
    #   c0: pos 0.9, neg 0.45 -> -0.25;  c1: pos 0.3, neg 0.4 -> 0.3 yes
    #   c2: pos 0.7, neg 0.6 -> 0.1 yes;  c3: pos 0.8, neg 0.05 -> -0.55
    _check(cocos_triplet(S24.T, POS24.T, 0.2, hardest=False), [0, 1, 1, 0], 2, 2, 1.0)
    # i2t: image 0, pos 0.9: negs 0.6 -> -0.1, 0.05 -> -0.65; pos 0.3: 0.6 -> 0.5 yes, 0.05 -> -0.05
    #      image 1, pos 0.7: negs 0.45 -> -0.05, 0.4 -> -0.1; pos 0.8: both below 0
    _check(cocos_triplet(S24, POS24, 0.2, hardest=False), [1, 0], 1, 1, 1.0)
    _check(cocos_triplet(S24, POS24, 0.2, hardest=True), [1, 0], 1, 1, 1.0)


def test_queries_without_positive_are_not_counted():
    pos = EYE3.clone()
    pos[2] = False
    stats = cocos_triplet(S3, pos, 0.2, hardest=False)
    _check(stats, [2, 1, 0], 0, 3, 3 / 2)
    assert stats["valid"] == 2
    _check(cocos_triplet(S3, torch.zeros(3, 3, dtype=torch.bool), 0.2, hardest=True), [0, 0, 0], 0, 0, math.nan)


def test_infonce_weights_hand_worked():
    # tau = 0.5, threshold 0.15.
    # row 0: logits [1, 0.4, 0, -2], positive {0}: p = exp(l) / sum -> [0.5085, 0.2791, 0.1871, 0.0253]
    # row 1: logits [1, 0, 0.5, -1], positives {0, 1}; each positive's softmax is over itself + {2, 3}:
    #   term p=0: denominator e + e^0.5 + e^-1; term p=1: denominator 1 + e^0.5 + e^-1
    #   averaged weights: positive 0.4528, negatives [0.4474, 0.0998]
    sim = torch.tensor([[0.5, 0.2, 0.0, -1.0], [0.5, 0.0, 0.25, -0.5]])
    pos = torch.tensor([[True, False, False, False], [True, True, False, False]])
    e = math.exp
    z0 = e(1) + e(0.4) + e(0) + e(-2)
    p_pos0, negs0 = e(1) / z0, [e(0.4) / z0, e(0) / z0, e(-2) / z0]
    d_a, d_b = e(1) + e(0.5) + e(-1), e(0) + e(0.5) + e(-1)
    p_pos1 = (e(1) / d_a + e(0) / d_b) / 2
    negs1 = [(e(0.5) / d_a + e(0.5) / d_b) / 2, (e(-1) / d_a + e(-1) / d_b) / 2]
    assert negs0[1] > 0.15 > negs0[2] and negs1[0] > 0.15 > negs1[1]
    stats = cocos_infonce(sim, pos, 0.5, threshold=0.15)
    assert stats["counts"].tolist() == [2, 1]
    assert (stats["zeros"], stats["count_mean"]) == (0, 1.5)
    assert stats["one_minus_p_pos"] == pytest.approx(((1 - p_pos0) + (1 - p_pos1)) / 2, rel=1e-5)
    assert stats["neg_mass_below"] == pytest.approx((negs0[2] + negs1[1]) / 2, rel=1e-5)
    assert stats["neg_mass_above"] == pytest.approx((negs0[0] + negs0[1] + negs1[0]) / 2, rel=1e-5)
    assert cocos("infonce", sim, pos, tau=0.5, threshold=0.15)["neg_mass_above"] == stats["neg_mass_above"]


def _g(x, tau):
    return 1 / (1 + math.exp(-x / tau))


def _c(s_i, s_j, r_all, tau):
    """SmoothAP contribution of candidate j to positive row i: G(1 - G) / R(i, Omega)^2."""
    g = _g(s_j - s_i, tau)
    return g * (1 - g) / r_all**2


def test_smoothap_contributions_hand_worked():
    # tau = 0.1, threshold 0.1.
    # row 0 [0.5, 0.4, 0.1], positive {0}: G(-0.1)=0.2689, G(-0.4)=0.0180, R=1.2869
    #   c(0,1) = 0.2689*0.7311/R^2 = 0.1187 yes, c(0,2) = 0.0107 no        -> 1 pair / 1
    # row 1 [0.1, 0.3, 0.35], positives {1, 2}:
    #   i=1: G(-0.2)=0.1192, G(0.05)=0.6225, R=1.7417 -> c(1,0)=0.0346, c(1,2)=0.0775
    #   i=2: G(-0.25)=0.0759, G(-0.05)=0.3775, R=1.4534 -> c(2,0)=0.0332, c(2,1)=0.1113 yes -> 1 pair / 2
    tau = 0.1
    sim = torch.tensor([[0.5, 0.4, 0.1], [0.1, 0.3, 0.35]])
    pos = torch.tensor([[True, False, False], [False, True, True]])
    r0 = 1 + _g(-0.1, tau) + _g(-0.4, tau)
    r1, r2 = 1 + _g(-0.2, tau) + _g(0.05, tau), 1 + _g(-0.25, tau) + _g(-0.05, tau)
    assert _c(0.5, 0.4, r0, tau) > 0.1 > _c(0.5, 0.1, r0, tau)
    assert max(_c(0.3, 0.1, r1, tau), _c(0.3, 0.35, r1, tau), _c(0.35, 0.1, r2, tau)) < 0.1 < _c(0.35, 0.3, r2, tau)
    _check(cocos_smoothap(sim, pos, tau, threshold=0.1), [1, 0.5], 0, 1.5, 0.75)
    _check(cocos("smoothap", sim, pos, {"tau": tau}, threshold=0.1), [1, 0.5], 0, 1.5, 0.75)


def test_smoothap_t2i_counts_per_caption_with_image_positive():
    # caption c ranks 2 images, positive image c // 2, one other candidate: c = G(1-G)/(1+G)^2, tau 0.1
    #   c0: G(0.45-0.9)=0.0110 -> 0.0106;  c1: G(0.4-0.3)=0.7311 -> 0.0656 yes
    #   c2: G(0.6-0.7)=0.2689 -> 0.1221 yes;  c3: G(0.05-0.8)=0.0006 -> 0.0006
    tau = 0.1
    contrib = []
    for c in range(4):
        s_p, s_n = S24[c // 2, c].item(), S24[1 - c // 2, c].item()
        g = _g(s_n - s_p, tau)
        contrib.append(g * (1 - g) / (1 + g) ** 2)
    assert [x > 0.05 for x in contrib] == [False, True, True, False]
    _check(cocos_smoothap(S24.T, POS24.T, tau, threshold=0.05), [0, 1, 1, 0], 2, 2, 1.0)


def _random(seed, q=6, c=9):
    g = torch.Generator().manual_seed(seed)
    sim = torch.rand(q, c, generator=g) * 2 - 1
    pos = torch.zeros(q, c, dtype=torch.bool)
    for i in range(q):
        pos[i, torch.randperm(c, generator=g)[: i % 3 + 1]] = True
    pos[q // 2] = False
    return sim, pos


def test_counts_match_loops_on_random_matrices():
    sim, pos = _random(0)
    s = sim.double().tolist()
    tri, tri_sh, nce, sap = [], [], [], []
    tau, sap_tau, thr = 0.1, 0.05, 0.02
    for q in range(6):
        ps = [j for j in range(9) if pos[q, j]]
        ns = [j for j in range(9) if not pos[q, j]]
        tri.append(sum(0.2 + s[q][n] - s[q][p] > 0 for p in ps for n in ns))
        tri_sh.append(sum(0.2 + max(s[q][n] for n in ns) - s[q][p] > 0 for p in ps))
        neg_w = [0.0] * 9
        for p in ps:
            den = math.exp(s[q][p] / tau) + sum(math.exp(s[q][n] / tau) for n in ns)
            for n in ns:
                neg_w[n] += math.exp(s[q][n] / tau) / den / len(ps)
        nce.append(sum(w > thr for w in neg_w))
        hits = 0
        for i in ps:
            r_all = 1 + sum(_g(s[q][j] - s[q][i], sap_tau) for j in range(9) if j != i)
            hits += sum(_c(s[q][i], s[q][j], r_all, sap_tau) > thr for j in range(9) if j != i)
        sap.append(hits / max(len(ps), 1))
    assert cocos_triplet(sim, pos, 0.2, hardest=False)["counts"].tolist() == tri
    assert cocos_triplet(sim, pos, 0.2, hardest=True)["counts"].tolist() == tri_sh
    stats = cocos_infonce(sim, pos, tau, threshold=thr)
    assert stats["counts"].tolist() == nce and stats["count_mean"] == pytest.approx(sum(nce) / 5)
    assert stats["neg_mass_below"] + stats["neg_mass_above"] == pytest.approx(stats["one_minus_p_pos"], rel=1e-5)
    assert cocos_smoothap(sim, pos, sap_tau, threshold=thr)["counts"].tolist() == pytest.approx(sap)


def test_unknown_name_raises():
    with pytest.raises(ValueError, match="unknown"):
        cocos("hinge", S3, EYE3)


def test_smoothap_inv_tau_counts_the_true_gradient_magnitude():
    # The hand-worked case above (tau = 0.1, threshold 0.1), with the 1/tau factor: every
    # contribution x 10 -> row 0: 1.187, 0.107 both > 0.1 -> 2 pairs / 1;
    # row 1: 0.346, 0.775, 0.332, 1.113 all > 0.1 -> 4 pairs / 2 positives = 2
    tau = 0.1
    sim = torch.tensor([[0.5, 0.4, 0.1], [0.1, 0.3, 0.35]])
    pos = torch.tensor([[True, False, False], [False, True, True]])
    r0 = 1 + _g(-0.1, tau) + _g(-0.4, tau)
    assert _c(0.5, 0.1, r0, tau) < 0.1 < _c(0.5, 0.1, r0, tau) / tau  # differs by the 1/tau factor
    _check(cocos_smoothap(sim, pos, tau, threshold=0.1), [1, 0.5], 0, 1.5, 0.75)  # ECIR definition (default)
    _check(cocos_smoothap(sim, pos, tau, threshold=0.1, inv_tau=True), [2, 2], 0, 4, 2.0)
    _check(cocos("smoothap", sim, pos, {"tau": tau}, threshold=0.1, inv_tau=True), [2, 2], 0, 4, 2.0)
    # with the 1/tau factor, threshold t counts what threshold t * tau counts without it
    s, p = _random(3)
    for thr in (0.05, 0.5, 2.0):
        a = cocos_smoothap(s, p, 0.05, threshold=thr, inv_tau=True)["counts"]
        b = cocos_smoothap(s, p, 0.05, threshold=thr * 0.05)["counts"]
        assert torch.equal(a, b)


def test_run_cocos_passes_and_records_smoothap_inv_tau(tmp_path):
    """``vlp analyze cocos`` plumbing: the flag reaches the count and is written to cocos.json. An
    untrained model scores all pairs alike (G ~ 1/2, contribution ~ 0.25 / 2.5^2 = 0.04 < 0.1), so
    at threshold 0.1 only the 1/tau factor (x 100) makes pairs count."""
    from pathlib import Path

    from vlp.config import PretrainConfig, load_config, to_dict
    from vlp.lab.cocos import run_cocos
    from vlp.models.albef import ALBEF
    from vlp.weights import save_checkpoint
    from vlp.world import generate_world

    world = generate_world(tmp_path / "w", seed=1, n_train=4, n_val=1, n_test=1, progress=False)
    config = Path(__file__).resolve().parents[2] / "configs" / "pretrain" / "shapes_tiny.yaml"
    cfg = load_config(
        PretrainConfig, config, ["model.vision.depth=1", "model.text.layers=1", "model.text.fusion_layers=1"]
    )
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "ckpt", ALBEF(cfg.model), {"task": "pretrain", "config": to_dict(cfg), "step": 0})
    over = ["data.batch_size=4"]
    recs = {
        flag: run_cocos(
            ckpt,
            [str(world["pretrain"])],
            "smoothap",
            tmp_path / str(flag),
            threshold=0.1,
            overrides=over,
            show_progress=False,
            smoothap_inv_tau=flag,
        )
        for flag in (False, True)
    }
    for flag, rec in recs.items():
        assert rec["smoothap_inv_tau"] is flag
        assert json.loads((tmp_path / str(flag) / "cocos.json").read_text())["smoothap_inv_tau"] is flag
    for d in ("i2t", "t2i"):
        key = f"{d}_count_total"
        assert recs[False]["stats"][key]["mean"] == 0.0 < recs[True]["stats"][key]["mean"]
