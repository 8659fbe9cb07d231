"""Pretrained -> fine-tuning weight transfer: position-embedding interpolation, head dropping, ties, queues."""

import pytest
import torch
from safetensors.torch import load_file

from vlp.config import ModelConfig, TextConfig, VisionConfig
from vlp.errors import CheckpointError
from vlp.models.albef import ALBEF
from vlp.models.transfer import load_pretrained
from vlp.models.vision import resize_pos_embed
from vlp.weights import save_checkpoint


def _cfg(img_size=64, queue_size=16):
    return ModelConfig(
        vision=VisionConfig(depth=1, img_size=img_size),
        text=TextConfig(layers=1, fusion_layers=1),
        queue_size=queue_size,
        embed_dim=32,
    )


def test_resize_pos_embed_keeps_grid_when_size_unchanged():
    pe = torch.randn(1, 1 + 8 * 8, 16)
    assert resize_pos_embed(pe, 65) is pe


def test_resize_pos_embed_interpolates_grid_and_keeps_cls():
    grid = torch.arange(4.0).repeat(4, 1)  # value = column index, 4x4
    pe = torch.cat([torch.full((1, 1, 1), 7.0), grid.reshape(1, 16, 1)], 1)
    out = resize_pos_embed(pe, 1 + 8 * 8)
    assert out.shape == (1, 65, 1) and out[0, 0, 0] == 7.0
    g = out[0, 1:, 0].reshape(8, 8)
    assert torch.allclose(g[0], g[5])  # still constant down each column
    assert (g[0, 1:] >= g[0, :-1] - 1e-5).all() and g[0, 0] < 0.5 and g[0, -1] > 2.5  # still increasing left->right
    with pytest.raises(ValueError, match="square grid"):
        resize_pos_embed(pe, 1 + 10)


def test_load_pretrained_into_retrieval_model(tmp_path):
    src = ALBEF(_cfg())
    with torch.no_grad():
        src.queue.ids.copy_(torch.arange(16))  # ids of the pretraining data
    ckpt = save_checkpoint(tmp_path / "c", src, {})
    assert "text.embeddings.word_embeddings.weight" not in load_file(str(ckpt / "model.safetensors"))  # tied name
    dst = ALBEF(_cfg(img_size=96), mlm=False)
    report = load_pretrained(dst, ckpt)
    assert torch.equal(dst.text.embeddings.word_embeddings.weight, src.text.embeddings.word_embeddings.weight)
    assert torch.equal(
        dst.momentum["text"].embeddings.word_embeddings.weight, src.momentum["text"].embeddings.word_embeddings.weight
    )
    assert torch.equal(
        dst.fusion.layer[0].crossattention.self.kv.weight, src.fusion.layer[0].crossattention.self.kv.weight
    )
    assert dst.vision.pos_embed.shape[1] == 1 + 12 * 12 and torch.equal(
        dst.vision.pos_embed[:, 0], src.vision.pos_embed[:, 0]
    )
    assert torch.equal(dst.queue.get("image"), src.queue.get("image"))  # inherited queue features ...
    assert (dst.queue.ids == -100).all()  # ... but never the pretraining ids
    assert "queue.ids" in report["new"] and any(k.startswith("mlm_head.") for k in report["dropped"])
    assert not report["momentum_copied"]


def test_load_pretrained_refuses_other_architecture(tmp_path):
    ckpt = save_checkpoint(tmp_path / "c", ALBEF(_cfg()), {})
    wide = _cfg()
    wide.text.hidden = 256
    with pytest.raises(CheckpointError, match="shape mismatches"):
        load_pretrained(ALBEF(wide, mlm=False), ckpt)


def test_load_pretrained_into_vqa_and_nlvr_models_maps_every_part(tmp_path):
    from vlp.models.nlvr import NLVRModel
    from vlp.models.vqa import VQAModel

    src = ALBEF(_cfg())
    ckpt = save_checkpoint(tmp_path / "c", src, {})
    vqa = VQAModel(_cfg())
    report = load_pretrained(vqa, ckpt)
    assert not [k for k in report["new"] if k.startswith(("decoder.", "momentum.twin.decoder."))], report["new"]
    assert torch.equal(vqa.decoder.lm_head.transform.dense.weight, src.mlm_head.transform.dense.weight)
    assert torch.equal(vqa.decoder.lm_head.bias, src.mlm_head.bias)
    assert torch.equal(
        vqa.decoder.encoder.layer[0].attention.self.qkv.weight, src.fusion.layer[0].attention.self.qkv.weight
    )
    assert torch.equal(vqa.momentum["decoder"].lm_head.bias, src.momentum["mlm_head"].bias)
    nlvr = NLVRModel(_cfg())
    report = load_pretrained(nlvr, ckpt)
    assert {k.split(".")[0] for k in report["new"]} <= {"cls_head", "momentum"}
    for i in (0, 1):
        assert torch.equal(
            nlvr.fusion.layer[i].intermediate.dense.weight, src.fusion.layer[0].intermediate.dense.weight
        )
