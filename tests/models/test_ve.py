"""The SNLI-VE model: 3-way head and its momentum twin, and loading a pretraining checkpoint."""

import torch
from safetensors.torch import save_model

from tests.helpers import narrow_model_config
from vlp.config import ModelConfig
from vlp.models.albef import ALBEF
from vlp.models.build import build_model_of_kind
from vlp.models.transfer import load_pretrained
from vlp.models.ve import VE_CLASSES, VEModel


def cfg() -> ModelConfig:
    return narrow_model_config(queue_size=8, dropout=0.0)


def inputs(b: int = 2, t: int = 5):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(b, 3, 32, 32, generator=g),
        torch.randint(1000, 2000, (b, t), generator=g),
        torch.ones(b, t, dtype=torch.long),
    )


def test_structure_and_classify():
    torch.manual_seed(0)
    m = build_model_of_kind("ve", cfg(), 30522)
    assert isinstance(m, VEModel) and VE_CLASSES == ("contradiction", "neutral", "entailment")
    assert [type(x).__name__ for x in m.cls_head] == ["Linear", "ReLU", "Linear"] and m.cls_head[2].out_features == 3
    assert m.vision_proj is None and m.itm_head is None and m.mlm_head is None and m.queue is None
    keys = m.state_dict().keys()
    assert "momentum.twin.cls_head.2.weight" in keys and not any(
        k.removeprefix("momentum.twin.").startswith(
            ("queue", "vision_proj", "text_proj", "itm_head", "mlm_head", "temp")
        )
        for k in keys
    )
    logits = m.classify(*inputs())
    assert logits.shape == (2, 3)
    torch.testing.assert_close(m.classify(*inputs(), momentum=True), logits)  # twin made from the online model
    m.cls_head[2].bias.data += 1.0
    assert not torch.allclose(m.classify(*inputs(), momentum=True), m.classify(*inputs()))


def test_pretraining_checkpoint_loads_with_new_head(tmp_path):
    torch.manual_seed(1)
    src = ALBEF(cfg())
    with torch.no_grad():
        for p in src.momentum.parameters():
            p.add_(0.1)  # twins differ from the online weights: both must be loaded as such
    save_model(src, str(tmp_path / "model.safetensors"))  # one name per tied group (the MLM decoder)
    torch.manual_seed(2)
    model = VEModel(cfg())
    head = {k: v.clone() for k, v in model.cls_head.state_dict().items()}
    report = load_pretrained(model, tmp_path)
    assert report["momentum_copied"] == []
    assert sorted(report["new"]) == sorted(
        [f"cls_head.{i}.{w}" for i in (0, 2) for w in ("weight", "bias")]
        + [f"momentum.twin.cls_head.{i}.{w}" for i in (0, 2) for w in ("weight", "bias")]
    )
    assert torch.equal(model.text.embeddings.word_embeddings.weight, src.text.embeddings.word_embeddings.weight)
    assert torch.equal(
        model.momentum["fusion"].layer[0].output.dense.weight, src.momentum["fusion"].layer[0].output.dense.weight
    )
    assert all(torch.equal(model.momentum["cls_head"].state_dict()[k], v) for k, v in head.items())
    assert any(k.startswith("mlm_head") for k in report["dropped"]) and "temp" in report["dropped"]
