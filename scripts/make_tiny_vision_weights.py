"""Write tiny image-tower weight files in the CLIP (OpenAI layout), Hugging Face CLIP and
distilled-DeiT formats, so that the DeiT / CLIP initialisation commands of docs/training.md run
offline:

    python scripts/make_tiny_vision_weights.py --out .
    # -> tiny_clip.pt, tiny_hf_clip/ (CLIPModel.save_pretrained), tiny_deit_distilled.pth

Both match the tiny preset's width (192) and patch size (8) at 32 px with 2 blocks; the
pretraining run resizes the position embedding to its own image size.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import timm
import torch


def synthetic_clip_state(
    width: int, depth: int, patch: int, grid: int, embed: int = 16, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A random OpenAI/open_clip ``model.state_dict()`` (image tower + a few text-tower keys) at any
    size: what this script writes and the tests load, since no real CLIP weights can be downloaded
    offline."""
    W, DEPTH, PATCH, EMBED = width, depth, patch, embed
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.2

    sd = {
        "visual.conv1.weight": r(W, 3, PATCH, PATCH),
        "visual.class_embedding": r(W),
        "visual.positional_embedding": r(1 + grid * grid, W),
        "visual.ln_pre.weight": 1 + r(W),
        "visual.ln_pre.bias": r(W),
    }
    for i in range(DEPTH):
        b = f"visual.transformer.resblocks.{i}."
        sd.update(
            {
                b + "ln_1.weight": 1 + r(W),
                b + "ln_1.bias": r(W),
                b + "attn.in_proj_weight": r(3 * W, W),
                b + "attn.in_proj_bias": r(3 * W),
                b + "attn.out_proj.weight": r(W, W),
                b + "attn.out_proj.bias": r(W),
                b + "ln_2.weight": 1 + r(W),
                b + "ln_2.bias": r(W),
                b + "mlp.c_fc.weight": r(4 * W, W),
                b + "mlp.c_fc.bias": r(4 * W),
                b + "mlp.c_proj.weight": r(W, 4 * W),
                b + "mlp.c_proj.bias": r(W),
            }
        )
    sd.update({"visual.ln_post.weight": 1 + r(W), "visual.ln_post.bias": r(W), "visual.proj": r(W, EMBED)})
    # text tower, temperature and OpenAI's hyper-parameter tensors: dropped on purpose
    sd.update(
        {
            "token_embedding.weight": r(50, EMBED),
            "positional_embedding": r(8, EMBED),
            "transformer.resblocks.0.ln_1.weight": r(EMBED),
            "transformer.resblocks.0.attn.in_proj_weight": r(3 * EMBED, EMBED),
            "ln_final.weight": r(EMBED),
            "ln_final.bias": r(EMBED),
            "text_projection": r(EMBED, EMBED),
            "logit_scale": torch.tensor(4.6),
            "input_resolution": torch.tensor(32),
            "context_length": torch.tensor(8),
            "vocab_size": torch.tensor(50),
        }
    )
    return sd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=".", help="folder to write into")
    out = Path(p.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(synthetic_clip_state(width=192, depth=2, patch=8, grid=4), out / "tiny_clip.pt")
    torch.manual_seed(0)
    deit = timm.create_model("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10)
    torch.save({"model": deit.state_dict()}, out / "tiny_deit_distilled.pth")
    from transformers import CLIPConfig, CLIPModel

    vision = dict(
        hidden_size=192, intermediate_size=768, num_hidden_layers=2, num_attention_heads=3, image_size=32, patch_size=8
    )
    text = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        vocab_size=64,
        max_position_embeddings=16,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).save_pretrained(
        out / "tiny_hf_clip"
    )
    print(f"wrote {out / 'tiny_clip.pt'}, {out / 'tiny_hf_clip'} and {out / 'tiny_deit_distilled.pth'}")


if __name__ == "__main__":
    main()
