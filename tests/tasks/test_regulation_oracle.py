"""The oracle helper in the SRCL regulator, the α_h floor, and where the weights apply under
momentum distillation (``loss.srcl.weight_targets``)."""

import math

import pytest
import torch

from tests.tasks.test_pretrain import make_batch, tiny, unit
from vlp.config import SRCLConfig
from vlp.losses.contrastive import cosines
from vlp.models.albef import ImageFeatures, TextFeatures
from vlp.tasks import objectives
from vlp.tasks.objectives import itc_step
from vlp.tasks.regulation import HelperFeatures, Regulation, SRCLRegulator

# 3 texts x 3 images: text 0 is true of images 0 and 1, text 1 of image 1, text 2 of image 2
RELEVANCE = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])


def idx(*rows):
    return torch.tensor(rows, dtype=torch.float32)[:, None]


def oracle(queue_size=0, **cfg):
    return SRCLRegulator(SRCLConfig(**{"delta": 1.0, **cfg}), "srcl", 10, queue_size, helper_dim=1, relevance=RELEVANCE)


def diag(b, c):
    pos = torch.zeros(b, c, dtype=torch.bool)
    pos[range(b), range(b)] = True
    return pos


def test_oracle_weights_by_hand():
    reg = oracle(delta=1.0)
    h = HelperFeatures(idx(0, 1, 2), idx(0, 1, 2))  # pair k = (image k, text k)
    pos = diag(3, 3)
    cos_live = torch.rand(3, 3) * 2 - 1
    r = reg.regulate(cos_live, cos_live, pos, torch.zeros_like(pos), h, step=0)  # alpha_h = 1: oracle only
    # image 1's negatives: text 0 (true of image 1: s = e, u = 1/e) and text 2 (s = 1, u = 1)
    e = math.e
    w_fn, w_tn = 2 * math.exp(1 / e) / (math.exp(1 / e) + e), 2 * e / (math.exp(1 / e) + e)
    assert r.w_i2t[1].tolist() == pytest.approx([w_fn, 1.0, w_tn], rel=1e-6)
    assert w_fn < 1 < w_tn  # the false negative gets the lower weight
    # text 0's negatives: image 1 (text 0 is true of it) and image 2
    assert r.w_t2i[0].tolist() == pytest.approx([1.0, w_fn, w_tn], rel=1e-6)
    # rows without false negatives: every negative has relevance 0, weight 1
    assert r.w_i2t[0].tolist() == pytest.approx([1.0, 1.0, 1.0]) and r.w_t2i[2].tolist() == pytest.approx([1.0] * 3)
    assert float(r.stats["srcl_w_true_false_negatives"]) == pytest.approx(w_fn, rel=1e-6)


def test_oracle_mixes_with_the_live_cosine():
    reg = oracle(delta=2.0, alpha_h_end=0.5, helper_span=4)
    h = HelperFeatures(idx(0, 1, 2), idx(0, 1, 2))
    pos = diag(3, 3)
    cos_live = torch.tensor([[0.9, 0.1, -0.2], [0.3, 0.8, 0.4], [0.0, -0.5, 0.7]])
    r = reg.regulate(cos_live, cos_live.T.contiguous(), pos, torch.zeros_like(pos), h, step=100)
    assert reg.alpha_h(100) == 0.5
    # image 1: s = 0.5 exp(rel) + 0.5 exp(cos_live) over texts 0 (rel 1) and 2 (rel 0)
    s0, s2 = 0.5 * math.e + 0.5 * math.exp(0.3), 0.5 + 0.5 * math.exp(0.4)
    z = math.exp(2 / s0) + math.exp(2 / s2)
    assert r.w_i2t[1, 0].item() == pytest.approx(2 * math.exp(2 / s0) / z, rel=1e-6)
    assert r.w_i2t[1, 2].item() == pytest.approx(2 * math.exp(2 / s2) / z, rel=1e-6)


def test_oracle_queue_lookup_and_empty_slots():
    reg = oracle(queue_size=3, delta=1.0)
    assert torch.equal(reg.queue.get("image"), torch.full((3, 1), -1.0))  # empty: no sample
    reg.enqueue(torch.tensor([1]), HelperFeatures(idx(1), idx(0)))  # slot 0: image 1, text 0
    h = HelperFeatures(idx(1, 2), idx(1, 2))
    pos = diag(2, 5)
    cos = torch.zeros(2, 5)
    r = reg.regulate(cos, cos, pos, torch.zeros_like(pos), h, step=0)
    # i2t row image 1: [text 1 (pos) | text 2 | queue: text 0 (true of image 1), empty, empty]
    u = torch.tensor([1.0, 1 / math.e, 1.0, 1.0])
    assert r.w_i2t[0, 1:].tolist() == pytest.approx((4 * torch.softmax(u, 0)).tolist(), rel=1e-6)
    # t2i row text 1: [image 1 (pos) | image 2 | queue: image 1 (text 1 is true of it), empty, empty]
    assert r.w_t2i[0, 1:].tolist() == pytest.approx((4 * torch.softmax(u, 0)).tolist(), rel=1e-6)
    assert r.w_t2i[0, 2] < 1 and r.w_i2t[1, 2] == pytest.approx(1.0)  # text 0 is not true of image 2


def test_oracle_regulator_needs_index_features():
    with pytest.raises(ValueError, match="helper_dim 1"):
        SRCLRegulator(SRCLConfig(delta=1.0), "srcl", 10, 0, helper_dim=4, relevance=RELEVANCE)
    assert "relevance" not in oracle(queue_size=2).state_dict()  # not checkpointed: it comes from the cache


def test_alpha_h_floor_keeps_the_helper_after_the_span():
    reg = SRCLRegulator(SRCLConfig(helper_span=10, alpha_h_end=0.25, delta=1.0), "srcl", 100, 4, helper_dim=6)
    assert [reg.alpha_h(k) for k in (0, 5, 10, 99)] == pytest.approx([1.0, 0.625, 0.25, 0.25])
    batch = make_batch([0, 1])
    batch["helper_image"], batch["helper_text"] = unit(2, 6, seed=1), unit(2, 6, seed=2)
    assert reg.helper_features(batch, 99) is not None  # still regulating
    fade = SRCLRegulator(SRCLConfig(helper_span=10, delta=1.0), "srcl", 100, 4, helper_dim=6)
    assert fade.helper_features(batch, 10) is None  # the default fades out


# ----------------------------------------------------------------------------- weight_targets


def fixed_regulation(log_w, weight_targets, removal=False):
    def regulate(ci, ct, pos, same):
        w = log_w.exp()
        return Regulation(log_w, log_w, {}, w, w, removal, weight_targets)

    return regulate


def itc_case():
    model = tiny(queue_size=2)
    model.queue.enqueue(torch.tensor([7, 8]), image=unit(2, 8, seed=1), text=unit(2, 8, seed=2))
    v, t, vm, tm = unit(2, 8, seed=3), unit(2, 8, seed=4), unit(2, 8, seed=5), unit(2, 8, seed=6)
    feats = ImageFeatures(None, v), TextFeatures(None, None, t)
    log_w = torch.tensor([[0.0, math.log(0.12), 0.3, 0.1], [0.2, 0.0, math.log(0.5), 0.4]])
    return model, feats, vm, tm, torch.tensor([0, 1]), log_w


@pytest.mark.parametrize("weight_targets", [False, True])
def test_itc_weights_apply_to_targets_only_with_weight_targets(weight_targets):
    model, feats, vm, tm, ids, log_w = itc_case()
    alpha, temp = 0.4, model.temp.item()
    out = itc_step(model, *feats, vm, tm, ids, alpha, regulate=fixed_regulation(log_w, weight_targets))
    y = torch.eye(2, 4)
    loss = 0
    for anchors, momentum, bank in (
        (feats[0].feat, vm, torch.cat([tm, model.queue.get("text")])),
        (feats[1].feat, tm, torch.cat([vm, model.queue.get("image")])),
    ):
        m = cosines(momentum, bank) / temp
        q = torch.softmax(m + log_w, 1) if weight_targets else torch.softmax(m, 1)  # the placement under test
        target = alpha * q + (1 - alpha) * y
        logp = torch.log_softmax(cosines(anchors, bank) / temp + log_w, 1)
        loss = loss + 0.5 * -(target * logp).sum(1).mean()
    assert out.loss.item() == pytest.approx(float(loss), rel=1e-6)


def test_weighted_targets_differ_exactly_by_the_weights(monkeypatch):
    model, feats, vm, tm, ids, log_w = itc_case()
    seen = {}
    real = objectives.itc_targets

    def spy(pos, m, alpha):
        seen.setdefault(len(seen), m.clone())
        return real(pos, m, alpha)

    monkeypatch.setattr(objectives, "itc_targets", spy)
    itc_step(model, *feats, vm, tm, ids, 0.4, regulate=fixed_regulation(log_w, False))
    plain = dict(seen)  # the momentum logits m of both directions
    seen.clear()
    itc_step(model, *feats, vm, tm, ids, 0.4, regulate=fixed_regulation(log_w, True))
    assert torch.allclose(seen[0] - plain[0], log_w) and torch.allclose(seen[1] - plain[1], log_w)
    # removal: a -inf weight gives that entry target 0 (and the other entries keep their ratios)
    removed = log_w.masked_fill(torch.tensor([[False, True, False, False], [False] * 4]), float("-inf"))
    seen.clear()
    out = itc_step(model, *feats, vm, tm, ids, 0.4, regulate=fixed_regulation(removed, True, removal=True))
    t = real(torch.eye(2, 4, dtype=torch.bool), seen[0], 0.4)
    assert t[0, 1] == 0 and math.isfinite(out.loss.item())
    q_plain = torch.softmax(plain[0][0] + log_w[0], 0)
    assert torch.allclose(t[0, 2:] / 0.4, q_plain[2:] / (1 - q_plain[1]), atol=1e-6)
