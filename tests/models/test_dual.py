"""The dual encoder's optional BatchNorm after the projection heads (model.dual.batchnorm)."""

import torch
import torch.nn.functional as F

from tests.helpers import TINY_DUAL
from vlp.config import PretrainConfig, load_config
from vlp.models.dual import DualEncoder


def model(batchnorm: bool) -> DualEncoder:
    torch.manual_seed(0)
    cfg = load_config(PretrainConfig, None, [*TINY_DUAL, f"model.dual.batchnorm={str(batchnorm).lower()}"])
    return DualEncoder(cfg.model, vocab_size=50)


def inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 50, (6, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 4:] = 0
    return torch.randn(6, 3, 32, 32, generator=g), ids, mask


def test_off_keeps_todays_keys_weights_and_features() -> None:
    off, on = model(False), model(True)
    keys = set(off.state_dict())
    assert {k for k in keys if "_proj." in k} == {f"{t}_proj.{i}.weight" for t in ("vision", "text") for i in (0, 2)}
    assert keys < set(on.state_dict())
    assert {k.rsplit(".", 1)[0] for k in set(on.state_dict()) - keys} == {"vision_proj.3", "text_proj.3"}
    assert all(torch.equal(v, on.state_dict()[k]) for k, v in off.state_dict().items())  # BN draws no random numbers
    images, ids, mask = inputs()
    off.eval()
    _, pooled = off.text(ids, mask)
    manual = F.normalize(off.text_proj[2](torch.relu(off.text_proj[0](pooled))).float(), dim=-1)
    assert torch.equal(off.encode_text(ids, mask).feat, manual)


def test_on_centres_the_projection_over_the_batch_before_the_norm() -> None:
    m = model(True).train()
    images, ids, mask = inputs()
    _, pooled = m.text(ids, mask)
    for out in (m.text_proj(pooled), m.vision_proj(m.vision(images))):
        assert out.mean(0).abs().max() < 1e-5
        assert torch.allclose(out.var(0, unbiased=False), torch.ones(8), atol=0.02)  # BN eps on small variances
    feat = m.encode_image(images).feat
    assert torch.allclose(feat.norm(dim=-1), torch.ones(6), atol=1e-5)
    m.eval()  # running statistics: the batch no longer sets the centre
    assert m.text_proj(pooled).mean(0).abs().max() > 1e-3
