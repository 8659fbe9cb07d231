import math

import pytest
import torch

from tests.tasks.test_pretrain import make_batch, tiny, unit
from vlp.config import LossConfig, SRCLConfig
from vlp.errors import ConfigError
from vlp.models.albef import ImageFeatures, TextFeatures
from vlp.tasks.objectives import TokenInfo, itc_step
from vlp.tasks.pretrain import PretrainTask
from vlp.tasks.regulation import HelperFeatures, SRCLRegulator

TOKENS = TokenInfo(30522, 103, (0, 101, 102))


def helper_feats(image_ids, dim=6):
    """Deterministic helper features per image id (so queue slots can be checked by id)."""
    img = torch.stack([unit(dim, seed=100 + i) for i in image_ids])
    txt = torch.stack([unit(dim, seed=500 + i) for i in image_ids])
    return img, txt


def srcl_task(queue_size, mode="srcl", total_steps=10, **srcl):
    model = tiny(queue_size=queue_size)
    cfg = SRCLConfig(**{"delta": 1.0, **srcl})
    loss = LossConfig(alpha_ramp_steps=1, regulation=mode, srcl=cfg)
    reg = SRCLRegulator(cfg, mode, total_steps, queue_size, helper_dim=6)
    return PretrainTask(model, loss, TOKENS, regulator=reg), model, reg


def test_helper_queue_stays_aligned_with_momentum_queue_across_wraparound():
    task, model, reg = srcl_task(queue_size=5, total_steps=100)
    seen = []
    for step in range(4):  # 4 batches of 3 into 5 slots: wraps around twice
        ids = [10 * step + k for k in range(3)]
        batch = make_batch(ids)
        batch["helper_image"], batch["helper_text"] = helper_feats(ids)
        with torch.no_grad():
            out = task(batch, step=step)
        assert math.isfinite(float(out["loss"]))
        seen += ids
    assert reg.queue.ptr.item() == model.queue.ptr.item() == 12 % 5
    assert torch.equal(reg.queue.ids, model.queue.ids)
    assert sorted(model.queue.ids.tolist()) == sorted(seen[-5:])
    exp_img, exp_txt = helper_feats(model.queue.ids.tolist())
    assert torch.allclose(reg.queue.get("image"), exp_img) and torch.allclose(reg.queue.get("text"), exp_txt)


def test_alpha_h_endpoints_and_zero_in_finetuning():
    cfg = SRCLConfig(delta=1.0)
    reg = SRCLRegulator(cfg, "srcl", total_steps=200, queue_size=4, helper_dim=6)
    assert reg.alpha_h(0) == 1.0 and reg.alpha_h(100) == 0.5 and reg.alpha_h(200) == 0.0
    short = SRCLRegulator(SRCLConfig(helper_span=50, delta=1.0), "srcl", total_steps=200, queue_size=4, helper_dim=6)
    assert short.alpha_h(25) == 0.5 and short.alpha_h(50) == 0.0 and short.alpha_h(199) == 0.0
    ft = SRCLRegulator(cfg, "srcl", total_steps=200, queue_size=4, helper_dim=6, finetune=True)
    assert ft.alpha_h(0) == 0.0 and not ft.uses_helper and ft.queue.size == 0
    batch = make_batch([0, 1])  # no helper features, no helper: fine-tuning does not need one
    assert ft.helper_features(batch, 0) is None
    assert reg.helper_features(make_batch([0, 1]), 200) is None  # past the span
    with pytest.raises(ConfigError, match="helper_features"):
        reg.helper_features(make_batch([0, 1]), 0)


def test_regulated_itc_with_uniform_weights_is_the_plain_loss():
    model = tiny(queue_size=3)
    model.queue.enqueue(torch.tensor([7, 8, 9]), image=unit(3, 8, seed=1), text=unit(3, 8, seed=2))
    v, t, vm, tm = unit(2, 8, seed=3), unit(2, 8, seed=4), unit(2, 8, seed=5), unit(2, 8, seed=6)
    ids = torch.tensor([7, 1])
    feats = ImageFeatures(None, v), TextFeatures(None, None, t)
    plain = itc_step(model, *feats, vm, tm, ids, alpha=0.4).loss
    h = HelperFeatures(*helper_feats([7, 1]))
    for mode, kw in (("srcl", dict(delta=0.0)), ("removal", dict(threshold=0.0, delta=1.0))):
        reg = SRCLRegulator(SRCLConfig(**kw), mode, total_steps=10, queue_size=3, helper_dim=6)

        def regulate(ci, ct, pos, same, reg=reg):
            return reg.regulate(ci, ct, pos, same, h, step=3)

        out = itc_step(model, *feats, vm, tm, ids, alpha=0.4, regulate=regulate)
        assert out.loss.item() == pytest.approx(plain.item(), abs=1e-6)
        assert float(out.stats["srcl_w_mean"]) == pytest.approx(1.0, abs=1e-6)


def test_regulate_uses_helper_then_live_and_logs_statistics():
    torch.manual_seed(0)
    b, q = 3, 4
    reg = SRCLRegulator(SRCLConfig(delta=4.0), "srcl", total_steps=10, queue_size=q, helper_dim=6)
    h = HelperFeatures(*helper_feats([0, 1, 2]))
    q_img, q_txt = helper_feats([0, 5, 6, 7])
    q_txt[0] = h.image[0]  # queue slot 0: a caption of image 0 that the helper finds identical to it
    reg.enqueue(torch.tensor([0, 5, 6, 7]), HelperFeatures(q_img, q_txt))
    cos_live = torch.rand(b, b + q) * 2 - 1
    pos = torch.zeros(b, b + q, dtype=torch.bool)
    pos[range(b), range(b)] = True
    same = torch.zeros_like(pos)
    same[0, b] = True  # queue slot 0 holds another caption of image 0: a false negative
    at_start = reg.regulate(cos_live, cos_live, pos, same, h, step=0)  # alpha_h = 1: helper only
    cos_h = h.image @ torch.cat([h.text, reg.queue.get("text")]).T
    ref = torch.softmax(4.0 * torch.exp(-cos_h).masked_fill(pos, float("-inf")), 1) * (b + q - 1)
    assert torch.allclose(at_start.w_i2t[~pos], ref[~pos], atol=1e-5)
    # the false negative has helper cosine 1: the smallest weight of its row
    assert at_start.w_i2t[0, b] == at_start.w_i2t[0][~pos[0]].min()
    assert float(at_start.stats["srcl_w_same_image"]) == pytest.approx(
        float((at_start.w_i2t[0, b] + at_start.w_t2i[0, b]) / 2), rel=1e-5
    )
    at_end = reg.regulate(cos_live, cos_live, pos, same, None, step=10)  # alpha_h = 0: live only
    ref_live = torch.softmax(4.0 * torch.exp(-cos_live).masked_fill(pos, float("-inf")), 1) * (b + q - 1)
    assert torch.allclose(at_end.w_i2t[~pos], ref_live[~pos], atol=1e-5)
    assert float(at_start.stats["srcl_alpha_h"]) == 1.0 and float(at_end.stats["srcl_alpha_h"]) == 0.0
    assert set(at_start.stats) >= {"srcl_w_mean", "srcl_w_min", "srcl_w_below_0_2", "srcl_w_below_0_7"}
    assert math.isnan(
        float(reg.regulate(cos_live, cos_live, pos, torch.zeros_like(pos), h, 0).stats["srcl_w_same_image"])
    )


def test_removal_task_drops_negatives_and_trains():
    task, model, reg = srcl_task(queue_size=0, mode="removal", threshold=0.7, delta=4.0)
    batch = make_batch([0, 1, 2, 3])
    batch["helper_image"], batch["helper_text"] = helper_feats([0, 1, 2, 3])
    out = task(batch, step=2)  # distillation on (alpha 0.4): soft targets on removed columns are reassigned
    assert float(out["alpha"]) == pytest.approx(0.4) and float(out["srcl_alpha_h"]) == pytest.approx(0.8)
    assert 0.0 < float(out["srcl_removed"]) < 1.0
    assert float(out["srcl_removed"]) == pytest.approx(float(out["srcl_w_below_0_7"]))  # exactly those below 0.7
    out["loss"].backward()
    assert math.isfinite(out["loss"].item()) and model.vision_proj.weight.grad is not None
    assert all(p.grad is None for p in reg.parameters())  # nothing in the regulator is trained
