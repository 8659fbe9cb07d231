"""SRCL helper diagnostics on a shapes world: does the helper find the true false negatives, and
what weights do they get at a given sharpness delta?

:func:`run_helper_diagnostics` draws training batches of an annotation file as the loader and the
ITC queue would hold them, marks every negative that is a *true* false negative by the world's
ground truth (the caption is true of the image: :class:`~vlp.lab.oracle.WorldTruth`), and
measures the helper's separation of false from true negatives (ROC-AUC of its similarity) and the
helper-only (``alpha_h = 1``) SRCL weights of both groups at delta by the paper's 20% rule, at
delta by a target false-negative weight, and at a given delta. Works for a learned helper cache
and for an oracle cache (:func:`vlp.lab.oracle.run_cache_oracle_features`). The share of false
negatives alone, without a helper, is :mod:`vlp.lab.false_negatives`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from vlp.data.formats import Sample, load_pairs
from vlp.errors import CalibrationError
from vlp.eval.separation import roc_auc
from vlp.features.helper_cache import HelperCache, cache_rows
from vlp.lab.false_negatives import training_batches
from vlp.lab.oracle import WorldTruth
from vlp.losses.srcl import calibrate_delta, calibrate_delta_for_weight, srcl_weights, weight_distribution
from vlp.pictures import RunStep
from vlp.tasks.regulation import helper_similarities

REPORT = "helper_diagnostics.json"
GROUPS = ("true false negatives", "true negatives")


@dataclass
class DiagnosticRows:
    """Both ITC directions of every sampled batch, pooled as rows: ``[R, B + Q]`` each, R = 2 x
    batches x B (i2t rows, then t2i rows, per batch). Columns: the batch, then the queue."""

    helper: torch.Tensor  # the helper's similarity (cosine, or an oracle's relevance)
    positives: torch.Tensor  # bool: the anchor's own pair (ALBEF pretraining's itc_positives=pair)
    false_negatives: torch.Tensor  # bool: negatives whose caption is true of the image (ground truth)
    in_batch: torch.Tensor  # bool: the batch's columns

    @property
    def negatives(self) -> torch.Tensor:
        return ~self.positives


def diagnostic_rows(
    cache: HelperCache,
    truth: WorldTruth,
    samples: Sequence[Sample],
    batch_size: int,
    queue_size: int,
    batches: int,
    seed: int,
) -> DiagnosticRows:
    """The helper similarities and ground truth of sampled training batches of ``samples``
    (:func:`training_batches`), both directions: i2t rows (batch image vs [batch | queue]
    captions) and t2i rows (batch caption vs [batch | queue] images)."""
    if len(samples) < batch_size:
        raise ValueError(f"{len(samples)} training items, fewer than one batch of {batch_size}")
    paths, keys, texts = cache_rows(samples)
    relevant = torch.from_numpy(truth.relevance(texts, [paths[k] for k in keys])) == 1.0  # [T, I]
    key_col, text_row = {k: i for i, k in enumerate(keys)}, {t: i for i, t in enumerate(texts)}
    feat_img = cache.image[torch.tensor([cache.image_index[k] for k in keys])].float()  # [I, E]
    feat_txt = cache.text[torch.tensor([cache.text_index[t] for t in texts])].float()  # [T, E]
    item_img = np.array([key_col[s.image_key] for s in samples])
    item_caps = [[text_row[c] for c in s.captions] for s in samples]
    b = batch_size
    pos = torch.zeros(b, b + queue_size, dtype=torch.bool)
    pos[:, :b] = torch.eye(b, dtype=torch.bool)
    h_rows, fn_rows = [], []
    for items, caps, q_items, q_caps in training_batches(item_caps, b, queue_size, batches, seed):
        img, cap = torch.from_numpy(item_img[items]), torch.from_numpy(caps)
        q_img, q_cap = torch.from_numpy(item_img[q_items]).long(), torch.from_numpy(q_caps).long()
        h_i2t, h_t2i = helper_similarities(
            feat_img[img], feat_txt[cap], feat_img[q_img], feat_txt[q_cap], cache.relevance
        )
        bank_cap, bank_img = torch.cat([cap, q_cap]), torch.cat([img, q_img])
        h_rows += [h_i2t, h_t2i]
        fn_rows += [relevant[bank_cap[None, :], img[:, None]] & ~pos, relevant[cap[:, None], bank_img[None, :]] & ~pos]
    n = len(h_rows)
    in_batch = torch.zeros(n * b, b + queue_size, dtype=torch.bool)
    in_batch[:, :b] = True
    return DiagnosticRows(torch.cat(h_rows), pos.repeat(n, 1), torch.cat(fn_rows), in_batch)


def _share(part: torch.Tensor, whole: torch.Tensor) -> float:
    return float(part.sum()) / max(1, int(whole.sum()))


def _auc(scores: torch.Tensor, labels: torch.Tensor) -> Optional[float]:
    """ROC-AUC, None when one group is empty."""
    try:
        return roc_auc(scores, labels)
    except ValueError:
        return None


def finite(obj: Any) -> Any:
    """NaN/inf floats -> None, recursively (strict JSON)."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def weights_at(rows: DiagnosticRows, s: torch.Tensor, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Helper-only softmax-mode SRCL weights at ``delta``: (true false negatives', true negatives')."""
    w = srcl_weights(s, rows.positives, "softmax", delta)
    return w[rows.false_negatives], w[rows.negatives & ~rows.false_negatives]


def run_helper_diagnostics(
    cache: str | Path,
    world_root: str | Path,
    data_file: str | Path | Sequence[str | Path],
    out: str | Path,
    batch_size: int = 64,
    queue_size: int = 0,
    batches: int = 20,
    target_weight: float = 0.12,
    delta: Optional[float] = None,
    seed: int = 0,
    tau_w: float = 1.0,
) -> dict[str, Any]:
    """Diagnose an SRCL helper cache on training batches of ``data_file`` (an annotation file over
    images of the shapes world at ``world_root``); writes ``out/helper_diagnostics.json`` and a
    weight histogram ``out/weights_<name>.png`` per delta, and returns the report.

    Negatives are every (image, caption) pair of a row but the anchor pair, in the batch and in a
    queue of the ``queue_size`` samples before it, both ITC directions pooled. The report holds:
    ``false_negative_share`` (``in_batch``, ``with_queue``), ``helper_auc`` (``in_batch``,
    ``with_queue``: ROC-AUC of the helper similarity at telling true false negatives from true
    negatives; 1.0 for the exact oracle, 0.5 for chance), ``delta`` (``rule_20pct``: 20% of the
    negatives below 0.7, :func:`~vlp.losses.srcl.calibrate_delta`; ``target_weight``: the false
    negatives' median weight equals ``target_weight``,
    :func:`~vlp.losses.srcl.calibrate_delta_for_weight`, None with ``delta_error`` when the helper
    cannot reach it; ``given``: ``delta`` if passed) and ``weights``: per delta name, the delta and
    :func:`~vlp.losses.srcl.weight_distribution` of both groups and of all negatives (whose
    ``below_0_7`` shows whether the 20% rule was reachable: when fewer negatives than that can be
    told apart, its bisection ends at the bound delta = 1000). Weights are helper-only
    (``alpha_h = 1``): ``s = exp(helper / tau_w)``, ``softmax`` norm.
    """
    hc = HelperCache.load(cache)
    files = [data_file] if isinstance(data_file, (str, Path)) else list(data_file)
    samples = load_pairs([str(f) for f in files])
    hc.check_covers(samples)
    rows = diagnostic_rows(hc, WorldTruth.load(world_root), samples, batch_size, queue_size, batches, seed)
    neg, fn, in_batch = rows.negatives, rows.false_negatives, rows.in_batch
    s = torch.exp(rows.helper / tau_w)
    report: dict[str, Any] = {
        "cache": str(cache),
        "kind": hc.kind,
        "world": str(world_root),
        "data": ", ".join(str(f) for f in files),
        **dict(batch_size=batch_size, queue_size=queue_size, batches=batches, seed=seed, tau_w=tau_w),
        "target_weight": target_weight,
        "negatives": {"in_batch": int((neg & in_batch).sum()), "with_queue": int(neg.sum())},
        "false_negative_share": {"in_batch": _share(fn & in_batch, neg & in_batch), "with_queue": _share(fn, neg)},
        "helper_auc": {
            "in_batch": _auc(rows.helper[neg & in_batch], fn[neg & in_batch]),
            "with_queue": _auc(rows.helper[neg], fn[neg]),
        },
    }
    deltas: dict[str, Optional[float]] = {}
    try:  # an exact oracle with fewer than 20% false negatives never reaches the 20% rule
        deltas["rule_20pct"] = calibrate_delta(s, rows.positives)
    except CalibrationError as e:
        deltas["rule_20pct"], report["rule_20pct_error"] = None, str(e)
    try:
        deltas["target_weight"] = calibrate_delta_for_weight(s, rows.positives, fn, target_weight)
    except ValueError as e:
        deltas["target_weight"], report["delta_error"] = None, str(e)
    if delta is not None:
        deltas["given"] = delta
    report["delta"] = deltas
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report["weights"] = {
        name: _weights_report(rows, s, d, out, name, cache) for name, d in deltas.items() if d is not None
    }
    report = finite(report)
    (out / REPORT).write_text(json.dumps(report, indent=1))
    return report


def diagnostics_summary(r: dict[str, Any]) -> str:
    """The lines ``vlp analyze helper --world`` prints of a report of :func:`run_helper_diagnostics`."""
    share, auc = r["false_negative_share"], r["helper_auc"]
    lines = [
        f"{r['kind']} helper on {r['data']}: batch {r['batch_size']}, queue {r['queue_size']}",
        f"  true false negatives  {100 * share['in_batch']:.1f}% of in-batch negatives, "
        f"{100 * share['with_queue']:.1f}% with the queue",
        f"  helper ROC-AUC        {auc['in_batch']} in batch, {auc['with_queue']} with the queue",
    ]
    for name, w in r["weights"].items():
        fn, tn = w["false_negatives"], w["true_negatives"]
        lines.append(
            f"  delta {name:14s} {w['delta']:9.4g}: false negatives median {fn['median']:.3f} (mean {fn['mean']:.3f}), "
            f"true negatives median {tn['median']:.3f}; {100 * w['all_negatives']['below_0_7']:.1f}% of negatives below 0.7"
        )
    if "rule_20pct_error" in r:
        lines.append(f"  delta by the 20% rule: {r['rule_20pct_error']}")
    if "delta_error" in r:
        lines.append(f"  delta by target weight: {r['delta_error']}")
    return "\n".join(lines)


def _weights_report(
    rows: DiagnosticRows, s: torch.Tensor, delta: float, out: Path, name: str, cache: str | Path
) -> dict[str, Any]:
    """Both groups' weight distributions at ``delta`` and their histogram ``out/weights_<name>.png``
    (titled with the helper cache's name: no run, no step)."""
    from vlp.viz import plot_weight_histogram

    fn_w, tn_w = weights_at(rows, s, delta)
    plot = plot_weight_histogram(
        torch.cat([fn_w, tn_w]),
        out / f"weights_{name}.png",
        f"helper-only SRCL weights (alpha_h = 1), delta = {delta:.3g} ({name})",
        dict(zip(GROUPS, (fn_w, tn_w))),
        RunStep(Path(cache).name),
    )
    return {
        "delta": delta,
        "false_negatives": weight_distribution(fn_w),
        "true_negatives": weight_distribution(tn_w),
        "all_negatives": weight_distribution(torch.cat([fn_w, tn_w])),
        "plot": plot.name,
    }
