"""How often ALBEF's ITM negatives are true matches on a shapes world (docs/experiments.md, the demo).

    python scripts/experiments/itm_negatives.py --checkpoint demo_out/run --world demo_out/world

Draws ``--batches`` training batches of ``--batch-size`` (image, one of its captions) pairs from the
world's ``pretrain.json``, encodes them with the checkpoint's ITC towers, samples one ITM negative per
text and per image as training does (``sample_hard_negatives``: hardness 1 = ALBEF's
softmax(ITC logit), 0 = uniform), and prints the share of negatives the world's ground truth says the
caption is true of.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
import torch

from vlp.api import VLPModel
from vlp.lab.oracle import WorldTruth
from vlp.losses.matching import sample_hard_negatives


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="run directory or checkpoint")
    p.add_argument("--world", required=True, help="shapes world directory")
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--temp", type=float, default=None, help="ITC temperature (default: the checkpoint's)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    world = Path(a.world)
    model = VLPModel.from_pretrained(a.checkpoint)
    temp = a.temp if a.temp is not None else float(model.model.temp.detach())
    truth = WorldTruth.load(world)
    items = json.loads((world / "pretrain.json").read_text())
    rng, gen = random.Random(a.seed), torch.Generator().manual_seed(a.seed)
    shares: dict[str, list[float]] = {}
    for _ in range(a.batches):
        batch = rng.sample(items, a.batch_size)
        caps = [rng.choice(e["caption"]) if isinstance(e["caption"], list) else e["caption"] for e in batch]
        true_of = torch.from_numpy(truth.relevance(caps, [e["image"] for e in batch]) > 0.5)  # [T, I]
        with torch.no_grad():
            sim_t2i = model.encode_text(caps) @ model.encode_image([str(world / e["image"]) for e in batch]).T / temp
        ids = torch.arange(a.batch_size)
        for hardness, name in ((1.0, "hard"), (0.0, "uniform")):
            neg_img, _ = sample_hard_negatives(sim_t2i, ids, gen, hardness)  # an image per text
            neg_txt, _ = sample_hard_negatives(sim_t2i.T.contiguous(), ids, gen, hardness)  # a text per image
            shares.setdefault(f"{name} image negatives", []).append(true_of[ids, neg_img].float().mean().item())
            shares.setdefault(f"{name} text negatives", []).append(true_of[neg_txt, ids].float().mean().item())
    print(f"ITM negatives that are true matches ({a.batches} batches of {a.batch_size}, ITC temperature {temp:.4f}):")
    for k, v in shares.items():
        print(f"  {k:24s} {100 * np.mean(v):5.1f}% (± {100 * np.std(v):.1f} over batches)")
    return 0


if __name__ == "__main__":
    from vlp.console import show_logs

    show_logs()  # vlp's log records printed as `vlp` prints them
    raise SystemExit(main())
