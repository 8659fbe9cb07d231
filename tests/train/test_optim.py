import math

import pytest

from vlp.config import ModelConfig, TrainConfig
from vlp.models.albef import ALBEF
from vlp.train.optim import lr_at, param_groups


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainConfig(steps=110, lr=1e-3, min_lr=1e-5, warmup_steps=10, warmup_lr=1e-4)
    assert lr_at(0, cfg) == pytest.approx(1e-4)
    assert lr_at(5, cfg) == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4))
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(60, cfg) == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5) * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(110, cfg) == pytest.approx(1e-5)
    assert lr_at(500, cfg) == pytest.approx(1e-5)


def test_no_decay_on_norms_biases_pos_embed_cls_temp_and_no_momentum_params():
    model = ALBEF(ModelConfig(queue_size=8))
    decay, no_decay = param_groups(model, 0.02)
    names = {id(p): n for n, p in model.named_parameters()}
    nd = {names[id(p)] for p in no_decay["params"]}
    d = {names[id(p)] for p in decay["params"]}
    assert {"temp", "vision.pos_embed", "vision.cls_token"} <= nd
    assert all(
        n.endswith("bias") or "norm" in n.lower() or n in ("temp", "vision.pos_embed", "vision.cls_token") for n in nd
    )
    assert "vision.blocks.0.attn.qkv.weight" in d and "fusion.layer.0.crossattention.self.kv.weight" in d
    assert not any(n.startswith("momentum.") for n in d | nd)
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == n_trainable
    assert decay["weight_decay"] == 0.02 and no_decay["weight_decay"] == 0.0


def test_lr_scale_groups_and_schedule():
    """SRCL's recipe: ViT at a tenth of the BERT rate (train.lr_scale={vision: 0.1}); the longest
    matching path wins; the schedule multiplies each group's rate."""
    import torch

    from vlp.errors import ConfigError
    from vlp.train.optim import build_optimizer, lr_scale_of
    from vlp.train.step import set_lr

    model = ALBEF(ModelConfig(queue_size=8))
    assert lr_scale_of("vision.blocks.0.attn.qkv.weight", {"vision": 0.1}) == ("vision", 0.1)
    assert lr_scale_of("vision_proj.weight", {"vision": 0.1}) == (None, 1.0)  # whole components only
    assert lr_scale_of("vision.blocks.0.norm1.weight", {"vision": 0.1, "vision.blocks.0": 0.5}) == (
        "vision.blocks.0",
        0.5,
    )
    cfg = TrainConfig(steps=100, lr=1e-4, warmup_steps=0, min_lr=1e-4, lr_scale={"vision": 0.1})
    opt = build_optimizer(model, cfg)
    assert [(g["lr_scale"], g["weight_decay"]) for g in opt.param_groups] == [
        (0.1, 0.02),
        (1.0, 0.02),
        (0.1, 0.0),
        (1.0, 0.0),
    ]
    names = {id(p): n for n, p in model.named_parameters()}
    for g in opt.param_groups:
        assert all(names[id(p)].startswith("vision.") == (g["lr_scale"] == 0.1) for p in g["params"])
    assert set_lr(opt, 10, cfg) == pytest.approx(1e-4)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-5, 1e-4, 1e-5, 1e-4])
    # one step moves the ViT 10x less than an equal-gradient text weight would (Adam: step ~ lr)
    before = model.vision.blocks[0].mlp.fc1.weight.detach().clone(), model.text_proj.weight.detach().clone()
    for p in model.parameters():
        p.grad = torch.ones_like(p) if p.requires_grad else None
    opt.step()
    moved = [
        (after.detach() - b).abs().max().item()
        for b, after in zip(before, (model.vision.blocks[0].mlp.fc1.weight, model.text_proj.weight))
    ]
    assert moved[0] == pytest.approx(moved[1] * 0.1, rel=0.05)
    with pytest.raises(ConfigError, match=r"'train.lr_scale': \['visoin'\] match no trainable parameter"):
        param_groups(model, 0.02, {"visoin": 0.1})
    with pytest.raises(ConfigError, match=r"'train.lr_scale.vision': got 0.0"):
        TrainConfig(lr_scale={"vision": 0.0})
