import os

import pytest
import torch
from safetensors.torch import load_file, save_model
from transformers import BertConfig

from vlp.config import ModelConfig, TextConfig, VisionConfig
from vlp.errors import CheckpointError
from vlp.losses.vqa import sequence_nll
from vlp.models.albef import ALBEF
from vlp.models.text import FusionEncoder
from vlp.models.vqa import AnswerDecoder, VQAModel
from vlp.weights import load_strict


def small_decoder(layers: int = 2) -> AnswerDecoder:
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return AnswerDecoder(cfg, layers).eval()


def test_decoder_is_causal_and_tied():
    dec = small_decoder()
    assert dec.lm_head.decoder.weight is dec.embeddings.word_embeddings.weight
    assert all(lay.causal for lay in dec.encoder.layer)
    q, qmask = torch.randn(1, 4, 16), torch.ones(1, 4, dtype=torch.long)
    ids = torch.tensor([[1, 7, 8, 9, 2]])
    mask = torch.ones_like(ids)
    base = dec(ids, mask, q, qmask)
    assert base.shape == (1, 5, 50)
    for j in range(1, 5):
        changed = ids.clone()
        changed[0, j] = 30
        out = dec(changed, mask, q, qmask)
        assert torch.allclose(out[:, :j], base[:, :j], atol=1e-6)  # positions < j do not see token j
        assert not torch.allclose(out[:, j], base[:, j], atol=1e-3)  # position j does
    # answer padding: the valid prefix is the same with or without padded positions after it
    short = dec(ids[:, :3], mask[:, :3], q, qmask)
    padded = dec(torch.tensor([[1, 7, 8, 0, 0]]), torch.tensor([[1, 1, 1, 0, 0]]), q, qmask)
    assert torch.allclose(short, padded[:, :3], atol=1e-5)


def test_question_padding_is_masked_in_cross_attention():
    dec = small_decoder()
    q = torch.randn(2, 5, 16)
    qmask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    ids, mask = torch.tensor([[1, 7, 2], [1, 8, 2]]), torch.ones(2, 3, dtype=torch.long)
    base = dec(ids, mask, q, qmask)
    q2 = q.clone()
    q2[0, 3:] = 100 * torch.randn(2, 16)  # padded question states of row 0 change
    out = dec(ids, mask, q2, qmask)
    assert torch.allclose(out, base, atol=1e-5)
    q2[1, 4] += 1.0  # a real question token does change row 1
    assert not torch.allclose(dec(ids, mask, q2, qmask)[1], base[1], atol=1e-4)


def test_default_fusion_stays_bidirectional():
    torch.manual_seed(0)
    f = FusionEncoder(hidden=16, layers=1, heads=2, intermediate=32, image_width=16, dropout=0.0)
    assert not f.causal and not f.layer[0].causal
    text, img, mask = torch.randn(1, 4, 16), torch.randn(1, 3, 16), torch.ones(1, 4)
    changed = text.clone()
    changed[0, 3] += 1.0
    assert not torch.allclose(f(text, mask, img)[:, 0], f(changed, mask, img)[:, 0], atol=1e-4)
    # same parameter names with and without causal
    g = FusionEncoder(hidden=16, layers=1, heads=2, intermediate=32, image_width=16, causal=True)
    assert list(f.state_dict()) == list(g.state_dict())


def tiny_cfg(**text) -> ModelConfig:
    """ViT width 64 (1 block), text hidden 64: 1 text layer, 2 fusion layers."""
    text = {"layers": 1, "fusion_layers": 2, "hidden": 64, "heads": 4, "intermediate": 128, "dropout": 0.0, **text}
    return ModelConfig(
        vision=VisionConfig(depth=1, width=64, heads=2), text=TextConfig(**text), queue_size=8, embed_dim=8
    )


def test_vqa_model_structure():
    torch.manual_seed(0)
    m = VQAModel(tiny_cfg())
    assert m.vision_proj is None and m.itm_head is None and m.mlm_head is None
    assert len(m.decoder.encoder.layer) == len(m.fusion.layer) == 2
    assert set(m.momentum.twin.keys()) == {"vision", "text", "fusion", "decoder"}
    twin = m.momentum["decoder"]
    assert twin.lm_head.decoder.weight is twin.embeddings.word_embeddings.weight  # tie survives the copy
    assert m.decoder.embeddings.word_embeddings.weight is not m.text.embeddings.word_embeddings.weight


def test_rank_answers_matches_brute_force_scoring():
    torch.manual_seed(0)
    m = VQAModel(tiny_cfg()).eval()
    states, qmask = torch.randn(2, 4, 64), torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    cands = torch.tensor([[101, 2000, 102, 0], [101, 2001, 2002, 102], [101, 2003, 102, 0], [101, 2000, 2004, 102]])
    cmask = (cands != 0).long()
    with torch.no_grad():  # every (question, candidate) pair decoded on its own
        brute = torch.stack(
            [
                -sequence_nll(
                    m.answer_logits(states[b : b + 1].expand(4, -1, -1), qmask[b : b + 1].expand(4, -1), cands, cmask),
                    cands,
                    cmask,
                )
                for b in range(2)
            ]
        )
        first = m.answer_logits(states, qmask, cands[:2, :1], torch.ones(2, 1, dtype=torch.long))[:, 0]
    pred, scores = m.rank_answers(states, qmask, cands, cmask, k=10)
    assert torch.allclose(scores, brute, atol=1e-4)
    assert pred.tolist() == brute.argmax(1).tolist()
    pred, scores = m.rank_answers(states, qmask, cands, cmask, k=2)
    for b in range(2):
        p_first = first[b].softmax(-1)[cands[:, 1]]  # candidates 0 and 3 share their first token
        kept = torch.isfinite(scores[b])
        assert kept.sum() == 2
        assert p_first[kept].min() >= p_first[~kept].max()
        assert torch.allclose(scores[b][kept], brute[b][kept], atol=1e-4)
        assert pred[b] == torch.where(kept, brute[b], torch.tensor(float("-inf"))).argmax()


# ---------------------------------------------------------------- adapt_pretrained


def saved_state(model: torch.nn.Module, tmp_path) -> dict[str, torch.Tensor]:
    path = os.path.join(tmp_path, "model.safetensors")
    save_model(model, path)  # de-duplicates tied weights: one name per group
    return load_file(path)


def assert_copied(vqa: VQAModel, albef: ALBEF, prefix: str = "", skip_cross_kv: bool = False) -> None:
    own, src = vqa.state_dict(), albef.state_dict()
    for k, v in src.items():
        if k.startswith(prefix + "fusion.layer."):
            dk = k.replace(prefix + "fusion.", prefix + "decoder.encoder.", 1)
            if skip_cross_kv and (".crossattention.self.key." in k or ".crossattention.self.value." in k):
                continue  # left new (checked by the caller)
            assert torch.equal(own[dk], v), dk
        elif k.startswith(prefix + "text.embeddings."):
            assert torch.equal(own[k.replace(prefix + "text.", prefix + "decoder.", 1)], v)
        elif k.startswith(prefix + "mlm_head."):
            assert torch.equal(own[k.replace(prefix + "mlm_head.", prefix + "decoder.lm_head.", 1)], v)
    for k in own:  # encoder parts are kept as they were
        if k.startswith(tuple(prefix + p for p in ("vision.", "text.", "fusion."))):
            assert torch.equal(own[k], src[k]), k


def test_adapt_pretrained_copies_fusion_embeddings_and_mlm_head(tmp_path):
    torch.manual_seed(0)
    albef = ALBEF(tiny_cfg())
    with torch.no_grad():  # make the momentum twin differ from the online model
        for p in albef.momentum.twin.parameters():
            p.add_(0.01 * torch.randn_like(p))
    state = saved_state(albef, tmp_path)
    assert "mlm_head.decoder.weight" in state and "text.embeddings.word_embeddings.weight" not in state
    torch.manual_seed(1)
    vqa = VQAModel(tiny_cfg())
    new, allow = VQAModel.adapt_pretrained(state, vqa)
    assert allow == ["queue.ids", "queue.image", "queue.ptr", "queue.text"]  # image width 64 == hidden 64
    load_strict(vqa, new, source="pretrain", allow_missing=allow)
    assert_copied(vqa, albef)
    assert_copied(vqa, albef, prefix="momentum.twin.")
    twin = vqa.momentum["decoder"]
    assert torch.equal(
        twin.encoder.layer[1].crossattention.output.dense.weight,
        albef.momentum["fusion"].layer[1].crossattention.output.dense.weight,
    )
    assert not torch.equal(
        twin.encoder.layer[0].attention.self.qkv.weight, vqa.decoder.encoder.layer[0].attention.self.qkv.weight
    )
    assert torch.equal(vqa.decoder.lm_head.bias, albef.mlm_head.bias)
    assert torch.equal(vqa.decoder.lm_head.decoder.weight, albef.text.embeddings.word_embeddings.weight)
    assert vqa.decoder.lm_head.decoder.weight is vqa.decoder.embeddings.word_embeddings.weight
    # nothing dropped silently: every saved key was mapped into the VQA state or is a known head
    dropped = {k for k in state if k not in new}
    heads = (
        "vision_proj.",
        "text_proj.",
        "itm_head.",
        "queue.",
        "mlm_head.",
        "momentum.twin.vision_proj.",
        "momentum.twin.text_proj.",
        "momentum.twin.mlm_head.",
    )
    assert dropped == {k for k in state if k.startswith(heads) or k == "temp"}
    assert all(k.replace("mlm_head.", "decoder.lm_head.") in new for k in dropped if "mlm_head." in k)
    # an adapted (VQA) state passes through unchanged
    again, allow2 = VQAModel.adapt_pretrained(new, vqa)
    assert again is new and allow2 == []


def test_adapt_pretrained_other_tied_name_and_position_ids(tmp_path):
    torch.manual_seed(0)
    albef = ALBEF(tiny_cfg())
    state = saved_state(albef, tmp_path)
    for prefix in ("", "momentum.twin."):  # a checkpoint that kept the embedding name instead
        state[prefix + "text.embeddings.word_embeddings.weight"] = state.pop(prefix + "mlm_head.decoder.weight")
        state[prefix + "text.embeddings.position_ids"] = torch.arange(512)[None]  # older transformers
    vqa = VQAModel(tiny_cfg())
    new, allow = VQAModel.adapt_pretrained(state, vqa)
    load_strict(vqa, new, source="pretrain", allow_missing=allow)
    word = albef.text.embeddings.word_embeddings.weight
    assert torch.equal(vqa.text.embeddings.word_embeddings.weight, word)
    assert torch.equal(vqa.decoder.embeddings.word_embeddings.weight, word)
    assert torch.equal(vqa.momentum["decoder"].lm_head.decoder.weight, albef.momentum["mlm_head"].decoder.weight)
    with pytest.raises(CheckpointError, match="unrecognised"):
        VQAModel.adapt_pretrained({**state, "mystery.weight": torch.zeros(1)}, vqa)


def test_adapt_pretrained_leaves_mismatched_cross_kv_new(tmp_path):
    cfg = tiny_cfg(hidden=32, heads=2, intermediate=64)  # ViT width 64 != text hidden 32
    torch.manual_seed(0)
    albef = ALBEF(cfg)
    vqa = VQAModel(cfg)
    before = vqa.decoder.encoder.layer[0].crossattention.self.kv.weight.clone()
    new, allow = VQAModel.adapt_pretrained(saved_state(albef, tmp_path), vqa)
    kv = [k for k in allow if not k.startswith("queue.")]
    assert len(kv) == 2 * 2 * 2 * 2  # (online, twin) x 2 layers x (key, value) x (weight, bias)
    assert all(".crossattention.self.key." in k or ".crossattention.self.value." in k for k in kv)
    load_strict(vqa, new, source="pretrain", allow_missing=allow)
    assert torch.equal(vqa.decoder.encoder.layer[0].crossattention.self.kv.weight, before)  # left new
    assert_copied(vqa, albef, skip_cross_kv=True)
    assert torch.equal(
        vqa.decoder.encoder.layer[0].crossattention.self.query.weight,
        albef.fusion.layer[0].crossattention.self.query.weight,
    )
