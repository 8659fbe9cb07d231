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
    assert all(n.endswith("bias") or "norm" in n.lower() or n in ("temp", "vision.pos_embed", "vision.cls_token") for n in nd)
    assert "vision.blocks.0.attn.qkv.weight" in d and "fusion.layer.0.crossattention.self.key.weight" in d
    assert not any(n.startswith("momentum.") for n in d | nd)
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == n_trainable
    assert decay["weight_decay"] == 0.02 and no_decay["weight_decay"] == 0.0
