"""Write a tiny open_clip model, its model config and its random weights, so that the local-file
variant of the SRCL quick start (docs/methods.md) runs offline:

    python scripts/make_tiny_open_clip.py --out helper
    # -> helper/tiny_open_clip.json (open_clip model config), helper/tiny_open_clip.safetensors (weights)
    vlp cache-helper-features --helper open_clip:helper/tiny_open_clip.json/helper/tiny_open_clip.safetensors ...

The weights are random, so the helper is useless (its same-image AUC is near 0.5): it is for
trying the commands and for tests. A real helper's file is given the same way, after its
architecture name: ``open_clip:ViT-B-32/PATH/open_clip_model.safetensors``.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import open_clip
import torch

from vlp.weights import save_tensors

#: the model config: a 2-block ViT at 32 px (patch 8) and a 2-layer text transformer, width 64,
#: 32-d joint space; open_clip's tokenizer, so its full vocabulary (3.4M parameters in all)
TINY_OPEN_CLIP = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}
NAME = "tiny_open_clip"


def write_tiny_open_clip(out: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """Write ``out/tiny_open_clip.json`` (:data:`TINY_OPEN_CLIP`) and ``out/tiny_open_clip.safetensors``
    (the ``state_dict`` of that model as open_clip builds it at random, seeded with ``seed``);
    returns both paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config, weights = out / f"{NAME}.json", out / f"{NAME}.safetensors"
    config.write_text(json.dumps(TINY_OPEN_CLIP, indent=1) + "\n")
    open_clip.add_model_config(config)
    torch.manual_seed(seed)
    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # open_clip warns that it initialised the model randomly
    try:
        model = open_clip.create_model(NAME)
    finally:
        logging.getLogger().setLevel(level)
    save_tensors({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
    return config, weights


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=".", help="folder to write into")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    a = p.parse_args()
    config, weights = write_tiny_open_clip(a.out, a.seed)
    print(f"wrote {config} and {weights}")


if __name__ == "__main__":
    main()
