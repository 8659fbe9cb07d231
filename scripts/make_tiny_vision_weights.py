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

from vlp.models.clip_weights import synthetic_clip_state


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
