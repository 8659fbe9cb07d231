"""``vlp analyze cocos``: how many candidates contribute to each query's gradient under a contrastive
loss (the statistics of :mod:`vlp.losses.cocos`), over a checkpoint's training data."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch.utils.data import DataLoader

from vlp.checkpoint import image_size, open_checkpoint
from vlp.config import PretrainConfig, apply_overrides
from vlp.data.datasets import Collator, ImageTextDataset
from vlp.data.formats import load_pairs
from vlp.data.image_checks import check_images
from vlp.pictures import RunStep
from vlp.preprocess.transforms import test_transform


def _cocos_pass(
    model: Any, loader: DataLoader, n: int, stats_of: Callable[..., dict], bar: Any
) -> tuple[dict[str, list[float]], dict[str, list[torch.Tensor]]]:
    """COCOS statistics of the first ``n`` batches, both directions: every statistic per batch
    (``"i2t_<name>"`` -> values) and the per-query counts (``"i2t"``/``"t2i"`` -> [queries] per batch)."""
    device = next(model.parameters()).device
    per_batch: dict[str, list[float]] = {}
    counts: dict[str, list[torch.Tensor]] = {"i2t": [], "t2i": []}
    random.seed(0)  # the caption drawn per image
    for k, batch in enumerate(loader):
        if k == n:
            break
        batch = {key: v.to(device) for key, v in batch.items()}
        img = model.encode_image(batch["images"]).feat
        txt = model.encode_text(batch["input_ids"], batch["attention_mask"]).feat
        txt_ids = batch.get("text_image_ids", batch["image_ids"])
        pos = batch["image_ids"][:, None] == txt_ids[None, :]
        for direction, sim, p in (("i2t", img @ txt.T, pos), ("t2i", txt @ img.T, pos.T)):
            stats = stats_of(sim, p)
            counts[direction].append(stats.pop("counts").float().cpu())
            for key, v in stats.items():
                per_batch.setdefault(f"{direction}_{key}", []).append(float(v))
        bar.update(1)
    return per_batch, counts


@torch.no_grad()
def run_cocos(
    checkpoint: str | Path,
    data: Sequence[str],
    loss: str,
    out: str | Path,
    threshold: float = 0.01,
    batches: Optional[int] = None,
    overrides: Sequence[str] = (),
    show_progress: bool = True,
    smoothap_inv_tau: bool = False,
) -> dict:
    """COCOS (docs/methods.md): how many candidates contribute to the gradient of each query under
    ``loss``, over one pass of ``data`` (the training split) in eval mode with test transforms, at
    the run's batch size (``data.batch_size``, ``data.captions_per_image``; override them). Writes
    ``out/cocos.json`` (mean and std over batches of every statistic, per direction) and
    ``out/cocos.png`` (per-query count histograms). ``smoothap_inv_tau``: SmoothAP counts its true
    gradient magnitude G(1-G)/tau/R^2 instead of ECIR's G(1-G)/R^2 (:func:`vlp.losses.cocos.cocos_smoothap`).
    ``loss`` is any registered loss (:data:`vlp.losses.registry.LOSSES`), built from the run's ``loss.contrastive``
    with that name (its ``params``: the run's for the run's own loss, plus the overrides'); the record
    holds its ``hyperparameters``."""
    from vlp.losses.protocol import CocosInputs
    from vlp.losses.registry import build_loss
    from vlp.progress import progress

    ckpt = open_checkpoint(checkpoint)
    model, tokenizer = ckpt.load(), ckpt.tokenizer
    cfg = ckpt.pretrain_config
    if loss != cfg.loss.contrastive.name:  # the run's loss's own params are not the analysed loss's
        cfg = replace(cfg, loss=replace(cfg.loss, contrastive=replace(cfg.loss.contrastive, params={})))
    cfg = apply_overrides(cfg, overrides)
    c = cfg.loss.contrastive
    loss_fn = build_loss(replace(c, name=loss))
    tau = c.tau if c.tau is not None else float(getattr(model, "temp", 0.05))
    loader = _cocos_loader(cfg, data, tokenizer)
    n = len(loader) if batches is None else min(batches, len(loader))
    bar = progress(n, f"cocos {loss}", show_progress)

    def stats_of(sim: torch.Tensor, positives: torch.Tensor) -> dict:
        return loss_fn.cocos(CocosInputs(sim, positives, tau, threshold, smoothap_inv_tau))

    per_batch, counts = _cocos_pass(model, loader, n, stats_of, bar)
    bar.close()
    summary = {key: mean_std(v) for key, v in per_batch.items()}
    record = {
        "loss": loss,
        "checkpoint": str(ckpt.path),
        "data": [str(d) for d in data],
        "batches": n,
        "batch_size": cfg.data.batch_size,
        "captions_per_image": cfg.data.captions_per_image,
        "tau": tau,
        "smoothap_inv_tau": smoothap_inv_tau,
        "hyperparameters": loss_fn.hyperparameters(),
        "threshold": threshold,
        "stats": summary,
    }
    _write_cocos(Path(out), record, counts)
    return record


def _cocos_loader(cfg: PretrainConfig, data: Sequence[str], tokenizer: Any) -> DataLoader:
    """The loader of one COCOS pass over ``data`` (images checked first): test transforms, the run's
    batch size and captions per image, shuffled by a generator seeded 0, the last partial batch dropped
    unless it is the only one. Returns the DataLoader (batches as :class:`vlp.data.datasets.Collator` makes them)."""
    samples = load_pairs(list(data), cfg.data.image_root)
    check_images(samples)
    dataset = ImageTextDataset(
        samples, test_transform(image_size(cfg), cfg.data.image), captions_per_image=cfg.data.captions_per_image
    )
    return DataLoader(
        dataset,
        batch_size=cfg.data.batch_size,
        shuffle=True,
        drop_last=len(dataset) >= cfg.data.batch_size,
        collate_fn=Collator(tokenizer, cfg.model.text.max_len, cfg.data.text_padding),
        generator=torch.Generator().manual_seed(0),
    )


def _write_cocos(out: Path, record: dict[str, Any], counts: dict[str, list[torch.Tensor]]) -> None:
    """Writes ``out/cocos.json`` (``record``) and ``out/cocos.png`` (the per-query count histograms of
    ``counts``, direction -> [queries] per batch); returns None."""
    from vlp.viz import plot_cocos

    out.mkdir(parents=True, exist_ok=True)
    (out / "cocos.json").write_text(json.dumps(record, indent=2))
    plot_cocos(
        {d: torch.cat(v) for d, v in counts.items()},
        out / "cocos.png",
        f"COCOS {record['loss']}: contributing candidates per query "
        f"({record['batches']} batches of {record['batch_size']}, eval mode)",
        RunStep.of_checkpoint(record["checkpoint"]),
    )


def mean_std(values: list[float]) -> dict[str, Optional[float]]:
    """Mean and standard deviation over the measured values (NaN: a batch where the statistic is
    undefined, left out of both); ``None`` where there are too few (JSON has no NaN): no value
    gives no mean, fewer than two give a std of 0."""
    t = torch.tensor(values, dtype=torch.float64)
    t = t[~t.isnan()]
    return {"mean": float(t.mean()) if t.numel() else None, "std": float(t.std()) if t.numel() > 1 else 0.0}


def format_cocos(record: dict[str, Any]) -> str:
    """The table ``vlp analyze cocos`` prints of a record of :func:`run_cocos`: each statistic's mean
    and standard deviation (``n/a`` where no batch measured it)."""
    return "\n".join(
        f"  {k:24s} " + (f"{v['mean']:10.3f} +- {v['std']:.3f}" if v["mean"] is not None else f"{'n/a':>10s}")
        for k, v in record["stats"].items()
    )
