"""``vlp analyze helper --student``: measures of an SRCL helper taken against the *student* (the model
being trained, e.g. the checkpoint after a warm-up), without ground truth.

The helper's same-image AUC (:func:`vlp.lab.calibration.same_image_auc`) asks whether the helper ranks
an image's own captions above the other negatives of a row. These measures ask it of the negatives
that matter to the student, on the same rows: the student's similarities come from a feature cache
of the student (:func:`cache_student`, the machinery that caches a helper) put through
:func:`vlp.lab.calibration.calibration_rows` with the helper's sampling, so row ``r`` column ``c`` is
the same (anchor, candidate) pair in both (:func:`check_aligned`). The queue's columns hold the
student's own features, not a momentum encoder's.

- ``hard_same_image_auc``: the same-image AUC with each row's other negatives cut to the student's
  ``k`` hardest (the ``k`` with the highest student similarity; ties at the ``k``-th place go to
  the lower column; a row with fewer keeps all), the probes unchanged;
- ``student_weighted_same_image_auc``: each (probe, other negative) pair weighted by that
  negative's probability under the student's softmax over its row (every column, the positive
  too: ``softmax(student / T)``), the weighted wins over the weights of all pairs, pooled over rows;
- ``student_same_image_auc``: the student's own same-image AUC on the rows;
- ``rank_agreement``: the mean over rows of the Spearman correlation of the helper's and the
  student's similarities over the row's negatives (every non-positive column; ties by average
  rank; a row where either is constant has none and is left out);
- ``helper_pair_r1``, ``student_pair_r1``, ``pair_r1_gap`` (helper minus student): the share of
  rows whose positive has a similarity strictly above every negative of the row (a tie with the
  best negative is a miss).

Which number of the report, if any, predicts whether SRCL (annealed into the live model, vlp's
default) helps with a learned helper was read from an experiment (docs/experiments.md, issue 51): of
these and the calibration's, only the N_eff at the no-GT delta did, for learned helpers of the tiny
architecture on the shapes world. :data:`PREDICTOR` names it, its threshold, span, conditions and
source, and the report's ``advice`` (:func:`gate`) says go or stop by it in one line, or neither
where the user's report is outside what was measured; with :data:`PREDICTOR` None it says that no
measure is shown to predict and points to a trial on the user's own split (docs/methods.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence

import torch

from vlp.errors import ConfigError, DataError
from vlp.features.helper_cache import HelperCache
from vlp.models.open_clip_helper import CACHE_HELPER_KEY, is_open_clip_spec

#: the student's hardest other negatives of a row that ``hard_same_image_auc`` keeps
HARD_K = 10
#: elements (rows x probes x columns, or rows x columns) handled at once
BUDGET = 2**24
#: the folder of ``--out`` where ``vlp analyze helper --student`` caches the student's features
STUDENT_CACHE = "student_cache"


@dataclass(frozen=True)
class Predictor:
    """A measure of ``vlp analyze helper``'s report shown to predict SRCL's gain with a learned helper
    (docs/experiments.md, issue 51): ``measure`` its name, ``path`` its keys in the report
    (``helper_diagnostics.json``), ``threshold`` where the experiment's fitted gain crosses 0,
    ``rising`` go at or above it (False: at or below), ``span`` the (lowest, highest) value the
    experiment measured, ``source``, and ``conditions``: (keys, value) pairs of the report that were
    the experiment's and that the measure depends on (the rows' size, the calibration's settings)."""

    measure: str
    path: tuple[str, ...]
    threshold: float
    rising: bool
    span: tuple[float, float]
    source: str
    conditions: tuple[tuple[tuple[str, ...], Any], ...] = ()


#: the measure that predicts SRCL's gain with a learned helper (annealed into the live model, vlp's
#: default); None: none is shown. From the experiment's final look (20 seeds x 4 grades of the tiny
#: architecture trained on the shapes world; ``the_gate`` of scripts/experiments/srcl_helpers_report.py,
#: a test recomputes it from results/srcl_helpers)
PREDICTOR: Optional[Predictor] = Predictor(
    measure="N_eff at the no-GT delta",
    path=("at_delta", "n_eff_mean"),
    threshold=27.38,
    rising=False,
    span=(22.31, 31.78),
    source="docs/experiments.md, issue 51: learned helpers of the tiny architecture on the shapes world",
    conditions=(
        (("kind",), "learned"),
        (("at_delta", "negatives_per_row"), 63.0),
        (("mode",), "softmax"),
        (("rule",), "probes"),
        (("target_weight",), 0.12),
        (("tau_w",), 1.0),
        (("itc_positives",), "pair"),
    ),
)
#: the advice while no measure is shown to predict
NO_PREDICTOR = (
    "no measure, same-image AUC included, is yet shown to predict SRCL's gain with a learned helper "
    "(docs/experiments.md, issue 51): a short paired trial on your own split tells (docs/methods.md, "
    "'A trial on your own split')"
)


def _at(report: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(report, dict) or key not in report:
            return None
        report = report[key]
    return report


def report_value(report: Any, path: Sequence[str]) -> Optional[float]:
    """The number at ``path`` (keys) in a report of ``vlp analyze helper``; None where it has none."""
    value = _at(report, path)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def advice(report: dict[str, Any], predictor: Optional[Predictor] = None) -> str:
    """The one line ``vlp analyze helper`` advises by: :data:`NO_PREDICTOR` without a ``predictor``;
    else go or stop by its measure in ``report`` against its threshold, and neither where the report
    lacks the measure, differs from the experiment in one of its ``conditions``, or has a value
    outside what the experiment measured."""
    if predictor is None:
        return NO_PREDICTOR
    p = predictor
    named = f"{p.measure}, the measure shown to predict SRCL's gain with a learned helper ({p.source})"
    value = report_value(report, p.path)
    if value is None:
        needs = "; give --student" if p.path[0] == "against_student" else ""
        return f"no go or stop: {named}, is not in this report ({'.'.join(p.path)}{needs})"
    for keys, want in p.conditions:
        got = _at(report, keys)
        if got != want:
            return f"no go or stop: {named}, was measured with {'.'.join(keys)} {want}; this report has {got}"
    lo, hi = p.span
    if not lo <= value <= hi:
        return f"no go or stop: {p.measure} {value:.4g} lies outside what was measured ({lo:.4g} to {hi:.4g}); {named}"
    go = value >= p.threshold if p.rising else value <= p.threshold
    sign = (">=" if go else "<") if p.rising else ("<=" if go else ">")
    return f"{'go' if go else 'stop'}: {p.measure} {value:.4g} {sign} {p.threshold:.4g}, {named}"


def gate(report: dict[str, Any]) -> str:
    """:func:`advice` by :data:`PREDICTOR` (read when called) on a report of ``vlp analyze helper``."""
    return advice(report, PREDICTOR)


class Rows(Protocol):
    """What the measures read of :class:`vlp.lab.calibration.CalibrationRows` (``[R, C]`` each:
    similarities, positives, same-image negatives; ``probes`` [R, P], NaN: an empty slot)."""

    helper: torch.Tensor
    positives: torch.Tensor
    same_image: torch.Tensor
    probes: torch.Tensor
    sources: torch.Tensor

    @property
    def negatives(self) -> torch.Tensor:
        """[R, C] bool: every non-positive column."""
        ...

    @property
    def others(self) -> torch.Tensor:
        """[R, C] bool: the negatives not of the anchor's image."""
        ...


@torch.no_grad()
def pairwise_auc(
    probes: torch.Tensor,
    scores: torch.Tensor,
    weights: torch.Tensor,
    groups: Optional[torch.Tensor] = None,
    n_groups: int = 1,
    budget: int = BUDGET,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weighted wins of probes over columns: for every row ``r``, probe ``p`` (not NaN) and column
    ``c``, the pair counts ``weights[r, c]`` times 1 where ``probes[r, p] > scores[r, c]``, 1/2 where
    equal, 0 below. ``probes`` [R, P] (NaN: empty slot), ``scores`` [R, C] (compared in fp32),
    ``weights`` [R, C] (>= 0; 0 or False: not compared), ``groups`` [R] long in ``0 .. n_groups - 1``
    (default: one group). Returns ``(won, pairs)``, [n_groups] each (fp64): the weighted wins and the
    total weight of the pairs; ``won / pairs`` is the (weighted) ROC-AUC, 0/0 = NaN where a group
    has no pair. ``budget``: elements ``P x C`` compared at once (rows are taken in chunks)."""
    groups = torch.zeros(len(scores), dtype=torch.long) if groups is None else groups
    won = torch.zeros(n_groups, dtype=torch.float64)
    pairs = torch.zeros(n_groups, dtype=torch.float64)
    step = max(1, budget // max(1, probes.shape[1] * scores.shape[1]))
    n_probes = (~torch.isnan(probes)).sum(1).double()  # [R]
    for r0 in range(0, len(scores), step):
        rows = slice(r0, r0 + step)
        p, s = probes[rows, :, None].float(), scores[rows, None, :].float()  # NaN probes compare False
        per_column = (p > s).sum(1).double() + 0.5 * (p == s).sum(1).double()  # [r, C]
        w = weights[rows].double()
        won.index_add_(0, groups[rows], (per_column * w).sum(1))
        pairs.index_add_(0, groups[rows], n_probes[rows] * w.sum(1))
    return won, pairs


def _auc(probes: torch.Tensor, scores: torch.Tensor, weights: torch.Tensor) -> float:
    """:func:`pairwise_auc` pooled over all rows: one number (NaN without a pair)."""
    won, pairs = pairwise_auc(probes, scores, weights)
    return float(won.sum() / pairs.sum())


@torch.no_grad()
def hardest(student: torch.Tensor, candidates: torch.Tensor, k: int = HARD_K, budget: int = BUDGET) -> torch.Tensor:
    """[R, C] bool: of each row's ``candidates`` [R, C] (bool), the ``k`` with the highest ``student``
    [R, C] similarity; ties at the ``k``-th place go to the lower column; a row with fewer
    candidates keeps all of them."""
    keep = torch.zeros_like(candidates)
    step = max(1, budget // max(1, student.shape[1]))
    for r0 in range(0, len(student), step):
        rows = slice(r0, r0 + step)
        s = student[rows].float().masked_fill(~candidates[rows], -math.inf)
        order = s.sort(dim=1, descending=True, stable=True).indices[:, :k]
        keep[rows] = torch.zeros_like(candidates[rows]).scatter_(1, order, True) & candidates[rows]
    return keep


def student_softmax(student: torch.Tensor, temperature: float) -> torch.Tensor:
    """[R, C] fp32: the student's softmax over each row's columns, ``softmax(student / temperature)``
    (``student`` [R, C] similarities): the share of the row's loss gradient each column gets."""
    return torch.softmax(student.float() / temperature, dim=1)


def average_ranks(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[R, C] fp64: the 1-based rank of each entry of ``x`` [R, C] among the ``mask`` [R, C] (bool)
    entries of its row, ties given their average rank; NaN outside ``mask``."""
    v = x.float().masked_fill(~mask, math.inf)
    s = v.sort(dim=1).values
    below = torch.searchsorted(s, v, right=False)  # entries of the row below each one
    upto = torch.searchsorted(s, v, right=True)  # ... below or equal
    return ((below + upto + 1).double() / 2).masked_fill(~mask, math.nan)


@torch.no_grad()
def spearman_rows(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, budget: int = BUDGET) -> torch.Tensor:
    """[R] fp64: the Spearman rank correlation of ``a`` and ``b`` [R, C] over each row's ``mask`` [R, C]
    (bool) entries (ties by average rank); NaN for a row where either is constant (or has one entry)."""
    out = torch.empty(len(a), dtype=torch.float64)
    step = max(1, budget // max(1, a.shape[1]))
    for r0 in range(0, len(a), step):
        rows = slice(r0, r0 + step)
        m = mask[rows]
        ra, rb = average_ranks(a[rows], m), average_ranks(b[rows], m)
        da = (ra - ra.nanmean(1, keepdim=True)).nan_to_num(0.0)
        db = (rb - rb.nanmean(1, keepdim=True)).nan_to_num(0.0)
        out[rows] = (da * db).sum(1) / ((da * da).sum(1) * (db * db).sum(1)).sqrt()  # 0 / 0 -> NaN
    return out


def pair_r1(sim: torch.Tensor, positives: torch.Tensor) -> float:
    """The share of rows whose positive (the best of them, for several) has a similarity strictly
    above every negative of the row: ``sim`` [R, C], ``positives`` [R, C] (bool). A tie with the
    best negative is a miss."""
    best_pos = sim.float().masked_fill(~positives, -math.inf).amax(1)
    best_neg = sim.float().masked_fill(positives, -math.inf).amax(1)
    return float((best_pos > best_neg).double().mean())


def check_aligned(helper: Rows, student: Rows) -> None:
    """A :class:`DataError` unless both row sets are the same pairs: equal ``positives``,
    ``same_image``, ``sources`` and probe slots (``probes`` NaN in the same places)."""
    parts = {
        "positives": (helper.positives, student.positives),
        "same_image": (helper.same_image, student.same_image),
        "sources": (helper.sources, student.sources),
        "probe slots": (torch.isnan(helper.probes), torch.isnan(student.probes)),
    }
    differ = [name for name, (h, s) in parts.items() if h.shape != s.shape or not torch.equal(h, s)]
    if differ:
        raise DataError(
            f"the helper's and the student's calibration rows are not the same pairs ({', '.join(differ)} differ: "
            f"helper rows {tuple(helper.positives.shape)}, student rows {tuple(student.positives.shape)}); build both "
            "with calibration_rows from the same samples, batch size, queue size, batches and seed"
        )


def student_measures(helper: Rows, student: Rows, temperature: float, k: int = HARD_K) -> dict[str, float]:
    """The helper measured against the student on the same rows (module docstring): ``helper`` and
    ``student`` [R, C] rows of :func:`vlp.lab.calibration.calibration_rows` over the same batches
    (:func:`check_aligned`), ``temperature``: the student's ITC temperature, ``k``: the hardest
    negatives kept. Returns ``hard_same_image_auc``, ``student_weighted_same_image_auc``,
    ``student_same_image_auc``, ``rank_agreement``, ``helper_pair_r1``, ``student_pair_r1``,
    ``pair_r1_gap``, ``k``, ``student_temperature`` and ``rows``; NaN where a measure has no pair."""
    check_aligned(helper, student)
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"the student's temperature must be a positive number, got {temperature}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    others = helper.others
    h, s = helper.helper.float(), student.helper.float()
    h_r1, s_r1 = pair_r1(h, helper.positives), pair_r1(s, student.positives)
    return {
        "hard_same_image_auc": _auc(helper.probes, h, hardest(s, others, k)),
        "student_weighted_same_image_auc": _auc(helper.probes, h, student_softmax(s, temperature) * others),
        "student_same_image_auc": _auc(student.probes, s, others),
        "rank_agreement": float(spearman_rows(h, s, helper.negatives).nanmean()),
        "helper_pair_r1": h_r1,
        "student_pair_r1": s_r1,
        "pair_r1_gap": h_r1 - s_r1,
        "k": k,
        "student_temperature": float(temperature),
        "rows": len(h),
    }


def checkpoint_temperature(checkpoint: str | Path) -> float:
    """The ITC temperature a run divides its similarities by: the checkpoint's fixed
    ``loss.contrastive.tau`` if its config sets one, else its learned ``temp`` (``model.safetensors``
    key ``temp``). ``checkpoint``: a checkpoint folder or run directory (its newest valid checkpoint).
    A :class:`ConfigError` where it has neither (give the temperature instead)."""
    from safetensors import safe_open

    from vlp.checkpoint import open_checkpoint

    ckpt = open_checkpoint(checkpoint, load=False)
    tau = ckpt.config.loss.contrastive.tau
    if tau is not None:
        return float(tau)
    with safe_open(str(ckpt.path / "model.safetensors"), framework="pt") as f:
        if "temp" in f.keys():
            return float(f.get_tensor("temp").float())
    raise ConfigError(
        f"{ckpt.path}: no ITC temperature (neither loss.contrastive.tau nor a learned 'temp'); give "
        "--student-temperature"
    )


def cache_temperature(cache: HelperCache) -> float:
    """The temperature of the student whose features ``cache`` holds: :func:`checkpoint_temperature`
    of the checkpoint its ``index.json`` names. A :class:`ConfigError` for a cache not written from a
    vlp checkpoint that is still there (an oracle, an open_clip model, a moved checkpoint)."""
    source = cache.meta.get(CACHE_HELPER_KEY)
    if cache.is_oracle or not source or is_open_clip_spec(source) or not Path(str(source)).exists():
        raise ConfigError(
            f"student feature cache {cache.path}: its student's temperature cannot be read (written from "
            f"{source or cache.kind}, not from a vlp checkpoint found on disk); give --student-temperature"
        )
    return checkpoint_temperature(str(source))


def against_student(
    helper: Rows, student: Rows, cache: HelperCache, temperature: Optional[float] = None, k: int = HARD_K
) -> dict[str, Any]:
    """The report's ``against_student``: :func:`student_measures` at ``temperature`` (None: the
    temperature of the checkpoint that wrote ``cache``, :func:`cache_temperature`), with the student's
    cache, checkpoint and where the temperature came from (``given`` or ``checkpoint``)."""
    given = temperature is not None
    t = float(temperature) if temperature is not None else cache_temperature(cache)
    measures = student_measures(helper, student, t, k)
    return {
        "student_cache": str(cache.path),
        "student_checkpoint": cache.meta.get(CACHE_HELPER_KEY),
        "temperature_from": "given" if given else "checkpoint",
        **measures,
    }


def cache_student(
    checkpoint: str | Path, data: Sequence[str | Path], folder: str | Path, image_root: Optional[str] = None
) -> Path:
    """The student's feature cache ``folder`` of the annotation files ``data``: written from the
    checkpoint folder or run directory ``checkpoint`` (its newest valid checkpoint) as a helper's
    is (:func:`vlp.runs.training.features.run_cache_helper_features`), or the one already there when it
    was written from that checkpoint and covers ``data``; a :class:`ConfigError` when one is there
    that does not (remove it, or choose another folder)."""
    from vlp.data.formats import load_pairs
    from vlp.runs.training.features import run_cache_helper_features
    from vlp.weights import find_checkpoint

    folder, paths = Path(folder), [str(d) for d in data]
    if not folder.exists():
        return run_cache_helper_features(checkpoint, paths, folder, image_root=image_root, show_progress=False)
    cache, want = HelperCache.load(folder), str(find_checkpoint(checkpoint).resolve())
    if cache.meta.get(CACHE_HELPER_KEY) != want:
        raise ConfigError(
            f"{folder} holds features of {cache.meta.get(CACHE_HELPER_KEY)}, not of the student {want}; remove it "
            "or choose another --out"
        )
    try:
        cache.check_covers(load_pairs(paths, image_root))
    except DataError as e:
        raise ConfigError(f"{folder}: the student's cached features do not cover the data ({e}); remove it") from None
    return folder
