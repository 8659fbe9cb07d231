"""OpenAI CLIP / open_clip image-tower state dicts -> timm ``VisionTransformer`` names.

The renames are timm's own (``timm.models.vision_transformer._convert_openai_clip``); this module
adds what vlp needs around them: which timm architecture a CLIP init implies, which source keys are
dropped on purpose (with the reason written into the init report), and a clear refusal of OpenAI's
TorchScript ``.pt`` archives.

CLIP ViT layout (both kinds): ``norm_pre`` LayerNorm after the embeddings (``ln_pre``), LayerNorm
eps 1e-5, patch convolution without bias, q/k/v biases. ``clip`` (OpenAI weights, and open_clip
``*-quickgelu`` models) uses QuickGELU, ``open_clip`` (e.g. LAION ``ViT-B-16``) plain GELU.
"""

from __future__ import annotations

import fnmatch
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


def clip_prefix(state: dict[str, torch.Tensor]) -> Optional[str]:
    """``"visual."`` / ``"module.visual."`` for an OpenAI/open_clip state dict, else ``None``."""
    for prefix in ("visual.", "module.visual."):
        if prefix + "class_embedding" in state:
            return prefix
    return None


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
        from vlp.models.loading import CheckpointError

        raise CheckpointError(
            f"{path}: a TorchScript archive (OpenAI's released CLIP .pt files are), which vlp does not read: it is "
            "a program, not a state dict. Load it where you trust it (clip.load(name, jit=False) or "
            "open_clip.create_model_and_transforms(..., pretrained='openai')) and save model.state_dict() to "
            ".safetensors or .pt, or use the timm hub tag vit_base_patch16_clip_224.openai")


def convert_clip(state: dict[str, torch.Tensor], model: nn.Module, prefix: str
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
        name = key[len(ddp):] if ddp and key.startswith(ddp) else key
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


def synthetic_clip_state(width: int, depth: int, patch: int, grid: int, embed: int = 16,
                         seed: int = 0) -> dict[str, torch.Tensor]:
    """A random OpenAI/open_clip ``model.state_dict()`` (image tower + a few text-tower keys) at any
    size: what the tests and ``scripts/make_tiny_vision_weights.py`` load, since no real CLIP
    weights can be downloaded offline."""
    W, DEPTH, PATCH, EMBED = width, depth, patch, embed
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.2

    sd = {"visual.conv1.weight": r(W, 3, PATCH, PATCH), "visual.class_embedding": r(W),
          "visual.positional_embedding": r(1 + grid * grid, W),
          "visual.ln_pre.weight": 1 + r(W), "visual.ln_pre.bias": r(W)}
    for i in range(DEPTH):
        b = f"visual.transformer.resblocks.{i}."
        sd.update({b + "ln_1.weight": 1 + r(W), b + "ln_1.bias": r(W),
                   b + "attn.in_proj_weight": r(3 * W, W), b + "attn.in_proj_bias": r(3 * W),
                   b + "attn.out_proj.weight": r(W, W), b + "attn.out_proj.bias": r(W),
                   b + "ln_2.weight": 1 + r(W), b + "ln_2.bias": r(W),
                   b + "mlp.c_fc.weight": r(4 * W, W), b + "mlp.c_fc.bias": r(4 * W),
                   b + "mlp.c_proj.weight": r(W, 4 * W), b + "mlp.c_proj.bias": r(W)})
    sd.update({"visual.ln_post.weight": 1 + r(W), "visual.ln_post.bias": r(W), "visual.proj": r(W, EMBED)})
    # text tower, temperature and OpenAI's hyper-parameter tensors: dropped on purpose
    sd.update({"token_embedding.weight": r(50, EMBED), "positional_embedding": r(8, EMBED),
               "transformer.resblocks.0.ln_1.weight": r(EMBED), "transformer.resblocks.0.attn.in_proj_weight": r(3 * EMBED, EMBED),
               "ln_final.weight": r(EMBED), "ln_final.bias": r(EMBED), "text_projection": r(EMBED, EMBED),
               "logit_scale": torch.tensor(4.6), "input_resolution": torch.tensor(32), "context_length": torch.tensor(8),
               "vocab_size": torch.tensor(50)})
    return sd
