"""A new loss is one small file (issue 53): the cosine hinge of ``tests/losses/toy_cosine_hinge.py``,
about 40 lines of public vlp names, registers, computes what a hand computation gives, counts COCOS
and runs ``vlp analyze cocos``; the habits lint passes on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import load_script
from tests.losses.toy_cosine_hinge import CosineHinge, HingeParams
from vlp.config import ContrastiveConfig
from vlp.losses import LOSSES, CocosInputs, ContrastiveInputs, build_loss

ROOT = Path(__file__).resolve().parents[2]
TOY_FILE = ROOT / "tests" / "losses" / "toy_cosine_hinge.py"
NAME = "toy_cosine_hinge"
# a dual encoder's cosines, diagonal positives
SIM = torch.tensor([[0.9, 0.5], [0.8, 0.3]])
EYE = torch.eye(2, dtype=torch.bool)


@pytest.fixture
def toy():
    with LOSSES.registered(NAME, CosineHinge) as cls:
        yield cls
    assert NAME not in LOSSES


def test_the_toy_loss_matches_a_hand_computation(toy):
    # margin 0.2. i2t: q0 0.2 - 0.9 + 0.5 < 0, q1 0.2 - 0.3 + 0.8 = 0.7 -> 0.35 over 2 triples;
    # t2i (SIM.T): q0 0.2 - 0.9 + 0.8 = 0.1, q1 0.2 - 0.3 + 0.5 = 0.4 -> 0.25; mean 0.3.
    loss = build_loss(ContrastiveConfig(name=NAME))
    assert isinstance(loss, CosineHinge) and loss.params == HingeParams(0.2)
    assert loss(ContrastiveInputs.dual(SIM, EYE)).item() == pytest.approx(0.3)
    # margin 0 from the config: i2t 0.5 / 2, t2i (0 + 0.2) / 2 -> 0.175
    zero = build_loss(ContrastiveConfig(name=NAME, params={"margin": 0}))
    assert zero(ContrastiveInputs.dual(SIM, EYE)).item() == pytest.approx(0.175)
    # COCOS: violating pairs per query (i2t 0 and 1; t2i 1 and 1)
    stats = loss.cocos(CocosInputs(SIM, EYE))
    assert stats["counts"].tolist() == [0, 1] and (stats["zeros"], stats["count_mean"]) == (1.0, 1.0)
    assert loss.cocos(CocosInputs(SIM.T, EYE))["counts"].tolist() == [1, 1]
    with pytest.raises(ValueError, match="log_weights are only supported"):
        loss(ContrastiveInputs.dual(SIM, EYE, log_weights_i2t=torch.zeros(2, 2)))


def test_the_toy_loss_runs_vlp_analyze_cocos(toy, tmp_path):
    from vlp.cli import main
    from vlp.config import PretrainConfig, load_config, to_dict
    from vlp.models.albef import ALBEF
    from vlp.weights import save_checkpoint
    from vlp.world import generate_world

    world = generate_world(tmp_path / "w", seed=1, n_train=4, n_val=1, n_test=1, progress=False)
    tiny = ["model.vision.depth=1", "model.text.layers=1", "model.text.fusion_layers=1"]
    cfg = load_config(PretrainConfig, ROOT / "configs" / "pretrain" / "shapes_tiny.yaml", tiny)
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "ckpt", ALBEF(cfg.model), {"task": "pretrain", "config": to_dict(cfg), "step": 0})
    args = ["analyze", "cocos", "--checkpoint", str(ckpt), "--data", str(world["pretrain"]), "--loss", NAME]
    out = tmp_path / "cocos"
    assert main([*args, "--out", str(out), "data.batch_size=4", "loss.contrastive.params.margin=2.5"]) == 0
    rec = json.loads((out / "cocos.json").read_text())
    assert rec["loss"] == NAME and rec["hyperparameters"] == {"margin": 2.5}
    # a margin of 2.5 exceeds any cosine gap: every (positive, negative) pair violates it
    assert rec["stats"]["i2t_count_mean"]["mean"] == 3.0 and rec["stats"]["t2i_zeros"]["mean"] == 0.0


def test_the_toy_loss_is_a_small_file_the_habits_lint_passes():
    habits = load_script("scripts/lint/habits.py")
    assert habits.check_file(ROOT, TOY_FILE) == []
    assert len(TOY_FILE.read_text().splitlines()) <= 45
