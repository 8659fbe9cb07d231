"""ITC under bf16 autocast equals the fp32 loss for the same features (issue 17, defect 7).

Autocast ran the ``features @ bank.T`` products in bf16: cos/temp rounded by up to 0.03 at temp
0.07, in the logits and the distillation targets. The similarities are now fp32 products."""

from __future__ import annotations

import pytest
import torch

from vlp.config import ContrastiveConfig, ModelConfig, TextConfig, VisionConfig
from vlp.models.albef import ALBEF, ImageFeatures, TextFeatures
from vlp.tasks.objectives import global_batch_sims, itc_step


def unit(*shape, seed=0):
    return torch.nn.functional.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


@pytest.mark.parametrize("tau", [None, 0.01])
def test_itc_loss_under_bf16_autocast_equals_fp32(tau):
    torch.manual_seed(0)
    model = ALBEF(
        ModelConfig(
            vision=VisionConfig(depth=1), text=TextConfig(layers=1, fusion_layers=1), queue_size=64, embed_dim=256
        )
    )
    model.queue.enqueue(torch.arange(64) + 100, image=unit(64, 256, seed=1), text=unit(64, 256, seed=2))
    b = 16
    args = (
        ImageFeatures(None, unit(b, 256, seed=3)),
        TextFeatures(None, None, unit(b, 256, seed=4)),
        unit(b, 256, seed=5),
        unit(b, 256, seed=6),
        torch.arange(b),
        0.4,
    )
    c = ContrastiveConfig(tau=tau)
    fp32 = itc_step(model, *args, contrastive=c)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = itc_step(model, *args, contrastive=c)
        sims = global_batch_sims(args[0].feat, args[1].feat, args[2], args[3], 0.07)
    assert bf16.sim_i2t.dtype == torch.float32 and sims[0].dtype == torch.float32
    assert abs(bf16.loss.item() - fp32.loss.item()) < 1e-4
    assert torch.allclose(bf16.sim_i2t, fp32.sim_i2t, atol=1e-5)
