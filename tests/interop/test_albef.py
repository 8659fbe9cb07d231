"""Official ALBEF checkpoints: key layout, round trips, key report, CLI, albef_compat tokenization, and
an independent plain-torch re-implementation of ALBEF's image / text / fusion forward (albef.md §1, §9, §12)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

from tests.albef_fakes import (
    DEPTH,
    IMG,
    NF,
    PATCH,
    T_HEADS,
    V_HEADS,
    VOCAB,
    E,
    H,
    L,
    Q,
    W,
    albef_nlvr_state,
    albef_state,
    albef_vqa_state,
    tiny_config,
)
from vlp.checkpoint import load_model
from vlp.cli import main
from vlp.config import TextConfig
from vlp.errors import CheckpointError
from vlp.interop.albef import ALBEF_KIND, convert_albef, detect_kind, export_albef, export_albef_report
from vlp.models.build import build_model_of_kind
from vlp.preprocess.transforms import load_tokenizer, tokenize
from vlp.weights import read_state_dict


def random_vlp(vlp_kind: str, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = build_model_of_kind(vlp_kind, tiny_config(), VOCAB)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.state_dict()


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b), (sorted(set(a) - set(b))[:5], sorted(set(b) - set(a))[:5])
    bad = [k for k in a if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
    assert not bad, bad[:5]


# ----------------------------------------------------------------------------- layout and round trips


def test_export_matches_documented_layout():
    vlp = random_vlp("pretrain")
    albef = export_albef(vlp, "pretrain")
    documented = albef_state("pretrain")
    assert set(albef) == set(documented)
    assert all(albef[k].shape == documented[k].shape for k in albef)
    assert albef["image_queue"].shape == (E, Q) and torch.equal(albef["image_queue"], vlp["queue.image"].T)
    # fusion layers follow the text layers in one BERT: L..L+F-1, the only ones with cross-attention
    cross = {
        int(m.group(1))
        for k in albef
        if (m := re.match(r"text_encoder\.bert\.encoder\.layer\.(\d+)\.crossattention", k))
    }
    assert cross == set(range(L, L + NF))
    assert torch.equal(
        albef[f"text_encoder.bert.encoder.layer.{L}.crossattention.self.key.weight"],
        vlp["fusion.layer.0.crossattention.self.key.weight"],
    )
    assert torch.equal(
        albef["visual_encoder_m.blocks.1.attn.qkv.weight"], vlp["momentum.twin.vision.blocks.1.attn.qkv.weight"]
    )
    assert torch.equal(albef["text_encoder.bert.embeddings.position_ids"], torch.arange(512)[None])
    assert torch.equal(albef["text_encoder.cls.predictions.decoder.bias"], vlp["mlm_head.bias"])
    assert not any(k.startswith(("itm_head_m", "temp_m")) for k in albef)  # no momentum copy (albef.md §1.3)


@pytest.mark.parametrize("kind", ["pretrain", "retrieval"])
def test_round_trip_from_albef_layout(kind):
    src = albef_state(kind)
    vlp, report = convert_albef(src, "auto")
    assert report.kind == kind
    assert torch.equal(vlp["queue.image"], src["image_queue"].T) and vlp["queue.image"].shape == (Q, E)
    assert torch.equal(
        vlp["fusion.layer.1.crossattention.output.dense.weight"],
        src[
            f"text_encoder{'.bert' if kind == 'pretrain' else ''}.encoder.layer.{L + 1}.crossattention.output.dense.weight"
        ],
    )
    if kind == "retrieval":
        assert torch.equal(vlp["queue.ids"], src["idx_queue"][0])
    assert_same(export_albef(vlp, kind), src)


@pytest.mark.parametrize("vlp_kind", ["pretrain", "retrieval", "vqa", "nlvr2", "nlvr-ta"])
def test_round_trip_from_vlp(vlp_kind):
    vlp = random_vlp(vlp_kind)
    kind = ALBEF_KIND[vlp_kind]
    albef = export_albef(vlp, kind)
    assert detect_kind(albef) == kind
    back, report = convert_albef(albef, "auto", expected=vlp)
    lost = {"pretrain": {"queue.ids"}, "vqa": {"queue.image", "queue.text", "queue.ids", "queue.ptr"}}.get(
        vlp_kind, set()
    )
    assert set(report.missing) == lost
    assert_same(back, {k: v for k, v in vlp.items() if k not in lost})
    assert_same(export_albef(back, kind), albef)


def test_vqa_and_nlvr_layouts():
    vqa = export_albef(random_vlp("vqa"), "vqa")
    assert "text_decoder.bert.encoder.layer.1.crossattention.self.query.weight" in vqa
    assert "text_decoder_m.cls.predictions.decoder.weight" in vqa and "text_encoder.embeddings.position_ids" in vqa
    nlvr = export_albef(random_vlp("nlvr2"), "nlvr")
    cross = sorted(
        {int(m.group(1)) for k in nlvr if (m := re.match(r"text_encoder\.encoder\.layer\.(\d+)\.crossattention", k))}
    )
    assert cross == list(range(L, L + 2 * NF))  # the doubled fusion block
    for i in range(NF):  # K/V shared by the pair (L+2i, L+2i+1)
        a, b = (f"text_encoder.encoder.layer.{L + 2 * i + j}.crossattention.self.key.weight" for j in (0, 1))
        assert torch.equal(nlvr[a], nlvr[b])
    assert "cls_head_m.2.weight" in nlvr


def test_report_contents():
    src = albef_state("pretrain")
    expected = build_model_of_kind("pretrain", tiny_config(), VOCAB).state_dict()
    _, report = convert_albef(src, "pretrain", expected=expected)
    assert len(report.mapped) + len(report.dropped) == len(src)
    assert ("image_queue", "queue.image") in report.mapped and (
        "text_encoder_m.cls.predictions.transform.dense.weight",
        "momentum.twin.mlm_head.transform.dense.weight",
    ) in report.mapped
    assert ("text_encoder.bert.encoder.layer.3.output.dense.bias", "fusion.layer.1.output.dense.bias") in report.mapped
    assert sorted(k for k, _ in report.dropped) == sorted(
        f"text_encoder{m}.{p}"
        for m in ("", "_m")
        for p in ("bert.embeddings.position_ids", "cls.predictions.decoder.bias")
    )
    assert report.missing == ["queue.ids"]
    d = report.to_json()
    assert d["counts"] == {"mapped": len(src) - 4, "dropped": 4, "missing": 1}
    assert "4 dropped on purpose" in report.summary()
    _, rep = export_albef_report(random_vlp("pretrain"), "pretrain")
    assert [k for k, _ in rep.dropped] == ["queue.ids"]  # what an ALBEF pretrain file cannot hold


def test_unexpected_keys_raise_unless_allowed():
    src = albef_state("retrieval") | {"text_encoder.pooler.dense.weight": torch.zeros(H, H)}
    with pytest.raises(CheckpointError, match=r"text_encoder\.pooler\.dense\.weight"):
        convert_albef(src, "retrieval")
    _, report = convert_albef(src, "retrieval", allow_unexpected=["text_encoder.pooler.*"])
    assert ("text_encoder.pooler.dense.weight", "unexpected, allowed by --allow-unexpected") in report.dropped
    with pytest.raises(CheckpointError, match="match no 'retrieval' rule"):  # a pretrain file as retrieval
        convert_albef(albef_state("pretrain"), "retrieval")


# ----------------------------------------------------------------------------- tokenization


def test_albef_compat_tokenization():
    texts = ["A dog, running!", "cat"]
    default = tokenize(load_tokenizer(TextConfig()), texts, 8)
    tok = load_tokenizer(TextConfig(albef_compat=True))
    compat = tokenize(tok, texts, 8)
    words = tok(["a dog running", "cat"], add_special_tokens=False)["input_ids"]
    cls, sep, pad = tok.cls_token_id, tok.sep_token_id, tok.pad_token_id
    assert compat["input_ids"].tolist() == [
        [cls, *words[0]],
        [cls, *words[1], *[pad] * (len(words[0]) - len(words[1]))],
    ]
    assert default["input_ids"][0].tolist() == [cls, *words[0], sep]
    assert compat["attention_mask"].sum(1).tolist() == [1 + len(w) for w in words]
    assert sep not in compat["input_ids"].tolist()[0]
    # truncation keeps [CLS] + max_len - 1 word pieces; max_len padding gives [B, max_len]
    short = tokenize(tok, texts, 3, padding="max_len")
    assert short["input_ids"].tolist()[0] == [cls, *words[0][:2]] and short["input_ids"].shape == (2, 3)
    assert tokenize(tok, texts, 8, albef_compat=False)["input_ids"].tolist() == default["input_ids"].tolist()


def test_albef_compat_vqa_questions():
    """VQA questions follow the same rule (ALBEF: [CLS] q, no [SEP]; untruncated at test time)."""
    from vlp.data.vqa import VQACollator

    items = [
        {
            "image": torch.zeros(3, 4, 4),
            "question": "What colour is the cat?",
            "answers": ["red"],
            "index": 0,
            "weights": [1.0],
        }
    ]
    q = load_tokenizer(TextConfig())("what colour is the cat", add_special_tokens=False)["input_ids"]
    for compat in (False, True):
        tok = load_tokenizer(TextConfig(albef_compat=compat))
        ids = VQACollator(tok, question_max_len=None)(items)["input_ids"][0].tolist()
        assert ids == [tok.cls_token_id, *q] + ([] if compat else [tok.sep_token_id])


# ----------------------------------------------------------------------------- CLI and independent forward


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """ALBEF pretrain .pth -> `vlp convert albef` -> folder; plus the source state."""
    d = tmp_path_factory.mktemp("albef")
    src = albef_state("pretrain", seed=1)
    torch.save({"model": src, "optimizer": {"state": {}}, "epoch": 29}, d / "ALBEF.pth")
    (d / "model.yaml").write_text(f"text:\n  heads: {T_HEADS}\n")
    out = d / "albef14m"
    assert main(["convert", "albef", str(d / "ALBEF.pth"), str(out), "--config", str(d / "model.yaml")]) == 0
    return d, out, src


def test_cli_convert_and_export(converted, capsys):
    d, out, src = converted
    state = json.loads((out / "state.json").read_text())
    assert state["task"] == "pretrain" and state["model"]["text"]["albef_compat"] is True
    assert state["model"]["text"]["heads"] == T_HEADS and state["model"]["vision"]["heads"] == 1
    assert state["model"]["queue_size"] == Q and state["model"]["vision"]["img_size"] == IMG
    report = json.loads((out / "key_report.json").read_text())
    assert report["missing"] == ["queue.ids"] and report["counts"]["mapped"] == len(src) - 4
    assert {"key": "<file>.optimizer", "reason": "training state outside the model (not read)"} in report["dropped"]
    model, cfg, tok = load_model(out, torch.device("cpu"))
    assert cfg.model.text.albef_compat and tokenize(tok, ["a b"], 30)["input_ids"][0, -1] != tok.sep_token_id
    assert main(["convert", "to-albef", str(out), str(d / "back.pth")]) == 0
    assert "1 dropped on purpose" in capsys.readouterr().out  # queue.ids: ALBEF pretrain has no idx_queue
    assert_same(read_state_dict(d / "back.pth"), src)
    assert main(["convert", "albef", str(d / "ALBEF.pth"), str(d / "wrong"), "--kind", "retrieval"]) == 2


def test_a_full_disk_under_convert_gives_writing_advice_not_trainings(converted, tmp_path, monkeypatch, capsys):
    """Issue 41, item 9's class: a full disk outside training (``vlp convert albef``) does not advise
    ``train.keep_last`` and resume; it says what to do there, and nothing is left half-written."""
    d, _, _ = converted

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("vlp.weights.save_file", full)
    out = tmp_path / "conv"
    assert main(["convert", "albef", str(d / "ALBEF.pth"), str(out), "--config", str(d / "model.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"cannot write {out}: no space left on the device (" in err
    assert "keep_last" not in err and "resume" not in err
    assert "free some space, or write to a folder on another disk" in err
    assert sorted(tmp_path.iterdir()) == []


def test_cli_image_size_and_allow_unexpected(converted, tmp_path):
    d, _, src = converted
    torch.save({"model": src | {"text_encoder.bert.pooler.dense.weight": torch.zeros(H, H)}}, tmp_path / "x.pth")
    args = ["convert", "albef", str(tmp_path / "x.pth"), str(tmp_path / "out"), "--config", str(d / "model.yaml")]
    assert main(args) == 2  # the unexpected pooler key
    assert main([*args, "--image-size", "48", "--allow-unexpected", "*.pooler.*"]) == 0
    state = json.loads((tmp_path / "out" / "state.json").read_text())
    assert state["model"]["vision"]["img_size"] == 48
    assert read_state_dict(tmp_path / "out")["vision.pos_embed"].shape == (1, 1 + (48 // PATCH) ** 2, W)


def test_cli_evaluate_converted(converted, tmp_path):
    from PIL import Image

    _, out, _ = converted
    for i, colour in enumerate(["red", "blue"]):
        Image.new("RGB", (40, 40), colour).save(tmp_path / f"{i}.png")
    data = [{"image": f"{i}.png", "caption": [f"a {c} square", f"{c}"]} for i, c in enumerate(["red", "blue"])]
    (tmp_path / "test.json").write_text(json.dumps(data))
    assert (
        main(
            [
                "evaluate",
                "retrieval",
                "--checkpoint",
                str(out),
                "--data",
                str(tmp_path / "test.json"),
                "--out",
                str(tmp_path / "eval"),
                "eval.k_test=2",
            ]
        )
        == 0
    )
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["checkpoint_kind"] == "pretrain" and metrics["n_texts"] == 4 and 0 <= metrics["r_mean"] <= 100


def ref_vit(s: dict[str, torch.Tensor], images: torch.Tensor, p: str = "visual_encoder") -> torch.Tensor:
    """ALBEF's ViT (timm-style, pre-LN blocks): all tokens after the final norm."""
    x = F.conv2d(images, s[f"{p}.patch_embed.proj.weight"], s[f"{p}.patch_embed.proj.bias"], stride=PATCH)
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat([s[f"{p}.cls_token"].expand(len(x), -1, -1), x], 1) + s[f"{p}.pos_embed"]
    ln = lambda t, n: F.layer_norm(t, (W,), s[f"{n}.weight"], s[f"{n}.bias"], eps=1e-6)  # noqa: E731
    lin = lambda t, n: F.linear(t, s[f"{n}.weight"], s[f"{n}.bias"])  # noqa: E731
    for i in range(DEPTH):
        b = f"{p}.blocks.{i}"
        qkv = (
            lin(ln(x, f"{b}.norm1"), f"{b}.attn.qkv")
            .view(*x.shape[:2], 3, V_HEADS, W // V_HEADS)
            .permute(2, 0, 3, 1, 4)
        )
        a = torch.softmax(qkv[0] @ qkv[1].transpose(-1, -2) / math.sqrt(W // V_HEADS), -1) @ qkv[2]
        x = x + lin(a.transpose(1, 2).reshape(x.shape), f"{b}.attn.proj")
        x = x + lin(F.gelu(lin(ln(x, f"{b}.norm2"), f"{b}.mlp.fc1")), f"{b}.mlp.fc2")
    return ln(x, f"{p}.norm")


def ref_attention(s, p: str, x: torch.Tensor, ctx: torch.Tensor, ctx_mask: torch.Tensor) -> torch.Tensor:
    """BERT attention block, post-LN, additive mask (1 - mask) * -10000 as in ALBEF."""
    lin = lambda t, n: F.linear(t, s[f"{p}.{n}.weight"], s[f"{p}.{n}.bias"])  # noqa: E731
    split = lambda t: t.view(*t.shape[:2], T_HEADS, H // T_HEADS).transpose(1, 2)  # noqa: E731
    q, k, v = split(lin(x, "self.query")), split(lin(ctx, "self.key")), split(lin(ctx, "self.value"))
    m = ctx_mask[:, None, None, :] if ctx_mask.dim() == 2 else ctx_mask[:, None]  # [B, Tk] or [B, Tq, Tk]
    scores = q @ k.transpose(-1, -2) / math.sqrt(H // T_HEADS) + (1.0 - m.float()) * -10000.0
    a = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(x.shape)
    return F.layer_norm(
        lin(a, "output.dense") + x, (H,), s[f"{p}.output.LayerNorm.weight"], s[f"{p}.output.LayerNorm.bias"], eps=1e-12
    )


def ref_bert_layers(s, p: str, x, mask, layers, image=None, image_mask=None, causal=False) -> torch.Tensor:
    """BERT layers ``layers``; with ``image`` (a tensor, or a list that layer i attends to element
    (i - first) mod len: ALBEF's NLVR) each has cross-attention; ``causal``: ALBEF's decoder mask
    (causal x padding)."""
    layers = list(layers)
    images = image if isinstance(image, list) else [image]
    self_mask = mask[:, None, :] * torch.tril(torch.ones(x.shape[1], x.shape[1]))[None] if causal else mask
    for i in layers:
        b = f"{p}.encoder.layer.{i}"
        x = ref_attention(s, f"{b}.attention", x, x, self_mask)
        if image is not None:
            ctx = images[(i - layers[0]) % len(images)]
            x = ref_attention(
                s, f"{b}.crossattention", x, ctx, torch.ones(ctx.shape[:2]) if image_mask is None else image_mask
            )
        h = F.gelu(F.linear(x, s[f"{b}.intermediate.dense.weight"], s[f"{b}.intermediate.dense.bias"]))
        x = F.layer_norm(
            F.linear(h, s[f"{b}.output.dense.weight"], s[f"{b}.output.dense.bias"]) + x,
            (H,),
            s[f"{b}.output.LayerNorm.weight"],
            s[f"{b}.output.LayerNorm.bias"],
            eps=1e-12,
        )
    return x


def ref_embeddings(s, p: str, ids: torch.Tensor) -> torch.Tensor:
    """word + position + token_type row 0, LayerNorm (ALBEF keeps token_type_embeddings, §9)."""
    e = (
        s[f"{p}.embeddings.word_embeddings.weight"][ids]
        + s[f"{p}.embeddings.position_embeddings.weight"][: ids.shape[1]]
    )
    e = e + s[f"{p}.embeddings.token_type_embeddings.weight"][0]
    return F.layer_norm(e, (H,), s[f"{p}.embeddings.LayerNorm.weight"], s[f"{p}.embeddings.LayerNorm.bias"], eps=1e-12)


def test_converted_model_matches_independent_albef_forward(converted):
    _, out, s = converted
    model, cfg, tok = load_model(out, torch.device("cpu"))
    captions = ["A man riding a horse on the beach.", "two dogs", "a red-and-white bus / parked"]
    batch = tokenize(tok, captions, cfg.model.text.max_len)  # albef_compat from the converted config
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert (ids[:, 0] == tok.cls_token_id).all() and not (ids == tok.sep_token_id).any()
    images = torch.randn(3, 3, IMG, IMG, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        img = model.encode_image(images)
        txt = model.encode_text(ids, mask)
        fused = model.fuse(txt.hidden, mask, img.tokens)
        itm = model.itm_logits(fused)
        # reference: ALBEF's forward written from its own state-dict layout
        r_img = ref_vit(s, images)
        r_img_feat = F.normalize(F.linear(r_img[:, 0], s["vision_proj.weight"], s["vision_proj.bias"]), dim=-1)
        p = "text_encoder.bert"
        r_txt = ref_bert_layers(s, p, ref_embeddings(s, p, ids), mask, range(L))  # mode='text'
        r_txt_feat = F.normalize(F.linear(r_txt[:, 0], s["text_proj.weight"], s["text_proj.bias"]), dim=-1)
        r_fused = ref_bert_layers(s, p, r_txt, mask, range(L, L + NF), image=r_img)  # mode='fusion'
        r_itm = F.linear(r_fused[:, 0], s["itm_head.weight"], s["itm_head.bias"])
        r_img_m = ref_vit(s, images, "visual_encoder_m")
        img_m = model.encode_image(images, momentum=True)
    tol = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(img.tokens, r_img, **tol)
    torch.testing.assert_close(img.feat, r_img_feat, **tol)
    torch.testing.assert_close(img_m.tokens, r_img_m, **tol)
    valid = mask.bool()
    torch.testing.assert_close(txt.hidden[valid], r_txt[valid], **tol)
    torch.testing.assert_close(txt.feat, r_txt_feat, **tol)
    torch.testing.assert_close(fused[:, 0], r_fused[:, 0], **tol)
    torch.testing.assert_close(itm, r_itm, **tol)


# ----------------------------------------------------------------------------- VQA and NLVR2 layouts


def convert_file(tmp_path, state: dict[str, torch.Tensor], kind: str):
    torch.save({"model": state}, tmp_path / f"{kind}.pth")
    (tmp_path / "model.yaml").write_text(f"text:\n  heads: {T_HEADS}\n")
    out = tmp_path / kind
    assert (
        main(["convert", "albef", str(tmp_path / f"{kind}.pth"), str(out), "--config", str(tmp_path / "model.yaml")])
        == 0
    )
    assert json.loads((out / "key_report.json").read_text())["kind"] == kind  # detected from the keys
    return load_model(out, torch.device("cpu"))


def test_converted_nlvr_model_matches_independent_albef_forward(tmp_path):
    s = albef_nlvr_state(seed=2)
    model, cfg, tok = convert_file(tmp_path, s, "nlvr")
    batch = tokenize(tok, ["the left image has two dogs", "there is a bus in both images"], cfg.model.text.max_len)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    g = torch.Generator().manual_seed(3)
    im0, im1 = torch.randn(2, 3, IMG, IMG, generator=g), torch.randn(2, 3, IMG, IMG, generator=g)
    with torch.no_grad():
        for m in ("", "_m"):
            logits = model.classify(im0, im1, ids, mask, momentum=bool(m))
            p = f"text_encoder{m}"
            text = ref_bert_layers(s, p, ref_embeddings(s, p, ids), mask, range(L))
            images = [ref_vit(s, im0, f"visual_encoder{m}"), ref_vit(s, im1, f"visual_encoder{m}")]
            fused = ref_bert_layers(s, p, text, mask, range(L, L + 2 * NF), image=images)  # even: image 0, odd: image 1
            ref = F.linear(
                F.relu(F.linear(fused[:, 0], s[f"cls_head{m}.0.weight"], s[f"cls_head{m}.0.bias"])),
                s[f"cls_head{m}.2.weight"],
                s[f"cls_head{m}.2.bias"],
            )
            torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(model.classify(im1, im0, ids, mask), logits)  # the image order matters


def test_converted_vqa_model_matches_independent_albef_forward(tmp_path):
    s = albef_vqa_state(seed=4)
    model, cfg, tok = convert_file(tmp_path, s, "vqa")
    q = tokenize(tok, ["what colour is the bus?", "how many dogs"], cfg.model.text.max_len)
    qids, qmask = q["input_ids"], q["attention_mask"]
    images = torch.randn(2, 3, IMG, IMG, generator=torch.Generator().manual_seed(5))
    a = tokenize(tok, ["red", "two small dogs"], 10)  # [CLS] answer, then [SEP] by hand as ALBEF's eos
    lengths = a["attention_mask"].sum(1)
    aids = torch.cat([a["input_ids"], torch.zeros(2, 1, dtype=torch.long)], 1)
    aids[torch.arange(2), lengths] = tok.sep_token_id
    amask = (torch.arange(aids.shape[1])[None] <= lengths[:, None]).long()
    with torch.no_grad():
        states = model.encode_question(images, qids, qmask)
        logits = model.answer_logits(states, qmask, aids, amask)
        p = "text_encoder"
        text = ref_bert_layers(s, p, ref_embeddings(s, p, qids), qmask, range(L))
        r_states = ref_bert_layers(s, p, text, qmask, range(L, L + NF), image=ref_vit(s, images))  # multi_modal mode
        d = "text_decoder.bert"
        dec = ref_bert_layers(
            s, d, ref_embeddings(s, d, aids), amask, range(NF), image=r_states, image_mask=qmask, causal=True
        )
        c = "text_decoder.cls.predictions"
        h = F.layer_norm(
            F.gelu(F.linear(dec, s[f"{c}.transform.dense.weight"], s[f"{c}.transform.dense.bias"])),
            (H,),
            s[f"{c}.transform.LayerNorm.weight"],
            s[f"{c}.transform.LayerNorm.bias"],
            eps=1e-12,
        )
        r_logits = F.linear(h, s[f"{c}.decoder.weight"], s[f"{c}.decoder.bias"])
    qv, av = qmask.bool(), amask.bool()
    torch.testing.assert_close(states[qv], r_states[qv], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[av], r_logits[av], atol=1e-4, rtol=1e-5)
    # causal: an answer's logits at position t do not depend on later tokens
    cut = aids.clone()
    cut[:, 2:] = tok.mask_token_id
    with torch.no_grad():
        torch.testing.assert_close(model.answer_logits(states, qmask, cut, amask)[:, :2], logits[:, :2])
