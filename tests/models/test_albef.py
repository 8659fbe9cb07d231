"""Every attention in the model runs through PyTorch's scaled_dot_product_attention (fused kernels)."""

import torch
import torch.nn.functional as F

from vlp.config import ModelConfig, TextConfig, VisionConfig
from vlp.models.albef import ALBEF


def test_vision_text_and_fusion_attention_use_sdpa(monkeypatch):
    model = ALBEF(ModelConfig(vision=VisionConfig(depth=1), text=TextConfig(layers=1, fusion_layers=1))).eval()
    assert all(block.attn.fused_attn for block in model.vision.blocks)
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    ids = torch.randint(1000, 2000, (2, 5))
    with torch.no_grad():
        img = model.encode_image(torch.randn(2, 3, 64, 64))
        txt = model.encode_text(ids, torch.ones_like(ids))
        model.fuse(txt.hidden, txt.mask, img.tokens)
    # 1 ViT block + 1 text layer + 1 fusion layer (self- and cross-attention)
    assert len(calls) == 4
