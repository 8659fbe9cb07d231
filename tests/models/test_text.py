import pytest
import torch
from transformers import BertConfig, BertModel

from vlp.config import TextConfig
from vlp.errors import CheckpointError
from vlp.models.text import FusionEncoder, TextEncoder, build_text, select_kv
from vlp.sources import minilm_path
from vlp.weights import load_strict


def test_precomputed_image_kv_equals_naive_and_shares_gradient():
    torch.manual_seed(0)
    f = FusionEncoder(hidden=32, layers=2, heads=4, intermediate=64, image_width=24, dropout=0.0).double()
    text = torch.randn(6, 5, 32, dtype=torch.float64)
    mask = torch.ones(6, 5, dtype=torch.long)
    mask[0, 3:] = 0
    images = torch.randn(3, 7, 24, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([0, 1, 2, 2, 0, 1])
    naive = f(text, mask, images[idx])
    reused = f(text, mask, select_kv(f.image_kv(images), idx))
    assert torch.allclose(naive, reused, atol=1e-10)
    (g1,) = torch.autograd.grad(naive.sum(), images)
    (g2,) = torch.autograd.grad(reused.sum(), images)
    assert torch.allclose(g1, g2, atol=1e-10)


def test_fusion_padding_tokens_do_not_change_valid_outputs():
    torch.manual_seed(0)
    f = FusionEncoder(hidden=16, layers=1, heads=2, intermediate=32, image_width=16, dropout=0.0).eval()
    text, img = torch.randn(1, 4, 16), torch.randn(1, 3, 16)
    a = f(text[:, :2], torch.ones(1, 2), img)
    b = f(text, torch.tensor([[1, 1, 0, 0]]), img)
    assert torch.allclose(a, b[:, :2], atol=1e-5)


def test_list_of_images_alternates_per_layer():
    torch.manual_seed(0)
    f = FusionEncoder(hidden=16, layers=2, heads=2, intermediate=32, image_width=16, dropout=0.0)
    i0, i1 = torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    kv = f.image_kv([i0, i1])
    assert torch.equal(kv[0][0], f.layer[0].crossattention.project_kv(i0)[0])
    assert torch.equal(kv[1][0], f.layer[1].crossattention.project_kv(i1)[0])


def test_small_preset_loads_minilm_layers_by_name():
    text, fusion = build_text(TextConfig(preset="small", dropout=0.0), image_width=384)
    ref = BertModel.from_pretrained(str(minilm_path()), add_pooling_layer=False).eval()
    text.eval()
    fusion.eval()
    ids = torch.tensor([[101, 1037, 2417, 4418, 102, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    hs = ref(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    ours = text(ids, mask)
    assert torch.allclose(ours[:, :5], hs[3][:, :5], atol=1e-5)  # text tower == MiniLM layers 0-2
    # fusion layer 0 holds MiniLM layer 3: its self-attention block reproduces HF's
    ref_att = ref.encoder.layer[3].attention
    ext = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    expected = ref_att(hs[3], attention_mask=ext)[0]
    x = hs[3]
    got = fusion.layer[0].attention(x, None, mask.bool()[:, None, None, :])  # self-attention: Q, K, V of x
    assert torch.allclose(got[:, :5], expected[:, :5], atol=1e-5)
    assert torch.equal(fusion.layer[2].output.dense.weight, ref.encoder.layer[5].output.dense.weight)


def test_load_strict_names_missing_and_unexpected_keys():
    f = FusionEncoder(hidden=8, layers=1, heads=2, intermediate=16, image_width=8)
    state = dict(f.state_dict())
    state.pop("layer.0.output.dense.weight")
    state["layer.0.extra"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"missing keys \(1\).*layer.0.output.dense.weight") as e:
        load_strict(f, state, source="x.safetensors")
    assert "layer.0.extra" in str(e.value) and "x.safetensors" in str(e.value)
    state["layer.0.output.dense.weight"] = torch.zeros(3, 3)
    with pytest.raises(CheckpointError, match="shape mismatches"):
        load_strict(f, state, source="x", allow_unexpected=["layer.0.extra"])


def test_text_encoder_is_hf_bert_with_fused_qkv():
    """vlp's text tower draws HF BertModel's initial weights from the same random state, saves them
    under BERT's names, and computes the same states, in eval and (same dropout draws) in training."""
    cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    torch.manual_seed(0)
    hf = BertModel(cfg, add_pooling_layer=False)
    after_hf = torch.rand(4)
    torch.manual_seed(0)
    ours = TextEncoder(cfg)
    assert torch.equal(torch.rand(4), after_hf)  # the same number of draws
    assert hasattr(ours.encoder.layer[0].attention.self, "qkv")
    theirs, mine = hf.state_dict(), ours.state_dict()
    assert set(theirs) == set(mine)
    assert all(torch.equal(theirs[k], mine[k]) for k in mine)
    ids = torch.randint(1000, 2000, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    for train in (False, True):
        hf.train(train), ours.train(train)
        torch.manual_seed(1)
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        torch.manual_seed(1)
        got = ours(ids, mask)
        torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-6, rtol=1e-6)
