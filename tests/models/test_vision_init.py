"""Image-tower initialisation from CLIP / open_clip / DeiT / HF-safetensors files generated here."""

import json

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from tests.helpers import load_script
from vlp.config import VisionConfig
from vlp.errors import CheckpointError, ConfigError
from vlp.models.clip_weights import CLIP_DROPPED, CLIP_TRANSFORMS
from vlp.models.vision import (
    TIMM_DROPPED,
    build_vision,
    check_vision_init,
    report_line,
    resize_pos_embed,
    write_init_report,
)

# random CLIP weights at any size, from the script that writes the tiny weight files of docs/training.md
synthetic_clip_state = load_script("scripts/make_tiny_vision_weights.py").synthetic_clip_state

W, HEADS, DEPTH, PATCH, EMBED = 32, 2, 2, 8, 16  # tiny CLIP: 32 px -> 4x4 grid + CLS
CLIP_REASON = dict(CLIP_DROPPED)
TIMM_REASON = dict(TIMM_DROPPED)


def clip_state(grid: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    """An OpenAI/open_clip ``model.state_dict()`` at tiny size: image tower + text tower keys."""
    return synthetic_clip_state(W, DEPTH, PATCH, grid, EMBED, seed)


def clip_cfg(path, kind: str = "clip", img_size: int = 32, **kw) -> VisionConfig:
    """The tiny ViT initialised from ``path`` (``init=kind``)."""
    return VisionConfig(
        preset="tiny",
        img_size=img_size,
        patch_size=PATCH,
        width=W,
        depth=DEPTH,
        heads=HEADS,
        init=kind,
        pretrained=str(path),
        **kw,
    )


def expected_clip_mapping() -> dict[str, str]:
    m = {
        "visual.conv1.weight": "patch_embed.proj.weight",
        "visual.class_embedding": "cls_token",
        "visual.positional_embedding": "pos_embed",
        "visual.ln_pre.weight": "norm_pre.weight",
        "visual.ln_pre.bias": "norm_pre.bias",
        "visual.ln_post.weight": "norm.weight",
        "visual.ln_post.bias": "norm.bias",
    }
    names = {
        "ln_1": "norm1",
        "attn.in_proj_weight": "attn.qkv.weight",
        "attn.in_proj_bias": "attn.qkv.bias",
        "attn.out_proj": "attn.proj",
        "ln_2": "norm2",
        "mlp.c_fc": "mlp.fc1",
        "mlp.c_proj": "mlp.fc2",
    }
    for i in range(DEPTH):
        for src, dst in names.items():
            for suffix in ("",) if src.startswith("attn.in_proj") else (".weight", ".bias"):
                m[f"visual.transformer.resblocks.{i}.{src}{suffix}"] = f"blocks.{i}.{dst}{suffix}"
    return m


def plain_clip_forward(sd: dict[str, torch.Tensor], img: torch.Tensor, quick_gelu: bool) -> torch.Tensor:
    """CLIP's ViT written out in plain torch (pre-LN blocks), ``ln_post`` on every token."""
    p = "visual."

    def ln(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (W,), sd[p + name + ".weight"], sd[p + name + ".bias"], eps=1e-5)

    x = F.conv2d(img, sd[p + "conv1.weight"], stride=PATCH).flatten(2).transpose(1, 2)  # no bias
    x = torch.cat([sd[p + "class_embedding"].expand(x.shape[0], 1, W), x], dim=1) + sd[p + "positional_embedding"]
    x = ln(x, "ln_pre")
    B, T, _ = x.shape
    for i in range(DEPTH):
        b = f"transformer.resblocks.{i}."
        q, k, v = F.linear(ln(x, b + "ln_1"), sd[p + b + "attn.in_proj_weight"], sd[p + b + "attn.in_proj_bias"]).chunk(
            3, -1
        )
        q, k, v = (t.reshape(B, T, HEADS, W // HEADS).transpose(1, 2) for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) / (W // HEADS) ** 0.5, dim=-1) @ v
        x = x + F.linear(
            a.transpose(1, 2).reshape(B, T, W), sd[p + b + "attn.out_proj.weight"], sd[p + b + "attn.out_proj.bias"]
        )
        h = F.linear(ln(x, b + "ln_2"), sd[p + b + "mlp.c_fc.weight"], sd[p + b + "mlp.c_fc.bias"])
        h = h * torch.sigmoid(1.702 * h) if quick_gelu else F.gelu(h)
        x = x + F.linear(h, sd[p + b + "mlp.c_proj.weight"], sd[p + b + "mlp.c_proj.bias"])
    return ln(x, "ln_post")


@pytest.mark.parametrize("kind,quick_gelu", [("clip", True), ("open_clip", False)])
def test_clip_tower_forward_equals_plain_torch_clip(tmp_path, kind, quick_gelu):
    sd = clip_state()
    torch.save(sd, tmp_path / "clip.pt")  # open_clip-style .pt state dict
    vit = build_vision(clip_cfg(tmp_path / "clip.pt", kind)).eval()
    img = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = vit.forward_features(img)
        ref = plain_clip_forward(sd, img, quick_gelu)
        other = plain_clip_forward(sd, img, not quick_gelu)
    assert ours.shape == (2, 17, W)
    assert torch.allclose(ours, ref, atol=1e-5), (ours - ref).abs().max()
    assert not torch.allclose(ours, other, atol=1e-3)  # the activation matters: the check can tell them apart
    assert vit.patch_embed.proj.bias is None  # CLIP's conv1 has no bias


def test_clip_tensors_and_report_exactly(tmp_path):
    sd = clip_state()
    save_file(sd, str(tmp_path / "open_clip_model.safetensors"))
    vit = build_vision(clip_cfg(tmp_path / "open_clip_model.safetensors", "open_clip"))
    own = vit.state_dict()
    rep = vit.init_report
    assert rep["mapped"] == expected_clip_mapping()
    for src, dst in rep["mapped"].items():
        want = sd[src].reshape(own[dst].shape)  # class_embedding [W] -> [1,1,W]; positional_embedding -> [1,T,W]
        assert torch.equal(own[dst], want), src
    assert torch.equal(vit.blocks[1].attn.qkv.weight, sd["visual.transformer.resblocks.1.attn.in_proj_weight"])
    assert set(own) == set(rep["mapped"].values())  # every tower tensor comes from the file
    dropped_keys = [
        "visual.proj",
        "token_embedding.weight",
        "positional_embedding",
        "transformer.resblocks.0.ln_1.weight",
        "transformer.resblocks.0.attn.in_proj_weight",
        "ln_final.weight",
        "ln_final.bias",
        "text_projection",
        "logit_scale",
        "input_resolution",
        "context_length",
        "vocab_size",
    ]
    reason = {
        k: next(r for p, r in CLIP_DROPPED if p == k or (p.endswith(".*") and k.startswith(p[:-1])))
        for k in dropped_keys
    }
    assert rep == dict(
        init="open_clip",
        source=str(tmp_path / "open_clip_model.safetensors"),
        arch="vit_base_patch16_clip_224",
        format="clip",
        mapped=expected_clip_mapping(),
        dropped=reason,
        missing=[],
        transforms=CLIP_TRANSFORMS,
    )
    assert rep["dropped"]["visual.proj"] == CLIP_REASON["visual.proj"]
    line = report_line(rep)
    assert line == (
        f"vision init: open_clip from {tmp_path / 'open_clip_model.safetensors'} (clip names, arch "
        "vit_base_patch16_clip_224): 31 tensors mapped, 12 dropped on purpose, 0 left random"
    )


def test_clip_pos_embed_resized_with_resize_pos_embed(tmp_path):
    sd = clip_state()
    torch.save(sd, tmp_path / "clip.pt")
    vit = build_vision(clip_cfg(tmp_path / "clip.pt", img_size=48))  # 4x4 -> 6x6 grid
    want = resize_pos_embed(sd["visual.positional_embedding"][None], 1 + 36)
    assert vit.pos_embed.shape == (1, 37, W)
    assert torch.equal(vit.pos_embed, want)
    assert torch.equal(vit.pos_embed[:, 0], sd["visual.positional_embedding"][None, 0])  # class token kept
    assert vit.init_report["transforms"]["pos_embed"] == (
        CLIP_TRANSFORMS["pos_embed"] + "; grid 4x4 -> 6x6 (resize_pos_embed: bicubic, class token kept)"
    )


def test_ddp_open_clip_training_checkpoint(tmp_path):
    sd = {"module." + k: v for k, v in clip_state().items()}
    torch.save({"epoch": 3, "name": "run", "state_dict": sd}, tmp_path / "epoch_3.pt")
    vit = build_vision(clip_cfg(tmp_path / "epoch_3.pt"))
    assert torch.equal(vit.norm_pre.weight, sd["module.visual.ln_pre.weight"])
    assert vit.init_report["mapped"]["module.visual.conv1.weight"] == "patch_embed.proj.weight"
    assert "module.logit_scale" in vit.init_report["dropped"]


def test_clip_layout_is_checked_and_unknown_keys_fail(tmp_path):
    sd = clip_state()
    torch.save(sd, tmp_path / "clip.pt")
    with pytest.raises(ConfigError, match="not the CLIP ViT layout"):
        build_vision(clip_cfg(tmp_path / "clip.pt", arch="vit_tiny_patch16_224"))
    with pytest.raises(ConfigError, match="QuickGELU"):  # open_clip (GELU) arch with OpenAI weights
        build_vision(clip_cfg(tmp_path / "clip.pt", arch="vit_base_patch16_clip_224"))
    torch.save({**sd, "visual.extra_token": torch.zeros(W)}, tmp_path / "odd.pt")
    with pytest.raises(CheckpointError, match=r"unexpected keys \(1\): \['extra_token'\]"):
        build_vision(clip_cfg(tmp_path / "odd.pt"))
    del sd["visual.ln_pre.bias"]
    torch.save(sd, tmp_path / "short.pt")
    with pytest.raises(CheckpointError, match=r"missing keys \(1\): \['norm_pre.bias'\]"):
        build_vision(clip_cfg(tmp_path / "short.pt"))
    vit = build_vision(clip_cfg(tmp_path / "short.pt", init_allow_missing=["norm_pre.bias"]))
    assert vit.init_report["missing"] == ["norm_pre.bias"]


def deit_source(distilled: bool, img_size: int = 32) -> nn.Module:
    torch.manual_seed(0)
    arch = "deit_tiny_distilled_patch16_224" if distilled else "deit_tiny_patch16_224"
    return timm.create_model(
        arch, img_size=img_size, patch_size=PATCH, embed_dim=W, depth=DEPTH, num_heads=HEADS, num_classes=10
    )


def deit_cfg(path, img_size: int = 48, **kw) -> VisionConfig:
    return clip_cfg(path, "deit", img_size, **kw)


def test_deit_init_drops_the_head(tmp_path):
    src = deit_source(distilled=False).state_dict()
    torch.save({"model": src}, tmp_path / "deit.pth")  # DeiT's released .pth layout
    vit = build_vision(deit_cfg(tmp_path / "deit.pth"))
    rep = vit.init_report
    kept = [k for k in src if not k.startswith("head.")]
    assert rep == dict(
        init="deit",
        source=str(tmp_path / "deit.pth"),
        arch="vit_tiny_patch16_224",
        format="timm",
        mapped={k: k for k in kept},
        dropped={"head.weight": TIMM_REASON["head.*"], "head.bias": TIMM_REASON["head.*"]},
        missing=[],
        transforms={"pos_embed": "grid 4x4 -> 6x6 (resize_pos_embed: bicubic, class token kept)"},
    )
    own = vit.state_dict()
    for k in kept:
        want = resize_pos_embed(src[k], 37) if k == "pos_embed" else src[k]
        assert torch.equal(own[k], want), k


def test_distilled_deit_drops_dist_token_and_its_pos_embed_row(tmp_path):
    src = deit_source(distilled=True).state_dict()
    assert src["pos_embed"].shape == (1, 2 + 16, W)  # CLS, dist, 4x4 grid
    torch.save(src, tmp_path / "deit_distilled.pth")
    vit = build_vision(deit_cfg(tmp_path / "deit_distilled.pth"))
    rep = vit.init_report
    assert rep["dropped"] == {
        "dist_token": TIMM_REASON["dist_token"],
        "head.weight": TIMM_REASON["head.*"],
        "head.bias": TIMM_REASON["head.*"],
        "head_dist.weight": TIMM_REASON["head_dist.*"],
        "head_dist.bias": TIMM_REASON["head_dist.*"],
    }
    assert rep["transforms"] == {
        "pos_embed": "row 1 (distillation token) dropped; grid 4x4 -> 6x6 (resize_pos_embed: bicubic, class token kept)"
    }
    no_dist = torch.cat([src["pos_embed"][:, :1], src["pos_embed"][:, 2:]], dim=1)
    assert torch.equal(vit.pos_embed, resize_pos_embed(no_dist, 37))
    assert torch.equal(vit.cls_token, src["cls_token"])
    assert rep["missing"] == []


def test_hf_safetensors_file_and_directory(tmp_path):
    """What a timm hub repo holds (``model.safetensors``), read as a file or as its directory."""
    src = deit_source(distilled=False, img_size=48).state_dict()
    (tmp_path / "hub").mkdir()
    save_file(src, str(tmp_path / "hub" / "model.safetensors"))
    for path in (tmp_path / "hub" / "model.safetensors", tmp_path / "hub"):
        vit = build_vision(deit_cfg(path))
        assert torch.equal(vit.pos_embed, src["pos_embed"])  # same grid: no resize
        assert vit.init_report["transforms"] == {}
        assert torch.equal(vit.blocks[1].mlp.fc2.weight, src["blocks.1.mlp.fc2.weight"])


def test_default_init_keeps_todays_behaviour(tmp_path):
    src = deit_source(distilled=False, img_size=48).state_dict()
    save_file(src, str(tmp_path / "vit.safetensors"))
    cfg = VisionConfig(
        preset="tiny",
        img_size=48,
        patch_size=PATCH,
        width=W,
        depth=DEPTH,
        heads=HEADS,
        pretrained=str(tmp_path / "vit.safetensors"),
    )
    vit = build_vision(cfg)
    assert vit.init_report["init"] == "timm" and vit.init_report["arch"] == "vit_tiny_patch16_224"
    assert torch.equal(vit.blocks[0].attn.qkv.weight, src["blocks.0.attn.qkv.weight"])
    rand = build_vision(VisionConfig(preset="tiny", depth=1))
    assert rand.init_report["init"] == "none" and rand.init_report["source"] is None


def test_offline_hub_name_asks_for_a_local_file(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = VisionConfig(
        preset="tiny", width=W, depth=DEPTH, heads=HEADS, init="deit", pretrained="deit_tiny_patch16_224.fb_in1k"
    )
    with pytest.raises(CheckpointError) as e:
        build_vision(cfg)
    msg = str(e.value)
    assert "model.vision.pretrained='deit_tiny_patch16_224.fb_in1k' is a hub name" in msg
    assert "offline mode: HF_HUB_OFFLINE=1" in msg
    assert "pass the local file: model.vision.pretrained=/path/to/weights" in msg
    assert "OpenAI's TorchScript .pt is not read" in msg
    with pytest.raises(CheckpointError, match="no such file, and not a timm pretrained tag"):
        build_vision(VisionConfig(preset="tiny", init="clip", pretrained="/nowhere/ViT-B-16.pt"))


def test_openai_torchscript_archive_is_refused(tmp_path):
    torch.jit.save(torch.jit.script(nn.Linear(2, 2)), str(tmp_path / "ViT-B-16.pt"))
    with pytest.raises(CheckpointError, match="TorchScript archive.*jit=False"):
        build_vision(clip_cfg(tmp_path / "ViT-B-16.pt"))


def test_report_written_to_the_run_directory(tmp_path, capsys):
    torch.save(clip_state(), tmp_path / "clip.pt")

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vision = build_vision(clip_cfg(tmp_path / "clip.pt"))

    model = Model()
    out = write_init_report(model, tmp_path)
    assert out == tmp_path / "vision_init_report.json"
    assert json.loads(out.read_text()) == model.vision.init_report
    line = capsys.readouterr().out.strip()
    assert line == report_line(model.vision.init_report)
    assert (
        line.startswith("vision init: clip from ") and "(clip names, arch vit_base_patch16_clip_quickgelu_224)" in line
    )
    assert line.endswith("31 tensors mapped, 12 dropped on purpose, 0 left random")
    assert write_init_report(nn.Linear(1, 1), tmp_path / "none") is None  # no ViT tower (dual encoder): nothing


def test_init_config_checks():
    with pytest.raises(ConfigError, match="model.vision.init"):
        VisionConfig(init="openai")
    with pytest.raises(ConfigError, match="init=none loads no weights"):
        VisionConfig(init="none", pretrained="x.pth")
    with pytest.raises(ConfigError, match="model.vision.init=clip needs a weights file"):
        check_vision_init(VisionConfig(init="clip"))
    # a checkpoint reload clears `pretrained`: the CLIP layout is built with random weights
    vit = build_vision(VisionConfig(preset="tiny", width=W, depth=1, heads=HEADS, init="clip"))
    assert isinstance(vit.norm_pre, nn.LayerNorm) and vit.init_report["source"] is None


def hf_clip_model(vision_only: bool = False, seed: int = 0):
    """A tiny transformers CLIPModel (or CLIPVisionModel) with random, non-default weights: the
    real Hugging Face layout (keys ``vision_model.*``), made by transformers itself."""
    from transformers import CLIPConfig, CLIPModel, CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(seed)
    vc = dict(
        hidden_size=W,
        intermediate_size=4 * W,
        num_hidden_layers=DEPTH,
        num_attention_heads=HEADS,
        image_size=32,
        patch_size=PATCH,
        projection_dim=EMBED,
    )
    if vision_only:
        model = CLIPVisionModel(CLIPVisionConfig(**vc))
    else:
        tc = dict(
            hidden_size=EMBED,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            vocab_size=50,
            max_position_embeddings=8,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
        )
        model = CLIPModel(CLIPConfig(text_config=tc, vision_config=vc, projection_dim=EMBED))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # LayerNorms and biases away from 1 / 0
    return model.eval()


@pytest.mark.parametrize("vision_only", [False, True])
def test_hf_clip_file_gives_the_hf_vision_tower_outputs(tmp_path, vision_only):
    model = hf_clip_model(vision_only)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(tmp_path / "model.safetensors"))  # what openai/clip-vit-base-patch16 holds
    vit = build_vision(clip_cfg(tmp_path, "clip")).eval()  # the repository folder
    rep = vit.init_report
    img = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = vit.forward_features(img)
        tower = getattr(model, "vision_model", model)  # recent transformers: CLIPVisionModel is the tower itself
        hf = tower(pixel_values=img)
        gelu = build_vision(clip_cfg(tmp_path, "open_clip")).eval().forward_features(img)
    torch.testing.assert_close(ours[:, 0], hf.pooler_output, atol=1e-5, rtol=1e-5)  # post-LN CLS
    torch.testing.assert_close(ours, tower.post_layernorm(hf.last_hidden_state), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(gelu, ours, atol=1e-3)  # HF's OpenAI CLIP is QuickGELU: init=clip, not open_clip
    assert rep["format"] == "hf_clip" and rep["missing"] == []
    v = "vision_model." if "vision_model.pre_layrnorm.weight" in sd else ""  # recent CLIPVisionModel: no prefix
    p = f"{v}encoder.layers.1."
    assert {rep["mapped"][p + f"self_attn.{x}_proj.weight"] for x in "qkv"} == {"blocks.1.attn.qkv.weight"}
    assert rep["mapped"][f"{v}pre_layrnorm.weight"] == "norm_pre.weight"
    assert rep["mapped"][f"{v}embeddings.patch_embedding.weight"] == "patch_embed.proj.weight"
    assert set(rep["mapped"].values()) == set(vit.state_dict())  # every tower tensor from the file
    position_ids = {k for k in sd if k.endswith("embeddings.position_ids")}
    vision_keys = {k for k in sd if k.startswith(v) and not k.startswith("text_model.")} - position_ids
    assert set(rep["mapped"]) == vision_keys
    assert set(rep["dropped"]) == (set(sd) - vision_keys)
    if not vision_only:
        assert rep["dropped"]["visual_projection.weight"].startswith("CLIP image projection")
        assert rep["dropped"]["text_model.encoder.layers.0.mlp.fc1.weight"].startswith("CLIP text tower")
    assert torch.equal(
        vit.blocks[0].attn.qkv.bias, torch.cat([sd[f"{v}encoder.layers.0.self_attn.{x}_proj.bias"] for x in "qkv"])
    )


def test_hf_clip_pos_embed_is_interpolated_and_bad_keys_fail(tmp_path):
    sd = {k: v.contiguous() for k, v in hf_clip_model(vision_only=True).state_dict().items()}
    save_file(sd, str(tmp_path / "clip.safetensors"))
    vit = build_vision(clip_cfg(tmp_path / "clip.safetensors", "clip", img_size=48))
    assert vit.pos_embed.shape == (1, 1 + 6 * 6, W) and "pos_embed" in vit.init_report["transforms"]
    (pos,) = (t for k, t in sd.items() if k.endswith("embeddings.position_embedding.weight"))
    torch.testing.assert_close(vit.pos_embed[0, 0], pos[0])
    (v_proj,) = (k for k in sd if k.endswith("encoder.layers.1.self_attn.v_proj.weight"))
    del sd[v_proj]
    save_file(sd, str(tmp_path / "broken.safetensors"))
    with pytest.raises(CheckpointError, match="self_attn.q_proj.weight"):  # left unconverted: named by the strict load
        build_vision(clip_cfg(tmp_path / "broken.safetensors", "clip"))


def test_hf_repository_name_offline_asks_for_a_local_file(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CheckpointError, match="'openai/clip-vit-base-patch16' is a hub name.*HF_HUB_OFFLINE=1"):
        build_vision(VisionConfig(preset="tiny", init="clip", pretrained="openai/clip-vit-base-patch16"))


def test_resnet_clip_is_refused_with_a_hint(tmp_path):
    sd = {
        "visual.conv1.weight": torch.zeros(32, 3, 3, 3),
        "visual.bn1.weight": torch.ones(32),
        "visual.layer1.0.conv1.weight": torch.zeros(32, 32, 1, 1),
        "visual.attnpool.positional_embedding": torch.zeros(50, 64),
        "visual.attnpool.c_proj.weight": torch.zeros(16, 64),
        "logit_scale": torch.tensor(4.6),
    }
    torch.save(sd, tmp_path / "RN50.pt")
    with pytest.raises(CheckpointError, match=r"RN50.pt: a ResNet CLIP image tower .* use a ViT CLIP"):
        build_vision(clip_cfg(tmp_path / "RN50.pt", "clip"))
