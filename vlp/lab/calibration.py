"""``vlp analyze helper`` on real data: calibrate SRCL's delta without ground truth.

Real data has no oracle, but it has known false negatives: the other captions of an image (COCO,
Flickr30K and VG give an image several). :func:`run_helper_calibration` draws training batches of
the annotation files as the loader and the ITC queue would hold them (``batch_size`` per rank,
``queue_size`` queued samples), computes the helper-only (``alpha_h = 1``) SRCL weights of every
negative of both ITC directions, and weighs each anchor's *same-image* negatives as probes: each
other caption of the anchor's image (image->text rows), and the anchor's own image (text->image
rows, where a queued sample of the same image is exactly that image), each as one more negative of
its row (:func:`vlp.losses.srcl.probe_weights`). It reports both groups' weight distributions and
the delta that puts the same-image median at a target (the paper's example: 0.12) beside the delta
of the paper's "20% of the negatives below 0.7" rule. One-caption sources (CC3M, SBU) have no
probes: only the overall distribution and the 20% rule are reported.

The report has the structure of the world's ground-truth report (:mod:`vlp.lab.diagnostics`):
``delta.target_weight``, ``delta.rule_20pct``, ``weights.<name>``, and ``override``: the line to
paste (``loss.srcl.delta=...``), also written to ``override.txt``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from vlp.data.formats import Sample, load_pairs
from vlp.features.helper_cache import HelperCache, cache_rows
from vlp.lab.diagnostics import REPORT, finite
from vlp.lab.false_negatives import training_batches
from vlp.losses.srcl import (
    calibrate_delta,
    calibrate_delta_for_probes,
    probe_weights,
    srcl_weights,
    weight_distribution,
)
from vlp.tasks.regulation import helper_similarities

#: the paper's example weight of a false negative (App. F: ~0.12, "not more than 0.2")
TARGET_WEIGHT = 0.12
#: the overrides to pass to the run, one line (``vlp pretrain ... $(cat DIR/override.txt)``)
OVERRIDE = "override.txt"
#: at most this many weights go into a histogram (a random subset beyond it)
PLOT_VALUES = 2_000_000


@dataclass
class CalibrationRows:
    """Both ITC directions of every sampled batch as rows: ``[R, B + Q]`` each, R = 2 x batches x
    B (i2t rows, then t2i rows, per batch); columns: the batch, then the queue."""

    helper: torch.Tensor  # the helper's similarity (cosine, or an oracle's relevance)
    positives: torch.Tensor  # bool: the anchor's own pair
    same_image: torch.Tensor  # bool: negatives from the anchor's image (in the batch or queue)
    probes: torch.Tensor  # [R, P] the helper similarity of the row's same-image probes; NaN: empty slot

    @property
    def negatives(self) -> torch.Tensor:
        return ~self.positives


def _pair_similarity(cache: HelperCache, text_rows: torch.Tensor, image_rows: torch.Tensor) -> torch.Tensor:
    """The helper similarity of aligned (caption, image) cache rows, [N] each -> [N] (fp32)."""
    if cache.relevance is not None:
        return cache.relevance[text_rows, image_rows].float()
    t = torch.nn.functional.normalize(cache.text[text_rows].float(), dim=-1)
    i = torch.nn.functional.normalize(cache.image[image_rows].float(), dim=-1)
    return (t * i).sum(-1)


def calibration_rows(
    cache: HelperCache, samples: Sequence[Sample], batch_size: int, queue_size: int, batches: int, seed: int
) -> CalibrationRows:
    """The helper similarities of sampled training batches of ``samples`` (one random caption per
    item, ``queue_size`` earlier samples queued: :func:`vlp.lab.false_negatives.training_batches`) and
    their same-image probes."""
    if len(samples) < batch_size:
        raise ValueError(f"{len(samples)} training items, fewer than one batch of {batch_size}")
    _, keys, texts = cache_rows(samples)
    key_row = {k: cache.image_index[k] for k in keys}
    text_row = {t: cache.text_index[t] for t in texts}
    img_of_item = np.array([key_row[s.image_key] for s in samples])
    caps_of_item = [[text_row[c] for c in s.captions] for s in samples]
    caps_of_image: dict[int, set[int]] = {}
    for i, item_caps in zip(img_of_item, caps_of_item):
        caps_of_image.setdefault(int(i), set()).update(item_caps)
    feat_img, feat_txt, rel = cache.image.float(), cache.text.float(), cache.relevance
    b = batch_size
    pos = torch.zeros(b, b + queue_size, dtype=torch.bool)
    pos[:, :b] = torch.eye(b, dtype=torch.bool)
    h_rows, same_rows, probe_rows = [], [], []
    for items, caps, q_items, q_caps in training_batches(caps_of_item, b, queue_size, batches, seed):
        img = torch.from_numpy(img_of_item[items]).long()
        cap = torch.from_numpy(caps).long()
        q_img, q_cap = torch.from_numpy(img_of_item[q_items]).long(), torch.from_numpy(q_caps).long()
        h_i2t, h_t2i = helper_similarities(feat_img[img], feat_txt[cap], feat_img[q_img], feat_txt[q_cap], rel)
        same = (img[:, None] == torch.cat([img, q_img])[None, :]) & ~pos
        # i2t probes: the image's other captions; t2i probe: the caption's own image (if it has another caption)
        others = [sorted(caps_of_image[int(i)] - {int(c)}) for i, c in zip(img, cap)]
        width = max(1, max(len(o) for o in others))
        rows = torch.tensor([r for r, o in enumerate(others) for _ in o], dtype=torch.long)
        slots = torch.tensor([k for o in others for k in range(len(o))], dtype=torch.long)
        i2t = torch.full((b, width), float("nan"))
        t2i = torch.full((b, width), float("nan"))
        if len(rows):  # one lookup for every probe of the batch
            i2t[rows, slots] = _pair_similarity(cache, torch.tensor([t for o in others for t in o]), img[rows])
            has = torch.tensor([bool(o) for o in others])
            t2i[has, 0] = _pair_similarity(cache, cap[has], img[has])
        h_rows += [h_i2t, h_t2i]
        same_rows += [same, same]
        probe_rows += [i2t, t2i]
    width = max(p.shape[1] for p in probe_rows)
    probes = torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=float("nan")) for p in probe_rows])
    n = len(h_rows)
    return CalibrationRows(torch.cat(h_rows), pos.repeat(n, 1), torch.cat(same_rows), probes)


def _subset(v: torch.Tensor, n: int = PLOT_VALUES) -> torch.Tensor:
    if v.numel() <= n:
        return v
    return v[torch.randperm(v.numel(), generator=torch.Generator().manual_seed(0))[:n]]


def _weights_report(
    rows: CalibrationRows, s: torch.Tensor, s_probe: torch.Tensor, mode: str, delta: float, out: Path, name: str
) -> dict[str, Any]:
    """Both groups' weight distributions at ``delta`` in ``mode`` and their histogram
    ``out/weights_<name>.png``: ``false_negatives`` (the same-image probes, similarities
    ``s_probe``), ``other_negatives`` (the rows' negatives that are not of the anchor's image: true
    negatives and unknown false ones) and ``all_negatives`` (every negative of the rows)."""
    from vlp.viz import plot_weight_histogram

    w = srcl_weights(s, rows.positives, mode, delta)
    fn = probe_weights(s, rows.positives, s_probe, mode, delta)
    fn = fn[~torch.isnan(fn)]
    all_neg = w[rows.negatives]
    other = w[rows.negatives & ~rows.same_image]
    plot = plot_weight_histogram(
        _subset(all_neg),
        out / f"weights_{name}.png",
        f"helper-only SRCL weights (alpha_h = 1), {mode} norm"
        + (f", delta = {delta:.3g} ({name})" if mode == "softmax" else " (delta cancels)"),
        {"same-image captions (known false negatives)": fn, "other negatives": _subset(other)},
    )
    return {
        "delta": delta if mode == "softmax" else None,
        "false_negatives": weight_distribution(fn),
        "other_negatives": weight_distribution(other),
        "all_negatives": weight_distribution(all_neg),
        "plot": plot.name,
    }


def calibration_summary(r: dict[str, Any]) -> str:
    """The lines ``vlp analyze helper`` prints of a report of :func:`run_helper_calibration`."""
    same = r["same_image"]
    lines = [
        f"{r['kind']} helper on {', '.join(r['data'])}: batch {r['batch_size']}, queue {r['queue_size']}, "
        f"{r['mode']} norm",
        f"  known false negatives: {same['probes']} same-image captions probed; {same['in_rows']} in the rows "
        f"({100 * same['in_rows_share']:.3f}% of {r['negatives']['with_queue']} negatives)",
    ]
    for name, w in r["weights"].items():
        fn, other, every = w["false_negatives"], w["other_negatives"], w["all_negatives"]
        head = f"delta {name:14s} {w['delta']:9.4g}" if w["delta"] is not None else f"{name} norm (no delta)"
        lines.append(
            f"  {head}: same-image median {fn['median']:.3f} (p90 {fn['p90']:.3f}), other negatives median "
            f"{other['median']:.3f}; {100 * every['below_0_7']:.1f}% of negatives below 0.7, "
            f"{100 * every['below_0_2']:.1f}% below 0.2"
        )
    if "delta_error" in r:
        lines.append(f"  {r['delta_error']}")
    if "mean_mode_floor" in r:
        lines.append(
            "  mean norm: the lowest weight a negative could get (at cosine 1): median "
            f"{r['mean_mode_floor']['median']:.3f}"
        )
    if r["override"]:
        lines.append(f"  paste: {r['override']}")
    return "\n".join(lines)


def run_helper_calibration(
    cache: str | Path,
    data: Sequence[str | Path],
    out: str | Path,
    batch_size: int = 64,
    queue_size: int = 0,
    batches: int = 20,
    target_weight: float = TARGET_WEIGHT,
    delta: Optional[float] = None,
    mode: str = "softmax",
    seed: int = 0,
    tau_w: float = 1.0,
    image_root: Optional[str] = None,
) -> dict[str, Any]:
    """Calibrate SRCL's delta for a helper cache on training batches of the annotation files
    ``data`` (no ground truth); writes ``out/helper_diagnostics.json`` and ``out/weights_<name>.png``
    per delta, and returns the report (module docstring). ``mode``: the weight norm; ``mean``
    has no delta (it cancels), so only its distributions and its floor are reported."""
    if mode not in ("softmax", "mean"):
        raise ValueError(f"mode must be 'softmax' or 'mean', got {mode!r}")
    hc = HelperCache.load(cache)
    samples = load_pairs([str(d) for d in data], image_root)
    hc.check_covers(samples)
    rows = calibration_rows(hc, samples, batch_size, queue_size, batches, seed)
    neg = rows.negatives
    s = torch.exp(rows.helper / tau_w)
    s_probe = torch.exp(rows.probes / tau_w)  # NaN slots stay NaN
    n_probes = int((~torch.isnan(rows.probes)).sum())
    report: dict[str, Any] = {
        "cache": str(cache),
        "kind": hc.kind,
        "world": None,
        "data": [str(d) for d in data],
        **dict(batch_size=batch_size, queue_size=queue_size, batches=batches, seed=seed, tau_w=tau_w, mode=mode),
        "target_weight": target_weight,
        "false_negatives": "the other captions of each anchor's image (and, text->image, the image itself), "
        "each weighted as one more negative of its row",
        "negatives": {"in_batch": int((neg[:, :batch_size]).sum()), "with_queue": int(neg.sum())},
        "same_image": {
            "probes": n_probes,
            "in_rows": int(rows.same_image.sum()),
            "in_rows_share": float(rows.same_image.sum()) / max(1, int(neg.sum())),
        },
    }
    deltas: dict[str, Optional[float]] = {"rule_20pct": None, "target_weight": None}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if mode == "softmax":
        deltas["rule_20pct"] = calibrate_delta(s, rows.positives)
        try:
            deltas["target_weight"] = calibrate_delta_for_probes(s, rows.positives, s_probe, target_weight)
        except ValueError as e:
            report["delta_error"] = str(e)
        if delta is not None:
            deltas["given"] = delta
    else:
        u = torch.reciprocal(s).masked_fill(rows.positives, float("nan"))
        floor = torch.exp(torch.tensor(-1.0 / tau_w)) / u.nanmean(1)
        report["delta_error"] = "mean mode: delta cancels (w = u / mean(u)); nothing to calibrate"
        report["mean_mode_floor"] = weight_distribution(floor)
    report["delta"] = deltas
    names = {k: v for k, v in deltas.items() if v is not None} if mode == "softmax" else {"mean": 1.0}
    report["weights"] = {name: _weights_report(rows, s, s_probe, mode, d, out, name) for name, d in names.items()}
    chosen = deltas["target_weight"] if deltas["target_weight"] is not None else deltas["rule_20pct"]
    report["override"] = f"loss.srcl.norm=softmax loss.srcl.delta={chosen:.4g}" if chosen is not None else None
    report = finite(report)
    (out / REPORT).write_text(json.dumps(report, indent=1))
    if report["override"]:  # for `vlp pretrain ... $(cat DIR/override.txt)`
        (out / OVERRIDE).write_text(report["override"] + "\n")
    else:
        (out / OVERRIDE).unlink(missing_ok=True)
    return report
