import math

import pytest
import torch

from vlp.config import LossConfig, ModelConfig, TextConfig, VisionConfig
from vlp.models.albef import ALBEF, ImageFeatures, TextFeatures
from vlp.tasks.objectives import TokenInfo, itc_step
from vlp.tasks.pretrain import PretrainTask


def tiny(queue_size=4, **kw) -> ALBEF:
    torch.manual_seed(0)
    return ALBEF(
        ModelConfig(
            vision=VisionConfig(depth=1),
            text=TextConfig(layers=1, fusion_layers=1),
            queue_size=queue_size,
            embed_dim=8,
            **kw,
        )
    )


def unit(*shape, seed=0):
    return torch.nn.functional.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_itc_step_against_brute_force_with_queue_and_distillation():
    model = tiny(queue_size=3)
    qi, qt = unit(3, 8, seed=1), unit(3, 8, seed=2)
    model.queue.enqueue(torch.tensor([7, 8, 9]), image=qi, text=qt)
    b = 2
    v = unit(b, 8, seed=3).requires_grad_()
    t = unit(b, 8, seed=4).requires_grad_()
    vm, tm = unit(b, 8, seed=5), unit(b, 8, seed=6)
    alpha, tau = 0.4, model.temp.item()
    out = itc_step(model, ImageFeatures(None, v), TextFeatures(None, None, t), vm, tm, torch.tensor([7, 1]), alpha)

    def direction(anchor, anchor_m, bank):
        total = 0.0
        for i in range(b):
            logits = torch.stack([anchor[i] @ c / tau for c in bank])
            m_logits = torch.stack([anchor_m[i] @ c / tau for c in bank])
            target = alpha * torch.softmax(m_logits, 0) + (1 - alpha) * torch.eye(len(bank))[i]
            total = total - (target * torch.log_softmax(logits, 0)).sum()
        return total / b

    ref = 0.5 * (direction(v, vm, torch.cat([tm, qt])) + direction(t, tm, torch.cat([vm, qi])))
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-5)
    g_ours = torch.autograd.grad(out.loss, [v, t], retain_graph=True)
    g_ref = torch.autograd.grad(ref, [v, t])
    for a, r in zip(g_ours, g_ref):
        assert torch.allclose(a, r, atol=1e-5)
    # image-id positives: queue entry with id 7 becomes a second positive of row 0
    pos = itc_step(
        model, ImageFeatures(None, v), TextFeatures(None, None, t), vm, tm, torch.tensor([7, 1]), 0.0, "image"
    )
    logits0 = torch.cat([tm, qt]) @ v[0] / tau
    lsm = torch.log_softmax(logits0, 0)
    assert pos.sim_i2t.shape == (2, 5)
    row0 = -(lsm[0] + lsm[2]) / 2
    assert row0.item() == pytest.approx(-(torch.log_softmax(pos.sim_i2t[0], 0)[[0, 2]].mean()).item(), abs=1e-6)


def test_momentum_ramp():
    constant, ramp = tiny(), tiny(momentum_warmup_steps=100)
    assert constant.momentum_at(1) == 0.995
    assert ramp.momentum_at(0) == 0.0 and ramp.momentum_at(50) == pytest.approx(0.4975)
    assert ramp.momentum_at(100) == ramp.momentum_at(1000) == pytest.approx(0.995)


def make_batch(image_ids, t=6):
    b = len(image_ids)
    ids = torch.randint(1000, 2000, (b, t), generator=torch.Generator().manual_seed(0))
    ids[:, 0], ids[:, -1] = 101, 102
    return dict(
        images=torch.randn(b, 3, 64, 64),
        input_ids=ids,
        attention_mask=torch.ones(b, t, dtype=torch.long),
        image_ids=torch.tensor(image_ids),
    )


@pytest.mark.parametrize("image_ids", [[0], [5, 5, 5], [0, 1, 2, 3]])
def test_pretrain_step_is_finite_for_degenerate_batches(image_ids):
    for q in (0, 4):
        model = tiny(queue_size=q)
        task = PretrainTask(model, LossConfig(alpha_ramp_steps=1), TokenInfo(30522, 103, (0, 101, 102)))
        out = task(make_batch(image_ids), step=5)
        assert all(math.isfinite(float(v.detach())) for v in out.values())
        out["loss"].backward()
        assert model.vision.patch_embed.proj.weight.grad is not None
        assert model.itm_head.weight.grad is not None
        task.after_optimizer_step(1)
        if q:
            assert model.queue.ptr.item() == len(image_ids) % q


def test_grad_checkpointing_gives_the_same_loss_and_gradients_and_recomputes_the_layers():
    def run(enable: bool):
        model = tiny()
        if enable:
            model.set_grad_checkpointing(True)
        calls = {"fusion": 0, "vit": 0}
        # pre-hooks: a non-reentrant recomputation stops as soon as it has what backward needs,
        # before the module's forward hooks would run
        model.fusion.layer[0].register_forward_pre_hook(lambda *_: calls.__setitem__("fusion", calls["fusion"] + 1))
        model.vision.blocks[0].register_forward_pre_hook(lambda *_: calls.__setitem__("vit", calls["vit"] + 1))
        task = PretrainTask(model, LossConfig(alpha_ramp_steps=1), TokenInfo(30522, 103, (0, 101, 102)))
        torch.manual_seed(1)
        out = task(make_batch([0, 1, 2, 3]), step=5)
        forward_calls = dict(calls)
        out["loss"].backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return out["loss"].item(), grads, forward_calls, calls

    loss0, grads0, fwd0, all0 = run(False)
    loss1, grads1, fwd1, all1 = run(True)
    assert loss1 == loss0 and grads1.keys() == grads0.keys() and len(grads0) > 50
    for name, g in grads0.items():
        assert torch.allclose(grads1[name], g, atol=1e-6, rtol=1e-5), name
    assert fwd1 == fwd0 and all0 == fwd0  # without checkpointing, backward runs no forward
    assert all1 == {k: 2 * v for k, v in fwd1.items()}  # each online pass recomputed once in backward


def test_compiled_blocks_give_the_same_loss_and_gradients():
    """Regional compilation (``train.compile``): dynamo captures every block (the "eager" backend:
    capture without code generation, so the numbers must be identical) and nothing else changes."""
    from torch._dynamo.utils import counters

    def run(compiled: bool):
        model = tiny()
        n = model.compile_blocks("eager") if compiled else 0
        task = PretrainTask(model, LossConfig(alpha_ramp_steps=1), TokenInfo(30522, 103, (0, 101, 102)))
        torch.manual_seed(1)
        out = task(make_batch([0, 1, 2, 3]), step=5)
        out["loss"].backward()
        return n, out["loss"].item(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    torch._dynamo.reset()
    counters.clear()
    _, loss0, grads0 = run(False)
    n, loss1, grads1 = run(True)
    # online + momentum: 1 ViT block, 1 text layer, 1 fusion layer each
    assert n == 6
    assert counters["stats"]["unique_graphs"] >= 3  # a graph per block type at least
    assert loss1 == pytest.approx(loss0, rel=1e-6) and grads1.keys() == grads0.keys()
    for name, g in grads0.items():
        assert torch.allclose(grads1[name], g, atol=1e-6, rtol=1e-5), name
    torch._dynamo.reset()


def test_uint8_images_normalised_on_the_device_equal_the_loader_normalisation():
    """``data.image.uint8``: the loader ships uint8, PixelNorm normalises where the model runs; the
    pixels and the pretraining loss are those of the float pipeline."""
    from PIL import Image

    from vlp.config import ImageConfig
    from vlp.preprocess.transforms import PixelNorm, train_transform

    rng = torch.Generator().manual_seed(0)
    pics = [
        Image.fromarray(torch.randint(0, 256, (40, 48, 3), generator=rng, dtype=torch.uint8).numpy()) for _ in range(4)
    ]
    plain = dict(crop_scale=None, hflip=False, randaugment=False)  # deterministic: the same pixels both ways
    as_float = train_transform(64, ImageConfig(**plain))
    as_uint8 = train_transform(64, ImageConfig(**plain, uint8=True))
    floats = torch.stack([as_float(p) for p in pics])
    bytes_ = torch.stack([as_uint8(p) for p in pics])
    assert bytes_.dtype == torch.uint8 and floats.dtype == torch.float32
    norm = PixelNorm(ImageConfig())
    assert torch.allclose(norm(bytes_), floats, atol=1e-5)
    assert norm(floats) is floats  # float images were normalised by the loader: untouched

    losses = []
    for images, pixel_norm in ((floats, None), (bytes_, norm)):
        task = PretrainTask(tiny(), LossConfig(alpha_ramp_steps=1), TokenInfo(30522, 103, (0, 101, 102)))
        task.pixel_norm = pixel_norm
        losses.append(task({**make_batch([0, 1, 2, 3]), "images": images}, step=5)["loss"].item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    task.pixel_norm = None
    with pytest.raises(ValueError, match="uint8"):
        task({**make_batch([0, 1, 2, 3]), "images": bytes_}, step=5)
