"""The SNLI-VE task: ALBEF's distilled 3-way loss on a hand-worked case, and a real backward step."""

import math

import pytest
import torch

from tests.helpers import narrow_model_config
from vlp.models.ve import VEModel
from vlp.tasks.ve import VETask


def tiny() -> VEModel:
    torch.manual_seed(0)
    return VEModel(narrow_model_config(dropout=0.0))


def batch(b: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "images": torch.randn(b, 3, 32, 32, generator=g),
        "input_ids": torch.randint(1000, 2000, (b, 6), generator=g),
        "attention_mask": torch.ones(b, 6, dtype=torch.long),
        "labels": torch.arange(b) % 3,
    }


def test_loss_hand_worked(monkeypatch):
    """Online softmax [1/4, 1/2, 1/4], label 1: CE = ln 2; momentum uniform: soft CE = (2 ln 4 + ln 2) / 3
    = 5/3 ln 2; alpha 0.4: 0.6 ln 2 + 0.4 * 5/3 ln 2."""
    model = tiny()
    calls = []

    def classify(images, ids, mask, momentum=False):
        calls.append(momentum)
        row = [0.0, 0.0, 0.0] if momentum else [0.0, math.log(2.0), 0.0]
        return torch.tensor([row], requires_grad=not momentum)

    monkeypatch.setattr(model, "classify", classify)
    b = {**batch(1), "labels": torch.tensor([1])}
    out = VETask(model, alpha=0.4)(b)
    assert float(out["loss"].detach()) == pytest.approx(0.6 * math.log(2) + 0.4 * 5 / 3 * math.log(2), rel=1e-6)
    assert calls == [False, True] and float(out["acc"]) == 1.0 and float(out["alpha"]) == pytest.approx(0.4)
    calls.clear()
    out = VETask(model, alpha=0.4, distill=False)(b)
    assert float(out["loss"].detach()) == pytest.approx(math.log(2), rel=1e-6) and calls == [False]  # no momentum pass
    out = VETask(model, alpha=0.4, alpha_ramp_steps=4)(b, step=1)  # ramp: alpha 0.1
    assert float(out["loss"].detach()) == pytest.approx(0.9 * math.log(2) + 0.1 * 5 / 3 * math.log(2), rel=1e-6)


def test_backward_reaches_online_only_and_requires_ve_model():
    model = tiny()
    out = VETask(model, alpha=0.4)(batch())
    out["loss"].backward()
    assert model.cls_head[0].weight.grad is not None and model.vision.patch_embed.proj.weight.grad is not None
    assert all(p.grad is None for p in model.momentum.parameters())
    assert 0.0 <= float(out["acc"]) <= 1.0 and out["ve"].shape == ()
    with pytest.raises(ValueError, match="VEModel"):
        VETask(torch.nn.Linear(2, 2))
