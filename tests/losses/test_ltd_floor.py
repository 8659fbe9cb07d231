"""The LTD reconstruction floor (vlp.losses.ltd.reconstruction_floor) on hand-worked targets, and the
multiplier's warm-up (loss.ltd.multiplier.warmup_steps)."""

import math

import pytest
import torch
import torch.nn.functional as F

from vlp.config import MultiplierConfig
from vlp.errors import ConfigError
from vlp.losses.ltd import LagrangeMultiplier, reconstruction_floor


def test_floor_hand_worked() -> None:
    y = torch.tensor([[1.0, 0.0], [0.0, 3.0], [2.0, 0.0]])  # scale is irrelevant: unit targets
    # group {0, 1}: best prediction (1, 1)/sqrt 2, cos 1/sqrt 2 each; group {2} alone: 0
    assert reconstruction_floor(y, torch.tensor([5, 5, 9])) == pytest.approx(2 * (1 - 1 / math.sqrt(2)) / 3)
    # one group (the caption-ignorant decoder): sum of unit targets (2, 1), cos 2/sqrt5, 1/sqrt5, 2/sqrt5
    assert reconstruction_floor(y, torch.zeros(3, dtype=torch.long)) == pytest.approx(1 - math.sqrt(5) / 3)
    assert reconstruction_floor(y, torch.arange(3)) == 0.0  # every caption told apart
    opposite = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    assert reconstruction_floor(opposite, torch.zeros(2, dtype=torch.long)) == pytest.approx(1.0)


def test_no_prediction_per_group_beats_the_floor() -> None:
    g = torch.Generator().manual_seed(0)
    y, groups = torch.randn(40, 6, generator=g), torch.randint(0, 5, (40,), generator=g)
    floor = reconstruction_floor(y, groups)
    for _ in range(50):
        p = torch.randn(5, 6, generator=g)[groups]
        assert (1 - F.cosine_similarity(p, y, dim=-1)).mean().item() >= floor
    with pytest.raises(ValueError):
        reconstruction_floor(y, groups[:-1])


def test_multiplier_warmup_holds_lambda_then_starts_a_fresh_momentum() -> None:
    cfg = MultiplierConfig(init=1.0, lr=0.1, momentum=0.9, dampening=0.9, warmup_steps=3)
    lam, plain = LagrangeMultiplier(cfg), LagrangeMultiplier(MultiplierConfig(init=1.0, lr=0.1))
    grads = [20.0, 15.0, 9.0, -0.5, -0.5, 2.0]
    seen = []
    for k, g in enumerate(grads):
        lam.lam.grad = torch.tensor([g])
        lam.step()
        seen.append(lam.lam.item())
        if k >= 3:  # after the warm-up: the plain multiplier fed only the post-warm-up gradients
            plain.lam.grad = torch.tensor([g])
            plain.step()
            assert lam.lam.item() == pytest.approx(plain.lam.item(), abs=1e-7)
    assert seen[:3] == [1.0, 1.0, 1.0] and lam.steps.item() == 6
    assert seen[3] == pytest.approx(1.0 - 0.1 * 0.5)  # buf = g at the first step after the warm-up
    lam.lam.grad = torch.tensor([5.0])
    lam.step(skipped=torch.tensor(True))  # a skipped step still counts for nothing
    assert lam.steps.item() == 6
    with pytest.raises(ConfigError, match="warmup_steps"):
        MultiplierConfig(warmup_steps=-1)
