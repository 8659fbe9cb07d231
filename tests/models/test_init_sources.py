"""The real loading paths (local directories and files) on checkpoints generated here."""

import pytest
import timm
import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertModel

from vlp.config import TextConfig, VisionConfig
from vlp.errors import CheckpointError
from vlp.models.text import build_text
from vlp.models.vision import build_vision


def test_base_style_text_init_from_a_local_bert_directory(tmp_path):
    torch.manual_seed(0)
    bert = BertModel(
        BertConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64),
        add_pooling_layer=True,
    )
    bert.save_pretrained(tmp_path / "bert")  # what a downloaded bert-base-uncased folder looks like
    cfg = TextConfig(
        preset="base", hidden=32, layers=2, fusion_layers=2, heads=2, intermediate=64, init=str(tmp_path / "bert")
    )
    text, fusion = build_text(cfg, image_width=48)
    sd = bert.state_dict()
    assert torch.equal(
        text.state_dict()["encoder.layer.1.attention.self.query.weight"],
        sd["encoder.layer.1.attention.self.query.weight"],
    )
    assert torch.equal(text.embeddings.token_type_embeddings.weight, sd["embeddings.token_type_embeddings.weight"])
    # BERT layers 2, 3 -> fusion layers 0, 1 by name; cross-attention is new (K/V from the image width)
    assert torch.equal(
        fusion.state_dict()["layer.0.attention.self.key.weight"], sd["encoder.layer.2.attention.self.key.weight"]
    )
    assert torch.equal(fusion.layer[1].output.LayerNorm.weight, sd["encoder.layer.3.output.LayerNorm.weight"])
    assert fusion.state_dict()["layer.0.crossattention.self.key.weight"].shape == (32, 48)


def test_text_init_with_too_few_layers_fails_naming_keys(tmp_path):
    bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64))
    bert.save_pretrained(tmp_path / "bert2")
    cfg = TextConfig(
        preset="base", hidden=32, layers=2, fusion_layers=2, heads=2, intermediate=64, init=str(tmp_path / "bert2")
    )
    with pytest.raises(CheckpointError, match=r"missing keys.*layer\.0\.attention"):
        build_text(cfg, image_width=32)


def test_vision_init_from_a_local_file_resizes_pos_embed(tmp_path):
    torch.manual_seed(0)
    src = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=0)
    save_file(src.state_dict(), str(tmp_path / "vit.safetensors"))
    cfg = VisionConfig(preset="tiny", img_size=64, depth=2, pretrained=str(tmp_path / "vit.safetensors"))
    vit = build_vision(cfg)
    assert vit.pos_embed.shape == (1, 1 + 8 * 8, 192)  # 4x4 grid resized to 8x8, CLS kept
    assert torch.equal(vit.cls_token, src.cls_token)
    assert torch.allclose(vit.pos_embed[:, 0], src.pos_embed[:, 0])
    assert torch.equal(vit.blocks[1].attn.qkv.weight, src.blocks[1].attn.qkv.weight)
