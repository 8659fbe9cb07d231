"""The analytic FLOP model against torch's FLOP counter, and against the reference inventory."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vlp.config import PretrainConfig, load_config
from vlp.flops import step_flops, step_terms
from vlp.models.albef import ALBEF
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.pretrain import PretrainTask

B, T = 8, 20


def _counted_per_pair(cfg: PretrainConfig) -> float:
    torch.manual_seed(0)
    task = PretrainTask(ALBEF(cfg.model), cfg.loss, TokenInfo(30522, 103, (0, 101, 102)))
    ids = torch.randint(1000, 2000, (B, T), generator=torch.Generator().manual_seed(0))
    ids[:, 0], ids[:, -1] = 101, 102
    batch = dict(images=torch.randn(B, 3, 64, 64), input_ids=ids, attention_mask=torch.ones(B, T, dtype=torch.long),
                 image_ids=torch.arange(B))
    with FlopCounterMode(display=False) as counter:
        task(batch, step=5)["loss"].backward()  # step 5 > alpha ramp: distillation passes run
    return counter.get_total_flops() / B


@pytest.mark.parametrize("mlm, tolerance", [(0, 0.015), (1, 0.03)])  # MLM: the masked count is random
def test_analytic_step_matches_the_counted_matmuls_of_a_tiny_step(mlm, tolerance):
    cfg = load_config(PretrainConfig, "configs/pretrain/shapes_tiny.yaml",
                      [f"data.batch_size={B}", "model.queue_size=32", f"loss.mlm={mlm}", "loss.alpha_ramp_steps=1"])
    counted = _counted_per_pair(cfg)
    assert step_flops(cfg, T) == pytest.approx(counted, rel=tolerance)
    assert ("mlm head (online, masked positions)" in step_terms(cfg, T)) == bool(mlm)


def test_base_config_matches_the_reference_inventory():
    # ALBEF base (ViT-B/16 at 256 px, BERT 6+6, t = 30), K/V once per image and MLM head at the
    # masked positions: 262.4 GFLOP per pair in the performance reference.
    cfg = load_config(PretrainConfig, None, ["model.vision.preset=base", "model.text.preset=base",
                                             "model.embed_dim=256", "model.queue_size=65536", "data.batch_size=64"])
    terms = step_terms(cfg, 30)
    assert sum(terms.values()) / 1e9 == pytest.approx(262.4, rel=0.005)
    assert terms["vit (online)"] / 1e9 == pytest.approx(139.2, rel=0.005)
    assert terms["vit (momentum)"] / 1e9 == pytest.approx(46.4, rel=0.005)
