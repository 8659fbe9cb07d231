"""ALBEF's SNLI-VE checkpoint layout: detection, round trips, key report, and the converted model's
forward against the independent plain-torch ALBEF re-implementation of tests/interop/test_albef.py."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from tests.albef_fakes import IMG, NF, L, albef_ve_state
from tests.interop.test_albef import assert_same, convert_file, random_vlp, ref_bert_layers, ref_embeddings, ref_vit
from vlp.interop.albef import convert_albef, detect_kind, export_albef
from vlp.models.ve import VEModel
from vlp.preprocess.transforms import tokenize


def test_ve_layout_detected_and_round_trips_from_albef():
    src = albef_ve_state()
    assert detect_kind(src) == "ve"
    vlp, report = convert_albef(src, "auto", expected=random_vlp("ve"))
    assert report.kind == "ve" and report.missing == []
    assert [k for k, _ in report.dropped] == [
        "text_encoder.embeddings.position_ids",
        "text_encoder_m.embeddings.position_ids",
    ]
    assert torch.equal(vlp["cls_head.2.weight"], src["cls_head.2.weight"]) and vlp["cls_head.2.weight"].shape[0] == 3
    assert torch.equal(vlp["momentum.twin.cls_head.0.bias"], src["cls_head_m.0.bias"])
    assert torch.equal(
        vlp[f"fusion.layer.{NF - 1}.crossattention.self.key.weight"],
        src[f"text_encoder.encoder.layer.{L + NF - 1}.crossattention.self.key.weight"],
    )
    assert_same(export_albef(vlp, "ve"), src)


def test_ve_round_trip_from_vlp():
    vlp = random_vlp("ve")
    albef = export_albef(vlp, "ve")
    assert detect_kind(albef) == "ve" and "cls_head_m.2.bias" in albef and "idx_queue" not in albef
    back, report = convert_albef(albef, "auto", expected=vlp)
    assert report.missing == []
    assert_same(back, vlp)


def test_converted_ve_model_matches_independent_albef_forward(tmp_path):
    s = albef_ve_state(seed=6)
    model, cfg, tok = convert_file(tmp_path, s, "ve")
    assert isinstance(model, VEModel)
    report = json.loads((tmp_path / "ve" / "key_report.json").read_text())
    assert report["counts"]["missing"] == 0 and report["counts"]["dropped"] == 2
    batch = tokenize(tok, ["two dogs run on the grass", "a man is sleeping"], cfg.model.text.max_len)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    images = torch.randn(2, 3, IMG, IMG, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        for m in ("", "_m"):
            logits = model.classify(images, ids, mask, momentum=bool(m))
            p = f"text_encoder{m}"
            text = ref_bert_layers(s, p, ref_embeddings(s, p, ids), mask, range(L))
            fused = ref_bert_layers(s, p, text, mask, range(L, L + NF), image=ref_vit(s, images, f"visual_encoder{m}"))
            ref = F.linear(
                F.relu(F.linear(fused[:, 0], s[f"cls_head{m}.0.weight"], s[f"cls_head{m}.0.bias"])),
                s[f"cls_head{m}.2.weight"],
                s[f"cls_head{m}.2.bias"],
            )
            assert logits.shape == (2, 3)
            torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)
