"""OpenAI CLIP / open_clip image-tower state dicts -> timm ``VisionTransformer`` names.

The renames are timm's own (``timm.models.vision_transformer._convert_openai_clip``); this module
adds what vlp needs around them: which timm architecture a CLIP init implies, which source keys are
dropped on purpose (with the reason written into the init report), and a clear refusal of OpenAI's
TorchScript ``.pt`` archives.

Hugging Face ``transformers`` CLIP files (``CLIPModel`` / ``CLIPVisionModel`` state dicts: keys
``vision_model.*``, e.g. the ``model.safetensors`` of ``openai/clip-vit-base-patch16``) are read
too: :func:`convert_hf_clip` renames them to OpenAI's layout (q/k/v projections concatenated into
``in_proj``) and converts those; the report names the HF keys.

CLIP ViT layout (both kinds): ``norm_pre`` LayerNorm after the embeddings (``ln_pre``), LayerNorm
eps 1e-5, patch convolution without bias, q/k/v biases. ``clip`` (OpenAI weights, and open_clip
``*-quickgelu`` models) uses QuickGELU, ``open_clip`` (e.g. LAION ``ViT-B-16``) plain GELU.
"""

from __future__ import annotations

import fnmatch
import re
import zipfile
from pathlib import Path
from typing import Optional

import torch
from torch import nn

# init kind -> timm architecture (ViT-B/16 at 224 px; vlp passes img_size/width/depth/heads over it).
CLIP_ARCHS: dict[str, str] = {
    "clip": "vit_base_patch16_clip_quickgelu_224",
    "open_clip": "vit_base_patch16_clip_224",
}

# Source keys left out on purpose: (fnmatch pattern on the key without a DDP "module." prefix, reason).
CLIP_DROPPED: tuple[tuple[str, str], ...] = (
    ("visual.proj", "CLIP image projection into CLIP's joint space; vlp learns its own vision_proj"),
    ("token_embedding.*", "CLIP text tower (vlp's text tower is BERT)"),
    ("transformer.*", "CLIP text tower (vlp's text tower is BERT)"),
    ("positional_embedding", "CLIP text tower position embedding"),
    ("ln_final.*", "CLIP text tower final LayerNorm"),
    ("text_projection", "CLIP text projection into the joint space"),
    ("logit_scale", "CLIP contrastive temperature; vlp has its own model.temp"),
    ("logit_bias", "SigLIP-style logit bias; not used by vlp"),
    ("input_resolution", "OpenAI hyper-parameter stored as a tensor"),
    ("context_length", "OpenAI hyper-parameter stored as a tensor"),
    ("vocab_size", "OpenAI hyper-parameter stored as a tensor"),
)

# What the conversion does to a tensor besides renaming it (target key pattern -> note).
CLIP_TRANSFORMS: dict[str, str] = {
    "cls_token": "visual.class_embedding [W] -> [1, 1, W]",
    "pos_embed": "visual.positional_embedding [1+G*G, W] -> [1, 1+G*G, W]",
    "blocks.*.attn.qkv.*": "attn.in_proj_* copied as is: rows are q, k, v in timm's qkv order",
}
HF_CLIP_TRANSFORMS: dict[str, str] = {
    "cls_token": "vision_model.embeddings.class_embedding [W] -> [1, 1, W]",
    "pos_embed": "vision_model.embeddings.position_embedding.weight [1+G*G, W] -> [1, 1+G*G, W]",
    "blocks.*.attn.qkv.*": "self_attn.{q,k,v}_proj.* concatenated in that order (timm's qkv rows)",
}


def clip_prefix(state: dict[str, torch.Tensor]) -> Optional[str]:
    """``"visual."`` / ``"module.visual."`` for an OpenAI/open_clip state dict, else ``None``."""
    for prefix in ("visual.", "module.visual."):
        if prefix + "class_embedding" in state:
            return prefix
    return None


def refuse_resnet_clip(state: dict[str, torch.Tensor], source: str) -> None:
    """Raise for a CLIP whose image tower is a ResNet (RN50, RN101, ...): vlp's tower is a ViT."""
    if any(k.startswith(("visual.attnpool.", "module.visual.attnpool.", "visual.layer1.")) for k in state):
        from vlp.errors import CheckpointError

        raise CheckpointError(
            f"{source}: a ResNet CLIP image tower (visual.attnpool.*, visual.layer1.*); vlp's image "
            "tower is a ViT: use a ViT CLIP (e.g. ViT-B-16) for model.vision.init=clip/open_clip"
        )


def is_torchscript(path: str | Path) -> bool:
    """Whether ``path`` is a TorchScript archive (OpenAI's released ``ViT-B-16.pt`` files are)."""
    path = Path(path)
    if not path.is_file() or not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any(n.endswith("constants.pkl") or "/code/" in n for n in z.namelist())


def refuse_torchscript(path: str | Path) -> None:
    """Raise for OpenAI's TorchScript ``.pt`` (out of scope: it is code, not a state dict)."""
    if is_torchscript(path):
        from vlp.errors import CheckpointError

        raise CheckpointError(
            f"{path}: a TorchScript archive (OpenAI's released CLIP .pt files are), which vlp does not read: it is "
            "a program, not a state dict. Load it where you trust it (clip.load(name, jit=False) or "
            "open_clip.create_model_and_transforms(..., pretrained='openai')) and save model.state_dict() to "
            ".safetensors or .pt, or use the timm hub tag vit_base_patch16_clip_224.openai"
        )


def convert_clip(
    state: dict[str, torch.Tensor], model: nn.Module, prefix: str
) -> tuple[dict[str, torch.Tensor], dict[str, str], dict[str, str]]:
    """An OpenAI/open_clip state dict in timm names -> ``(state, mapped, dropped)``.

    ``mapped``: source key -> timm key; ``dropped``: source key -> reason (:data:`CLIP_DROPPED`).
    Keys neither mapped nor dropped stay under their own name, so a strict load names them.
    """
    from timm.models.vision_transformer import _convert_openai_clip

    ddp = "module." if prefix.startswith("module.") else ""
    out: dict[str, torch.Tensor] = {}
    mapped: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for key, value in state.items():
        name = key[len(ddp) :] if ddp and key.startswith(ddp) else key
        reason = next((r for p, r in CLIP_DROPPED if fnmatch.fnmatchcase(name, p)), None)
        if reason is not None:
            dropped[key] = reason
        elif name.startswith("visual."):
            ((target, tensor),) = _convert_openai_clip({name: value}, model).items()
            mapped[key] = target
            out[target] = tensor
        else:
            out[key] = value
    return out, mapped, dropped


# Hugging Face transformers CLIP -> OpenAI names ((regex on the key, replacement); q/k/v handled apart).
HF_CLIP_RENAMES: tuple[tuple[str, str], ...] = (
    (r"vision_model\.embeddings\.class_embedding", "visual.class_embedding"),
    (r"vision_model\.embeddings\.patch_embedding\.weight", "visual.conv1.weight"),
    (r"vision_model\.embeddings\.position_embedding\.weight", "visual.positional_embedding"),
    (r"vision_model\.pre_layrnorm\.(weight|bias)", r"visual.ln_pre.\1"),  # HF's spelling
    (r"vision_model\.post_layernorm\.(weight|bias)", r"visual.ln_post.\1"),
    (
        r"vision_model\.encoder\.layers\.(\d+)\.self_attn\.out_proj\.(weight|bias)",
        r"visual.transformer.resblocks.\1.attn.out_proj.\2",
    ),
    (r"vision_model\.encoder\.layers\.(\d+)\.layer_norm1\.(weight|bias)", r"visual.transformer.resblocks.\1.ln_1.\2"),
    (r"vision_model\.encoder\.layers\.(\d+)\.layer_norm2\.(weight|bias)", r"visual.transformer.resblocks.\1.ln_2.\2"),
    (r"vision_model\.encoder\.layers\.(\d+)\.mlp\.fc1\.(weight|bias)", r"visual.transformer.resblocks.\1.mlp.c_fc.\2"),
    (
        r"vision_model\.encoder\.layers\.(\d+)\.mlp\.fc2\.(weight|bias)",
        r"visual.transformer.resblocks.\1.mlp.c_proj.\2",
    ),
)
HF_QKV = re.compile(r"vision_model\.encoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)")
HF_CLIP_DROPPED: tuple[tuple[str, str], ...] = (
    ("vision_model.embeddings.position_ids", "position index buffer (recomputed)"),
    ("visual_projection.weight", "CLIP image projection into CLIP's joint space; vlp learns its own vision_proj"),
    ("text_model.*", "CLIP text tower (vlp's text tower is BERT)"),
    ("text_projection.weight", "CLIP text projection into the joint space"),
    ("logit_scale", "CLIP contrastive temperature; vlp has its own model.temp"),
)


def is_hf_clip(state: dict[str, torch.Tensor]) -> bool:
    """Whether ``state`` is a transformers ``CLIPModel`` / ``CLIPVisionModel`` state dict (keys
    ``vision_model.*``; recent transformers save ``CLIPVisionModel`` without that prefix)."""
    return "vision_model.embeddings.class_embedding" in state or _bare_hf_vision(state)


def _bare_hf_vision(state: dict[str, torch.Tensor]) -> bool:
    return "embeddings.class_embedding" in state and "pre_layrnorm.weight" in state


def convert_hf_clip(
    state: dict[str, torch.Tensor], model: nn.Module
) -> tuple[dict[str, torch.Tensor], dict[str, str], dict[str, str]]:
    """A transformers CLIP state dict -> ``(state, mapped, dropped)`` in timm names, as
    :func:`convert_clip`; ``mapped`` is keyed by the HF names (each of q/k/v_proj maps to the
    block's ``attn.qkv``). Unknown keys stay under their own name (the strict load names them)."""
    openai: dict[str, torch.Tensor] = {}
    origin: dict[str, list[str]] = {}  # OpenAI key -> the HF keys it was made of
    dropped: dict[str, str] = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    bare = _bare_hf_vision(state)
    source = {("vision_model." + k if bare else k): k for k in state}  # our name -> the file's name
    for key, src in source.items():
        value = state[src]
        reason = next((r for p, r in HF_CLIP_DROPPED if fnmatch.fnmatchcase(key, p)), None)
        m = HF_QKV.fullmatch(key)
        if reason is not None:
            dropped[src] = reason
        elif m:
            qkv.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = value
        else:
            new = next((re.sub(p, r, key) for p, r in HF_CLIP_RENAMES if re.fullmatch(p, key)), src)
            openai[new], origin[new] = value, [src]
    for (layer, kind), parts in qkv.items():
        names = {x: source[f"vision_model.encoder.layers.{layer}.self_attn.{x}_proj.{kind}"] for x in parts}
        if set(parts) != set("qkv"):
            for x, v in parts.items():  # incomplete: left as is, the strict load reports them
                openai[names[x]] = v
            continue
        key = f"visual.transformer.resblocks.{layer}.attn.in_proj_{kind}"
        openai[key], origin[key] = torch.cat([parts["q"], parts["k"], parts["v"]], 0), [names[x] for x in "qkv"]
    out, mapped_openai, _ = convert_clip(openai, model, "visual.")
    mapped = {src: target for key, target in mapped_openai.items() for src in origin[key]}
    return out, mapped, dropped
