"""``vlp plot srcl-weights``: the SRCL weights of a checkpoint's regulator on its training data (a
labelled heatmap of one batch, a histogram over many)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch.utils.data import DataLoader

from vlp.checkpoint import image_size, open_checkpoint
from vlp.config import apply_overrides
from vlp.data.datasets import Collator, ImageTextDataset
from vlp.data.formats import load_pairs
from vlp.pictures import RunStep
from vlp.preprocess.transforms import test_transform
from vlp.runs.training.assembly import build_regulator


def _srcl_weights(model: Any, regulator: Any, batch: dict, device: torch.device, step: int, a: float) -> tuple:
    """The regulator's weights of one batch (in-batch negatives) and the positives mask [B, B]."""
    batch = {k: v.to(device) for k, v in batch.items()}
    img = model.encode_image(batch["images"]).feat
    txt = model.encode_text(batch["input_ids"], batch["attention_mask"]).feat
    img_m = model.encode_image(batch["images"], momentum=True).feat
    txt_m = model.encode_text(batch["input_ids"], batch["attention_mask"], momentum=True).feat
    ids = batch["image_ids"]
    pos = torch.eye(len(ids), dtype=torch.bool, device=device)
    same = ids[:, None] == ids[None, :]
    helper = regulator.helper_features(batch, 0) if a > 0 else None
    return regulator.regulate(img @ txt_m.T, txt @ img_m.T, pos, same, helper, step, alpha_h=a), pos


@torch.no_grad()
def run_srcl_weight_plots(
    run: str | Path,
    out: Optional[str | Path] = None,
    heatmap_size: int = 10,
    batches: int = 50,
    alpha_h: Optional[float] = None,
    overrides: Sequence[str] = (),
    show_progress: bool = True,
) -> dict[str, Path]:
    """SRCL weights of a checkpoint on its training data (eval transform, in-batch negatives):
    ``srcl_weights_heatmap.png`` (one batch of ``heatmap_size``, images and captions labelled) and
    ``srcl_weights_hist.png`` (negatives over ``batches`` training batches). ``alpha_h`` defaults
    to the schedule's value at the checkpoint's step. A run without regulation is shown with its
    ``loss.srcl`` settings (what SRCL would do), which then need helper features."""
    from vlp.progress import progress
    from vlp.viz import plot_weight_heatmap, plot_weight_histogram

    ckpt = open_checkpoint(run)
    model, tokenizer = ckpt.load(), ckpt.tokenizer
    cfg = apply_overrides(ckpt.pretrain_config, overrides)
    if cfg.loss.regulation == "none":
        cfg.loss.regulation = "srcl"
    regulator, cache = build_regulator(cfg)
    device = next(model.parameters()).device
    regulator.to(device)
    step = ckpt.step or 0
    a = regulator.alpha_h(step) if alpha_h is None else alpha_h
    samples = load_pairs(cfg.data.train, cfg.data.image_root)
    dataset = ImageTextDataset(samples, test_transform(image_size(cfg), cfg.data.image), cache)
    collate = Collator(tokenizer, cfg.model.text.max_len, cfg.data.text_padding)

    def weights(batch: dict) -> tuple:
        return _srcl_weights(model, regulator, batch, device, step, a)

    out = Path(out) if out is not None else Path(run) / "srcl_plots"
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    first = torch.randperm(len(dataset), generator=gen)[:heatmap_size].tolist()
    items = [dataset[i] for i in first]
    r, _ = weights(collate(items))
    caps = [it["caption"] for it in items]
    title = (
        f"SRCL weights (i2t rows), {cfg.loss.srcl.norm} norm, delta={cfg.loss.srcl.delta:g}, alpha_h={a:.2f}, "
        f"step {step}, batch of {len(first)}"
    )
    shows = RunStep.of_checkpoint(ckpt.path)
    images = [dataset.samples[i].image for i in first]
    heat = plot_weight_heatmap(r.w_i2t.cpu(), images, caps, out / "srcl_weights_heatmap.png", title, shows)
    loader = DataLoader(
        dataset,
        batch_size=cfg.data.batch_size,
        shuffle=True,
        drop_last=True,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(1),
    )
    vals = []
    bar = progress(min(batches, len(loader)), "srcl weights", show_progress)
    for k, batch in enumerate(loader):
        if k == batches:
            break
        r, pos = weights(batch)
        vals += [r.w_i2t[~pos].cpu(), r.w_t2i[~pos].cpu()]
        bar.update(1)
    bar.close()
    hist = plot_weight_histogram(
        torch.cat(vals),
        out / "srcl_weights_hist.png",
        f"negatives' weights over {len(vals) // 2} batches of {cfg.data.batch_size}, alpha_h={a:.2f}, step {step}",
        shows=shows,
    )
    return {"heatmap": heat, "histogram": hist}
