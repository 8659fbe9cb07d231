"""Every trainable parameter gets a gradient, whatever the objective (issue 17, defect 3).

DDP waits for a gradient of every parameter that requires one; a parameter the configured loss
never reaches (the learned temperature under a fixed tau or a zoo loss, the head of a zero-weight
loss) made every multi-process run fail at step 2. The task names them (``unused_parameters``) and
the loop freezes them (``freeze_unused``); here, for each objective, one step reaches every other
parameter. The two-process runs are in tests/train/test_distributed.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import token_batch
from vlp.config import ContrastiveConfig, LossConfig, ModelConfig, TextConfig, VisionConfig
from vlp.models.albef import ALBEF
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.pretrain import PretrainTask
from vlp.train.setup import freeze_unused

OBJECTIVES = {
    "albef": (dict(), []),
    "fixed_tau": (dict(contrastive=ContrastiveConfig(tau=0.05)), ["model.temp"]),
    "triplet": (dict(contrastive=ContrastiveConfig(name="triplet")), ["model.temp"]),
    "triplet_sh": (dict(contrastive=ContrastiveConfig(name="triplet_sh")), ["model.temp"]),
    "smoothap": (dict(contrastive=ContrastiveConfig(name="smoothap")), ["model.temp"]),
    "no_mlm": (dict(mlm=0.0), ["model.mlm_head."]),
    "no_itm": (dict(itm=0.0), ["model.itm_head."]),
    "itc_only": (dict(itm=0.0, mlm=0.0), ["model.fusion.", "model.itm_head.", "model.mlm_head."]),
    "no_itc_weight": (dict(itc=0.0), []),
}


def batch(b=4, t=7):
    return token_batch(torch.arange(b), t)


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_every_parameter_left_trainable_gets_a_gradient(name):
    loss_kw, frozen_prefixes = OBJECTIVES[name]
    torch.manual_seed(0)
    model = ALBEF(
        ModelConfig(vision=VisionConfig(depth=1), text=TextConfig(layers=1, fusion_layers=1), queue_size=8, embed_dim=8)
    )
    task = PretrainTask(
        model, LossConfig(alpha_ramp_steps=1, mlm_probability=0.5, **loss_kw), TokenInfo(30522, 103, (0, 101, 102))
    )
    frozen = freeze_unused(task)
    assert all(any(n == p or n.startswith(p) for p in frozen_prefixes) for n in frozen), frozen
    assert all(any(n == p or n.startswith(p) for n in frozen) for p in frozen_prefixes), frozen
    task(batch(), step=3)["loss"].backward()
    without = [n for n, p in task.named_parameters() if p.requires_grad and p.grad is None]
    assert without == []
