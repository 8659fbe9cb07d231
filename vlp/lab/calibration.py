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

A calibration that cannot be trusted is refused (:class:`~vlp.errors.CalibrationError`, no
``override.txt``) instead of answered:

- **helper quality**: ``quality.same_image_auc`` is the ROC-AUC of the same-image probes against
  the other negatives of their rows (no ground truth needed); below ``min_same_image_auc``
  (:data:`MIN_SAME_IMAGE_AUC`, its source in :data:`MIN_AUC_SOURCE`: the weakest noised oracle SRCL
  was shown to help with) it is refused unless ``force`` (recorded as ``forced``); above it the report
  says that passing is not sufficient (``quality_caveat``). ``at_delta`` says what the chosen
  delta does: the effective number of negatives per row ``N_eff = (sum w)^2 / sum w^2``, the
  weight share of a row's 10 heaviest negatives and the shares below 0.2 and 0.7.
- **one-caption data** (CC3M, SBU, LAION): a mixture is calibrated on the probes of its
  multi-caption sources (``probe_sources``); data with none needs ``reference`` (a multi-caption
  file the cache also covers, e.g. COCO's Karpathy train captions: its batches stand in for the
  training data's) or the 20% rule by name (``rule="20pct"``).
- **a search that hits its bound** is an error naming the bound, never ``delta=1000``.
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
from vlp.data.sample_table import SampleTable
from vlp.errors import CalibrationError
from vlp.features.helper_cache import HelperCache, cache_rows
from vlp.lab.diagnostics import REPORT, finite
from vlp.lab.false_negatives import training_batches
from vlp.lab.helper_student import against_student, gate, pairwise_auc
from vlp.losses.srcl import (
    calibrate_delta,
    calibrate_delta_for_probes,
    n_eff_rows,
    probe_weights,
    srcl_weights,
    weight_distribution,
)
from vlp.pictures import RunStep
from vlp.tasks.regulation import helper_similarities

#: the paper's example weight of a false negative (App. F: ~0.12, "not more than 0.2")
TARGET_WEIGHT = 0.12
#: the overrides to pass to the run, one line (``vlp pretrain ... $(cat DIR/override.txt)``)
OVERRIDE = "override.txt"
#: at most this many weights go into a histogram (a random subset beyond it)
PLOT_VALUES = 2_000_000
#: how a delta is chosen: the same-image probes' median weight, or the paper's 20% rule
RULES = ("probes", "20pct")
#: below this same-image AUC a helper is refused (``--force`` overrides): see MIN_AUC_SOURCE
MIN_SAME_IMAGE_AUC = 0.62
MIN_AUC_SOURCE = (
    "scripts/experiments/srcl_calibration.py (2026-11-28; docs/experiments.md, issue 40): the lowest helper at which "
    "SRCL at the no-ground-truth delta beat plain ITC, the oracle noised to ground-truth AUC 0.65 (same-image AUC "
    "0.624 +- 0.005; t2i R-precision +0.31 +- 0.20 over 12 seeds, significant after Holm); no helper below it was "
    "tested"
)
#: what passing the minimum does not say (printed with every helper that passes it)
SUFFICIENCY_CAVEAT = (
    "a same-image AUC above the minimum is not enough: on the testbed a learned helper at 0.795 (no stronger than "
    "the student, and sharing its initial weights) did not beat plain ITC (-0.23 +- 0.56 R-precision, 12 seeds, "
    "p 0.18); learned helpers at 1.1-1.6 times the student's R-precision all pass (0.80-0.84), and SRCL as published "
    "with them went from +0.82 (the weakest) to -0.93 (the second strongest, worse than plain ITC; 20 seeds, "
    "docs/experiments.md, issue 51)"
)
#: the heaviest negatives of a row whose weight share ``at_delta`` reports
TOP_K = 10


@dataclass
class CalibrationRows:
    """Both ITC directions of every sampled batch as rows: ``[R, B + Q]`` each, R = 2 x batches x
    B (i2t rows, then t2i rows, per batch); columns: the batch, then the queue."""

    helper: torch.Tensor  # the helper's similarity (cosine, or an oracle's relevance)
    positives: torch.Tensor  # bool: the anchor's own pair
    same_image: torch.Tensor  # bool: negatives from the anchor's image (in the batch or queue)
    probes: torch.Tensor  # [R, P] the helper similarity of the row's same-image probes; NaN: empty slot
    sources: torch.Tensor  # [R] long: the annotation file (index into ``data``) of the row's anchor

    @property
    def negatives(self) -> torch.Tensor:
        return ~self.positives

    @property
    def others(self) -> torch.Tensor:
        """[R, C] bool: the negatives not of the anchor's image (true negatives and unknown false ones)."""
        return self.negatives & ~self.same_image


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
    table = SampleTable.of(samples)
    source_of_item = torch.from_numpy(table.sample_sources.astype(np.int64))
    caps_of_item = [[text_row[c] for c in s.captions] for s in samples]
    caps_of_image: dict[int, set[int]] = {}
    for i, item_caps in zip(img_of_item, caps_of_item):
        caps_of_image.setdefault(int(i), set()).update(item_caps)
    feat_img, feat_txt, rel = cache.image.float(), cache.text.float(), cache.relevance
    b = batch_size
    pos = torch.zeros(b, b + queue_size, dtype=torch.bool)
    pos[:, :b] = torch.eye(b, dtype=torch.bool)
    h_rows, same_rows, probe_rows, source_rows = [], [], [], []
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
        source_rows += [source_of_item[items]] * 2
    width = max(p.shape[1] for p in probe_rows)
    probes = torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=float("nan")) for p in probe_rows])
    n = len(h_rows)
    return CalibrationRows(torch.cat(h_rows), pos.repeat(n, 1), torch.cat(same_rows), probes, torch.cat(source_rows))


def multi_caption_sources(samples: Sequence[Sample], n_sources: int) -> list[bool]:
    """Per annotation file (``SampleTable`` source index ``0 .. n_sources - 1``): whether any image
    of it has two or more captions (in one entry, or over several entries of the file)."""
    table = SampleTable.of(samples)
    n_caps = np.diff(table.caption_offsets)
    multi = []
    for k in range(n_sources):
        mine = table.sample_sources == k
        per_image = np.bincount(table.image_ids[mine], weights=n_caps[mine]) if mine.any() else np.zeros(1)
        multi.append(bool(per_image.max() >= 2))
    return multi


@torch.no_grad()
def same_image_auc(rows: CalibrationRows, n_sources: int, budget: int = 2**24) -> tuple[float, list[float]]:
    """The ROC-AUC of the rows' same-image probes against the other negatives of their rows
    (:attr:`CalibrationRows.others`): the share of (probe, other negative) pairs of a row where the
    helper ranks the probe higher, ties counting one half, pooled over rows; overall and per
    annotation file of the anchors. NaN where there is no pair. Needs no ground truth: a helper
    that cannot rank an image's own captions above other images' cannot find false negatives
    either. ``budget``: elements compared at once (:func:`vlp.lab.helper_student.pairwise_auc`)."""
    won, pairs = pairwise_auc(rows.probes, rows.helper, rows.others, rows.sources, n_sources, budget)
    per_source = (won / pairs).tolist()  # 0 / 0 -> NaN
    return float(won.sum() / pairs.sum()), per_source


@torch.no_grad()
def weight_concentration(w: torch.Tensor, positives: torch.Tensor, k: int = TOP_K) -> dict[str, float]:
    """How a row's weight is spread over its negatives, for weights ``w`` [R, C] (:func:`srcl_weights`)
    and ``positives`` [R, C]: ``n_eff_mean`` / ``n_eff_median`` of ``N_eff = (sum w)^2 / sum w^2``
    (equal weights: the number of negatives), ``negatives_per_row``, and ``top{k}_share``: the mean
    share of a row's weight its ``k`` heaviest negatives carry."""
    n_eff, n_neg = n_eff_rows([w], positives)
    wn = w.double().masked_fill(positives, 0.0)
    top = wn.topk(min(k, wn.shape[1]), dim=1).values.sum(1) / wn.sum(1)
    return {
        "n_eff_mean": float(n_eff.mean()),
        "n_eff_median": float(n_eff.median()),
        "negatives_per_row": float(n_neg.double().mean()),
        f"top{k}_share": float(top.mean()),
    }


def _subset(v: torch.Tensor, n: int = PLOT_VALUES) -> torch.Tensor:
    if v.numel() <= n:
        return v
    return v[torch.randperm(v.numel(), generator=torch.Generator().manual_seed(0))[:n]]


def _weights_report(
    rows: CalibrationRows,
    s: torch.Tensor,
    s_probe: torch.Tensor,
    mode: str,
    delta: float,
    out: Path,
    name: str,
    cache: str | Path,
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
        RunStep(Path(cache).name),  # the picture shows a helper cache: no run, no step
    )
    return {
        "delta": delta if mode == "softmax" else None,
        "false_negatives": weight_distribution(fn),
        "other_negatives": weight_distribution(other),
        "all_negatives": weight_distribution(all_neg),
        "plot": plot.name,
    }


def _num(x: Any, fmt: str = ".3f") -> str:
    """A report value for the summary: ``-`` for a missing one (an empty group's median)."""
    return "-" if x is None else format(x, fmt)


def calibration_summary(r: dict[str, Any]) -> str:
    """The lines ``vlp analyze helper`` prints of a report of :func:`run_helper_calibration`."""
    same, q = r["same_image"], r["quality"]
    lines = [
        f"{r['kind']} helper on {', '.join(r['data'])}: batch {r['batch_size']}, queue {r['queue_size']}, "
        f"{r['mode']} norm, delta by {r['rule']}",
        f"  known false negatives: {same['probes']} same-image captions probed (from {', '.join(r['probe_sources'])}"
        f"); {same['in_rows']} in the rows ({100 * same['in_rows_share']:.3f}% of {r['negatives']['with_queue']} "
        "negatives)",
        f"  helper quality: same-image AUC {_num(q['same_image_auc'])} (minimum {q['min_same_image_auc']:g})"
        + "".join(f"; {name}: {_num(auc)}" for name, auc in q["per_source"].items() if len(q["per_source"]) > 1),
    ]
    if r.get("against_student"):  # vlp.lab.helper_student
        s = r["against_student"]
        lines += [
            f"  against the student (temperature {_num(s['student_temperature'], '.4g')}, {s['rows']} rows): its "
            f"same-image AUC {_num(s['student_same_image_auc'])}; pair R@1 helper {_num(s['helper_pair_r1'])}, "
            f"student {_num(s['student_pair_r1'])} (gap {_num(s['pair_r1_gap'], '+.3f')})",
            f"  the helper's same-image AUC over the student's {s['k']} hardest negatives "
            f"{_num(s['hard_same_image_auc'])}, weighted by the student's softmax "
            f"{_num(s['student_weighted_same_image_auc'])}; rank agreement with the student "
            f"{_num(s['rank_agreement'])}",
        ]
    for name, w in r["weights"].items():
        fn, other, every = w["false_negatives"], w["other_negatives"], w["all_negatives"]
        head = f"delta {name:14s} {w['delta']:9.4g}" if w["delta"] is not None else f"{name} norm (no delta)"
        lines.append(
            f"  {head}: same-image median {_num(fn['median'])} (p90 {_num(fn['p90'])}), other negatives median "
            f"{_num(other['median'])}; {100 * every['below_0_7']:.1f}% of negatives below 0.7, "
            f"{100 * every['below_0_2']:.1f}% below 0.2"
        )
    if r.get("at_delta"):
        a = r["at_delta"]
        lines.append(
            f"  at the chosen delta: N_eff {a['n_eff_mean']:.1f} of {a['negatives_per_row']:.0f} negatives per row, "
            f"the {TOP_K} heaviest carry {100 * a[f'top{TOP_K}_share']:.0f}% of the weight"
        )
    for key in ("advice", "delta_error", "quality_warning", "quality_caveat", "refused"):
        if r.get(key):
            lines.append(f"  {r[key]}")
    if "mean_mode_floor" in r:
        lines.append(
            "  mean norm: the lowest weight a negative could get (at cosine 1): median "
            f"{_num(r['mean_mode_floor']['median'])}"
        )
    if r["override"]:
        lines.append(f"  paste: {r['override']}" + (" (forced past the quality check)" if r.get("forced") else ""))
    return "\n".join(lines)


def _probe_data(
    hc: HelperCache, samples: Sequence[Sample], data: Sequence[str], reference: Optional[str], image_root: Optional[str]
) -> tuple[Sequence[Sample], list[str], list[str]]:
    """The samples whose batches are calibrated on, the files they come from (the table's source
    order) and which of those have same-image probes: the training data when any of its files has
    an image with a second caption, else the multi-caption ``reference`` file (which the cache must
    cover too). Raises :class:`CalibrationError` naming the options when neither has probes."""
    multi = multi_caption_sources(samples, len(data))
    if any(multi):
        return samples, list(data), [d for d, m in zip(data, multi) if m]
    if reference is None:
        raise CalibrationError(
            f"{', '.join(data)}: no image has a second caption, so there are no known false negatives to calibrate "
            "delta on; give --reference FILE (a multi-caption annotation file the helper cache also covers, e.g. "
            "COCO's Karpathy train captions) or choose the paper's rule by name with --rule 20pct"
        )
    ref = load_pairs([reference], image_root)
    if not multi_caption_sources(ref, 1)[0]:
        raise CalibrationError(f"--reference {reference}: no image has a second caption in it either")
    try:
        hc.check_covers(ref)
    except Exception as e:
        raise CalibrationError(
            f"--reference {reference}: the helper cache does not cover it ({e}); cache its captions and images too "
            "(vlp cache-helper-features --data TRAIN... REFERENCE)"
        ) from None
    return ref, [str(reference)], [str(reference)]


def _choose_delta(
    rows: CalibrationRows, s: torch.Tensor, s_probe: torch.Tensor, rule: str, target_weight: float, report: dict
) -> dict[str, Optional[float]]:
    """Both softmax deltas (None where the search fails). The failure of the one ``rule`` chooses
    (no probe, or the target outside the search's bounds) is the report's ``refused``; the other's is
    its ``delta_error``."""
    deltas: dict[str, Optional[float]] = {"rule_20pct": None, "target_weight": None}
    searches = {
        "rule_20pct": lambda: calibrate_delta(s, rows.positives),
        "target_weight": lambda: calibrate_delta_for_probes(s, rows.positives, s_probe, target_weight),
    }
    chosen = "rule_20pct" if rule == "20pct" else "target_weight"
    for name, search in searches.items():
        try:
            deltas[name] = search()
        except CalibrationError as e:
            report.setdefault("refused" if name == chosen else "delta_error", str(e))
    return deltas


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
    reference: Optional[str] = None,
    rule: str = "probes",
    min_same_image_auc: float = MIN_SAME_IMAGE_AUC,
    force: bool = False,
    itc_positives: str = "pair",
    student_cache: Optional[str | Path] = None,
    student_temperature: Optional[float] = None,
) -> dict[str, Any]:
    """Calibrate SRCL's delta for a helper cache on training batches of the annotation files
    ``data`` (no ground truth); writes ``out/helper_diagnostics.json`` and ``out/weights_<name>.png``
    per delta, and ``out/override.txt`` only for a delta it trusts (module docstring: ``reference``,
    ``rule``, ``min_same_image_auc``, ``force``); returns the report. ``mode``: the weight norm;
    ``mean`` has no delta (it cancels), so only its distributions and its floor are reported.
    ``itc_positives="image"`` (retrieval fine-tuning): every caption of the anchor's image is a
    positive, so there are no known false negatives and only ``rule="20pct"`` applies.
    ``student_cache``: also the helper against the student (``against_student``); ``advice``: :func:`gate`."""
    if mode not in ("softmax", "mean"):
        raise ValueError(f"mode must be 'softmax' or 'mean', got {mode!r}")
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if itc_positives == "image" and mode == "softmax" and rule == "probes":
        raise CalibrationError(
            "itc_positives=image (retrieval fine-tuning): an image's other captions are positives there, not "
            "negatives, so there are no known false negatives to calibrate delta on; choose --rule 20pct"
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / OVERRIDE).unlink(missing_ok=True)  # a failed calibration leaves no earlier answer behind
    paths = [str(d) for d in data]
    hc = HelperCache.load(cache)
    probes_needed = mode == "softmax" and rule == "probes"
    how = (paths, image_root, reference, probes_needed, itc_positives, (batch_size, queue_size, batches, seed))
    rows, files, probe_files = _rows(hc, *how)
    settings: dict[str, Any] = dict(batch_size=batch_size, queue_size=queue_size, batches=batches, seed=seed)
    settings |= dict(tau_w=tau_w, mode=mode, rule=rule, target_weight=target_weight, itc_positives=itc_positives)
    settings["min_same_image_auc"] = min_same_image_auc
    report = _report_head(hc, cache, paths, files, probe_files, rows, settings, force)
    if student_cache is not None:
        report["against_student"] = _student_report(rows, student_cache, student_temperature, how)
    s = torch.exp(rows.helper / tau_w)
    s_probe = torch.exp(rows.probes / tau_w)  # NaN slots stay NaN
    names: dict[str, float]
    if mode == "softmax":
        deltas = _choose_delta(rows, s, s_probe, rule, target_weight, report)
        if delta is not None:
            deltas["given"] = delta
        names = {k: v for k, v in deltas.items() if v is not None}
        chosen = deltas["rule_20pct" if rule == "20pct" else "target_weight"]
        if chosen is not None:
            report["at_delta"] = weight_concentration(srcl_weights(s, rows.positives, mode, chosen), rows.positives)
    else:
        deltas, names, chosen = {"rule_20pct": None, "target_weight": None}, {"mean": 1.0}, None
        u = torch.reciprocal(s).masked_fill(rows.positives, float("nan"))
        floor = torch.exp(torch.tensor(-1.0 / tau_w)) / u.nanmean(1)
        report["delta_error"] = "mean mode: delta cancels (w = u / mean(u)); nothing to calibrate"
        report["mean_mode_floor"] = weight_distribution(floor)
    report["delta"] = deltas
    report["weights"] = {k: _weights_report(rows, s, s_probe, mode, d, out, k, cache) for k, d in names.items()}
    report["override"] = f"loss.srcl.norm=softmax loss.srcl.delta={chosen:.4g}" if chosen is not None else None
    refusal = report.get("refused") or _quality_check(report, min_same_image_auc, force)
    report = finite(report | {"advice": gate(report)})
    (out / REPORT).write_text(json.dumps(report, indent=1))
    if refusal:
        raise CalibrationError(refusal)
    if report["override"]:  # for `vlp pretrain ... $(cat DIR/override.txt)`
        (out / OVERRIDE).write_text(report["override"] + "\n")
    return report


def _rows(
    hc: HelperCache,
    paths: list[str],
    image_root: Optional[str],
    reference: Optional[str],
    probes_needed: bool,
    itc_positives: str,
    sampling: tuple[int, int, int, int],
) -> tuple[CalibrationRows, list[str], list[str]]:
    """What :func:`run_helper_calibration` calibrates on: the :class:`CalibrationRows` of
    ``sampling = (batch_size, queue_size, batches, seed)`` (with ``itc_positives="image"`` the
    anchor's image's other captions made positives), the files they come from and those with probes."""
    samples = load_pairs(paths, image_root)
    hc.check_covers(samples)
    rows_of, files, probe_files = (
        _probe_data(hc, samples, paths, reference, image_root)
        if probes_needed
        else (samples, paths, [d for d, m in zip(paths, multi_caption_sources(samples, len(paths))) if m])
    )
    rows = calibration_rows(hc, rows_of, *sampling)
    if itc_positives == "image":  # the anchor's image's other captions (in the batch or queue) are positives
        rows.positives, rows.same_image = rows.positives | rows.same_image, torch.zeros_like(rows.same_image)
        rows.probes = torch.full_like(rows.probes, float("nan"))
    return rows, files, probe_files


def _student_report(
    rows: CalibrationRows, student_cache: str | Path, temperature: Optional[float], how: tuple[Any, ...]
) -> dict[str, Any]:
    """The report's ``against_student`` (:func:`vlp.lab.helper_student.against_student`): the same rows
    (``how``: :func:`_rows`'s arguments after the cache) under the student's cache against the
    helper's ``rows``, with the batches they come from."""
    student = HelperCache.load(student_cache)
    return against_student(rows, _rows(student, *how)[0], student, temperature) | {"batches": how[-1][2]}


def _report_head(
    hc: HelperCache,
    cache: str | Path,
    data: list[str],
    files: list[str],
    probe_files: list[str],
    rows: CalibrationRows,
    settings: dict[str, Any],
    force: bool,
) -> dict[str, Any]:
    """The report's settings, populations and helper quality."""
    neg = rows.negatives
    auc, per_source = same_image_auc(rows, len(files))
    return {
        "cache": str(cache),
        "kind": hc.kind,
        "world": None,
        "data": data,
        **{k: v for k, v in settings.items() if k != "min_same_image_auc"},
        "calibrated_on": files,
        "probe_sources": probe_files,
        "one_caption_sources": [d for d in data if d not in probe_files],
        "false_negatives": "the other captions of each anchor's image (and, text->image, the image itself), "
        "each weighted as one more negative of its row",
        "negatives": {"in_batch": int((neg[:, : settings["batch_size"]]).sum()), "with_queue": int(neg.sum())},
        "same_image": {
            "probes": int((~torch.isnan(rows.probes)).sum()),
            "in_rows": int(rows.same_image.sum()),
            "in_rows_share": float(rows.same_image.sum()) / max(1, int(neg.sum())),
        },
        "quality": {
            "same_image_auc": auc,
            "per_source": dict(zip(files, per_source)),
            "min_same_image_auc": settings["min_same_image_auc"],
            "threshold_source": MIN_AUC_SOURCE,
        },
        "forced": bool(force),
    }


def _quality_check(report: dict[str, Any], minimum: float, force: bool) -> Optional[str]:
    """The refusal message when the helper's same-image AUC is below ``minimum`` (None: the helper
    passes, and ``quality_caveat`` says that passing is not sufficient; or it is forced; or the AUC
    cannot be measured, and ``quality_warning`` says so); a refused report keeps its numbers and
    loses its override."""
    auc = report["quality"]["same_image_auc"]
    if not math.isfinite(auc):
        report["quality_warning"] = (
            "helper quality unmeasured: no image has a second caption, so no same-image AUC (give --reference to check)"
        )
        return None
    if auc >= minimum:
        report["quality_caveat"] = SUFFICIENCY_CAVEAT
        return None
    if force:
        return None
    why = (
        "the weakest noised oracle SRCL was shown to help with (vlp.lab.calibration.MIN_AUC_SOURCE)"
        if minimum == MIN_SAME_IMAGE_AUC
        else "the minimum given (--min-same-image-auc)"
    )
    msg = (
        f"{report['cache']}: same-image AUC {auc:.3f} is below {minimum:g}, {why}; use a stronger helper, or --force "
        "to write the override anyway"
    )
    report["refused"], report["override"] = msg, None
    return msg
