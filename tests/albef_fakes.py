"""Tiny official-ALBEF checkpoints built from the documented key patterns (albef.md §12.2), not from
vlp's rule table: the pretrain and retrieval (``albef_state``), NLVR2, SNLI-VE and VQA layouts. Shared by
tests/interop/test_albef.py (conversion) and tests/interop/test_zoo.py (download, convert, load)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vlp.config import ModelConfig, TextConfig, VisionConfig

# Tiny dims: ViT width 64 (1 head), depth 2, 32 px / patch 8; BERT hidden 64 (2 heads: head dim 32,
# so the CLI needs --config), 2 text + 2 fusion layers, FFN 128; embed 16; queue 8.
W, DEPTH, V_HEADS, PATCH, IMG = 64, 2, 1, 8, 32
H, L, NF, T_HEADS, FFN, E, Q, VOCAB = 64, 2, 2, 2, 128, 16, 8, 30522


def tiny_config() -> ModelConfig:
    return ModelConfig(
        vision=VisionConfig(width=W, depth=DEPTH, heads=V_HEADS, patch_size=PATCH, img_size=IMG),
        text=TextConfig(hidden=H, layers=L, fusion_layers=NF, heads=T_HEADS, intermediate=FFN),
        embed_dim=E,
        queue_size=Q,
    )


# ----------------------------------------------------------------------------- ALBEF-layout states
# Written from the documented key patterns (albef.md §12.2), not from vlp's rule table.


def _lin(out: int, inp: int, g: torch.Generator, name: str) -> dict[str, torch.Tensor]:
    return {
        f"{name}.weight": torch.randn(out, inp, generator=g) * 0.1,
        f"{name}.bias": torch.randn(out, generator=g) * 0.1,
    }


def _ln(dim: int, g: torch.Generator, name: str) -> dict[str, torch.Tensor]:
    return {
        f"{name}.weight": 1 + torch.randn(dim, generator=g) * 0.1,
        f"{name}.bias": torch.randn(dim, generator=g) * 0.1,
    }


def albef_vit(g: torch.Generator, p: str) -> dict[str, torch.Tensor]:
    n = (IMG // PATCH) ** 2
    s = {
        f"{p}.cls_token": torch.randn(1, 1, W, generator=g) * 0.1,
        f"{p}.pos_embed": torch.randn(1, 1 + n, W, generator=g) * 0.1,
        f"{p}.patch_embed.proj.weight": torch.randn(W, 3, PATCH, PATCH, generator=g) * 0.1,
        f"{p}.patch_embed.proj.bias": torch.randn(W, generator=g) * 0.1,
        **_ln(W, g, f"{p}.norm"),
    }
    for i in range(DEPTH):
        b = f"{p}.blocks.{i}"
        s |= _ln(W, g, f"{b}.norm1") | _lin(3 * W, W, g, f"{b}.attn.qkv") | _lin(W, W, g, f"{b}.attn.proj")
        s |= _ln(W, g, f"{b}.norm2") | _lin(4 * W, W, g, f"{b}.mlp.fc1") | _lin(W, 4 * W, g, f"{b}.mlp.fc2")
    return s


def albef_bert(g: torch.Generator, p: str, layers: int, cross_from: int) -> dict[str, torch.Tensor]:
    """BERT embeddings + ``layers`` layers (cross-attention in layers >= ``cross_from``), no pooler."""
    s = {
        f"{p}.embeddings.position_ids": torch.arange(512).unsqueeze(0),
        f"{p}.embeddings.word_embeddings.weight": torch.randn(VOCAB, H, generator=g) * 0.1,
        f"{p}.embeddings.position_embeddings.weight": torch.randn(512, H, generator=g) * 0.1,
        f"{p}.embeddings.token_type_embeddings.weight": torch.randn(2, H, generator=g) * 0.1,
        **_ln(H, g, f"{p}.embeddings.LayerNorm"),
    }
    for i in range(layers):
        b = f"{p}.encoder.layer.{i}"
        parts = ["attention"] + (["crossattention"] if i >= cross_from else [])
        for a in parts:
            kv = W if a == "crossattention" else H  # ALBEF encoder_width = ViT width
            s |= (
                _lin(H, H, g, f"{b}.{a}.self.query")
                | _lin(H, kv, g, f"{b}.{a}.self.key")
                | _lin(H, kv, g, f"{b}.{a}.self.value")
            )
            s |= _lin(H, H, g, f"{b}.{a}.output.dense") | _ln(H, g, f"{b}.{a}.output.LayerNorm")
        s |= (
            _lin(FFN, H, g, f"{b}.intermediate.dense")
            | _lin(H, FFN, g, f"{b}.output.dense")
            | _ln(H, g, f"{b}.output.LayerNorm")
        )
    return s


def albef_lm_head(g: torch.Generator, p: str, word: torch.Tensor) -> dict[str, torch.Tensor]:
    bias = torch.randn(VOCAB, generator=g) * 0.1
    return {
        f"{p}.bias": bias,
        **_lin(H, H, g, f"{p}.transform.dense"),
        **_ln(H, g, f"{p}.transform.LayerNorm"),
        f"{p}.decoder.weight": word,
        f"{p}.decoder.bias": bias,
    }  # both tied, as HF saves them


def albef_state(kind: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random ALBEF ``pretrain`` or ``retrieval`` state dict in the documented layout, momentum twins different."""
    g = torch.Generator().manual_seed(seed)
    s: dict[str, torch.Tensor] = {
        "temp": torch.tensor(0.07),
        "queue_ptr": torch.tensor([3]),
        "image_queue": F.normalize(torch.randn(E, Q, generator=g), dim=0),
        "text_queue": F.normalize(torch.randn(E, Q, generator=g), dim=0),
        **_lin(2, H, g, "itm_head"),
    }
    if kind == "retrieval":
        s["idx_queue"] = torch.randint(0, 50, (1, Q), generator=g)
    for m in ("", "_m"):
        s |= albef_vit(g, f"visual_encoder{m}") | _lin(E, W, g, f"vision_proj{m}") | _lin(E, H, g, f"text_proj{m}")
        bert = f"text_encoder{m}.bert" if kind == "pretrain" else f"text_encoder{m}"
        s |= albef_bert(g, bert, L + NF, L)
        if kind == "pretrain":
            s |= albef_lm_head(g, f"text_encoder{m}.cls.predictions", s[f"{bert}.embeddings.word_embeddings.weight"])
    return s


def albef_nlvr_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """ALBEF's fine-tuned NLVR2 layout (albef.md §6, §12): plain BERT (no ``bert.``) of L + 2*NF
    layers, cross-attention in L.., K/V shared by the pairs (L+2i, L+2i+1); ``cls_head`` =
    Linear(H,H), ReLU, Linear(H,2); momentum twins."""
    g = torch.Generator().manual_seed(seed)
    s: dict[str, torch.Tensor] = {}
    for m in ("", "_m"):
        s |= albef_vit(g, f"visual_encoder{m}") | albef_bert(g, f"text_encoder{m}", L + 2 * NF, L)
        for i in range(NF):
            for t in ("key", "value"):
                for w in ("weight", "bias"):
                    pair = [
                        f"text_encoder{m}.encoder.layer.{L + 2 * i + j}.crossattention.self.{t}.{w}" for j in (0, 1)
                    ]
                    s[pair[1]] = s[pair[0]]
        s |= _lin(H, H, g, f"cls_head{m}.0") | _lin(2, H, g, f"cls_head{m}.2")
    return s


def albef_ve_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """ALBEF's SNLI-VE layout (albef.md §12.2): plain BERT (no ``bert.``) of L + NF layers,
    cross-attention in L..; ``cls_head`` = Linear(H,H), ReLU, Linear(H,3); momentum twins."""
    g = torch.Generator().manual_seed(seed)
    s: dict[str, torch.Tensor] = {}
    for m in ("", "_m"):
        s |= albef_vit(g, f"visual_encoder{m}") | albef_bert(g, f"text_encoder{m}", L + NF, L)
        s |= _lin(H, H, g, f"cls_head{m}.0") | _lin(3, H, g, f"cls_head{m}.2")
    return s


def albef_vqa_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """ALBEF's VQA layout (albef.md §5, §12): plain-BERT encoder, ``text_decoder.bert`` of NF layers
    all with cross-attention (to the question states), ``text_decoder.cls.predictions`` LM head
    tied to the decoder's word embeddings; momentum twins."""
    g = torch.Generator().manual_seed(seed)
    s: dict[str, torch.Tensor] = {}
    for m in ("", "_m"):
        s |= albef_vit(g, f"visual_encoder{m}") | albef_bert(g, f"text_encoder{m}", L + NF, L)
        s |= albef_bert(g, f"text_decoder{m}.bert", NF, 0)
        s |= albef_lm_head(
            g, f"text_decoder{m}.cls.predictions", s[f"text_decoder{m}.bert.embeddings.word_embeddings.weight"]
        )
    return s


def stride0_bomb(state: dict[str, torch.Tensor], key: str = "image_queue", columns: int = 10**10) -> None:
    """Replace ``state[key]`` ([rows, Q]) with a stride-0 view of one float: [rows, ``columns``],
    ``rows * columns * 4`` bytes once copied (640 GB for 16 x 10**10), 4 bytes in a ``torch.save`` file."""
    state[key] = torch.zeros(1).expand(state[key].shape[0], columns)
