"""SRCL: similarity-regulated contrastive weights (Jiang et al., ACL 2023).

Every negative of an anchor row gets a weight ``w_ij = Norm(delta / s_ij)`` from a mixed
cross-modal similarity ``s_ij = alpha_h * exp(cos_helper / tau_w) + (1 - alpha_h) * exp(cos_live /
tau_w)``; ``Norm`` makes the mean weight over the row's negatives exactly 1. That is the paper's
Eq. 9, in which ``delta`` cancels when ``Norm`` divides by the row mean (``mean`` here); the default
``softmax`` norm, ``n_neg * softmax(delta / s)``, is vlp's reinterpretation, with ``delta`` as its
sharpness (docs/methods.md). Weights carry no gradient, positives keep weight 1, and the weights
enter the loss as ``log w`` added to the logits (see :func:`vlp.losses.contrastive.soft_infonce`),
so ``w == 1`` is exactly the plain loss.

All functions take ``[Q, C]`` tensors (rows = anchors, columns = candidates) and a boolean
``positives`` mask of the same shape; every non-positive column is a negative.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from vlp.errors import CalibrationError
from vlp.losses.contrastive import itc_targets

MIN_WEIGHT = 1e-6  # clamp before the log


def alpha_h_at(step: int, span: int, end: float = 0.0) -> float:
    """Helper share of the mixed similarity: 1 at step 0, linearly to ``end`` at ``span`` (then
    ``end``). ``end = 0`` is the paper's fade-out; ``end = 1`` keeps the helper alone for the whole
    run (e.g. an oracle helper).

    ``span <= 0`` means no helper at all (fine-tuning: the live model alone regulates)."""
    if span <= 0:
        return 0.0
    return 1.0 - (1.0 - end) * min(1.0, max(0.0, step / span))


@torch.no_grad()
def mixed_similarity(
    cos_live: torch.Tensor, cos_helper: torch.Tensor | None, alpha_h: float, tau_w: float = 1.0
) -> torch.Tensor:
    """``s = alpha_h * exp(cos_helper / tau_w) + (1 - alpha_h) * exp(cos_live / tau_w)``, [Q, C].

    ``cos_helper`` may be None only when ``alpha_h == 0``."""

    def e(c: torch.Tensor) -> torch.Tensor:
        c = c.detach().float()
        return torch.exp(c if tau_w == 1.0 else c / tau_w)

    live = e(cos_live)
    if alpha_h == 0.0:
        return live
    if cos_helper is None:
        raise ValueError("SRCL needs helper similarities while alpha_h > 0")
    helper = e(cos_helper)
    return live.lerp_(helper, alpha_h)  # (1 - a) * live + a * helper, in place


@torch.no_grad()
def srcl_weights(s: torch.Tensor, positives: torch.Tensor, mode: str = "softmax", delta: float = 1.0) -> torch.Tensor:
    """Per-negative weights from similarities ``s`` [Q, C] (> 0); positives get exactly 1.

    ``mean``: ``w = u / mean_neg(u)`` with ``u = 1 / s`` (delta cancels).
    ``softmax``: ``w = n_neg * softmax_neg(delta * u)``; delta -> 0 gives w = 1.
    Either way the mean of ``w`` over each row's negatives is 1 and ``w`` falls as ``s`` grows.
    (Large queues make these [B, B + Q] passes the whole cost of SRCL: they are done in place.)
    """
    n_neg = (s.shape[1] - torch.count_nonzero(positives, dim=1)[:, None]).clamp_min(1).float()
    u = torch.reciprocal(s.float())
    if mode == "mean":
        mean_u = u.masked_fill(positives, 0.0).sum(1, keepdim=True) / n_neg
        w = u.div_(mean_u)
    elif mode == "softmax":
        w = torch.softmax(u.mul_(delta).masked_fill_(positives, float("-inf")), dim=1).mul_(n_neg)
    else:
        raise ValueError(f"SRCL weight mode must be 'softmax' or 'mean', got {mode!r}")
    return w.masked_fill_(positives, 1.0)  # also clears the NaN of rows without any negative


@torch.no_grad()
def removal_log_weights(
    w: torch.Tensor, positives: torch.Tensor, threshold: float, reweight: bool = False
) -> torch.Tensor:
    """ALBEF++ removal: negatives with ``w < threshold`` get log-weight -inf (dropped from the
    contrast). Survivors keep log-weight 0 (unweighted, the paper's ALBEF++), or with ``reweight``
    their SRCL weights renormalised to mean 1 over the surviving negatives. Positives: always 0."""
    drop = (w < threshold) & ~positives
    if reweight:
        keep = ~drop & ~positives
        mean_kept = (w * keep).sum(1, keepdim=True) / keep.sum(1, keepdim=True).clamp_min(1)
        out = to_log_weights(w / mean_kept.clamp_min(MIN_WEIGHT), positives)
    else:
        out = torch.zeros_like(w)
    return out.masked_fill(drop, float("-inf"))


@torch.no_grad()
def to_log_weights(w: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """``log(max(w, 1e-6))`` for negatives, exactly 0 for positives."""
    return w.clamp_min(MIN_WEIGHT).log_().masked_fill_(positives, 0.0)


LEVELS = (0.2, 0.7)  # the paper's false-negative level and its histogram threshold


def level_key(level: float, prefix: str = "srcl_w_") -> str:
    return f"{prefix}below_{str(level).replace('.', '_')}"


@torch.no_grad()
def weight_stats(
    w: torch.Tensor | Sequence[torch.Tensor],
    positives: torch.Tensor,
    levels: tuple[float, ...] = LEVELS,
    prefix: str = "srcl_w_",
) -> dict[str, torch.Tensor]:
    """Statistics of the negatives' weights, as 0-d tensors (no device sync): ``{prefix}mean``,
    ``{prefix}min`` and ``{prefix}below_<level>`` (fraction of negatives below each level).

    ``w`` is one or several matrices (both ITC directions) as :func:`srcl_weights` returns them:
    positives carry weight exactly 1 and each row's negatives average 1. So the sums, the minimum
    and the counts below a level <= 1 can run over whole matrices, without copying out the
    negatives (at ``B + Q = 65k`` columns the copies would cost more than the weights)."""
    if any(lv > 1.0 for lv in levels):
        raise ValueError(f"levels must be <= 1 (positives have weight 1), got {levels}")
    ws = [w] if isinstance(w, torch.Tensor) else list(w)
    n_pos = torch.count_nonzero(positives) * len(ws)
    n_neg = positives.numel() * len(ws) - n_pos
    denom = n_neg.clamp_min(1).float()
    has_neg = n_neg > 0
    one = torch.ones((), device=positives.device)
    total = sum(x.sum() for x in ws) - n_pos
    low = torch.stack([x.min() for x in ws]).min()  # <= 1, so never a positive's weight unless equal
    out = {f"{prefix}mean": torch.where(has_neg, total / denom, one), f"{prefix}min": torch.where(has_neg, low, one)}
    for lv in levels:
        out[level_key(lv, prefix)] = sum(torch.count_nonzero(x < lv) for x in ws) / denom
    return out


@torch.no_grad()
def effective_negatives(
    w: torch.Tensor | Sequence[torch.Tensor], positives: torch.Tensor, prefix: str = "srcl_"
) -> dict[str, torch.Tensor]:
    """How many negatives a row's weights leave in effect, as 0-d fp32 tensors (no device sync):
    ``{prefix}n_eff``, the mean over rows of ``N_eff = (sum w)^2 / sum w^2`` over the row's
    negatives, and ``{prefix}n_eff_share``, the mean over rows of ``N_eff / n_neg`` (1: every
    negative counts fully, plain ITC; ``k / n_neg``: the weight sits on ``k`` negatives).

    ``w``: one or several [Q, C] matrices as :func:`srcl_weights` returns them (positives carry
    weight exactly 1, so row sums over the whole row less the positives' count are the negatives'
    sums; no copy of the negatives is made). ``positives`` [Q, C] bool, shared by the matrices.
    Rows without negatives are left out; NaN when no row has any."""
    ws = [w] if isinstance(w, torch.Tensor) else list(w)
    n_eff, n_neg = n_eff_rows(ws, positives)
    rows = torch.count_nonzero(n_neg > 0) * len(ws)
    return {f"{prefix}n_eff": n_eff.sum() / rows, f"{prefix}n_eff_share": (n_eff / n_neg.clamp_min(1)).sum() / rows}


@torch.no_grad()
def n_eff_rows(ws: Sequence[torch.Tensor], positives: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of each of the [Q, C] weight matrices ``ws`` (as :func:`srcl_weights` returns them:
    positives at weight exactly 1), ``N_eff = (sum w)^2 / sum w^2`` over the row's negatives:
    [len(ws), Q] fp32, 0 for a row without negatives; and each row's number of negatives [Q]."""
    n_pos = torch.count_nonzero(positives, dim=1).float()  # [Q]
    n_neg = positives.shape[1] - n_pos
    total = torch.stack([x.float().sum(1) for x in ws]) - n_pos  # [len(ws), Q]: the negatives' sums
    squares = torch.stack([torch.linalg.vector_norm(x.float(), dim=1) for x in ws]).square_().sub_(n_pos)
    return torch.where(n_neg > 0, total.square_().div_(squares.clamp_min_(MIN_WEIGHT**2)), 0.0), n_neg


def _log_bisect(falls_short: Callable[[float], bool], lo: float, hi: float, iters: int) -> float:
    """Bisection in log-space over ``[lo, hi]``: the point where ``falls_short(delta)`` turns from
    True (below it) to False (above it)."""
    lo_l, hi_l = math.log(lo), math.log(hi)
    for _ in range(iters):
        mid = 0.5 * (lo_l + hi_l)
        lo_l, hi_l = (mid, hi_l) if falls_short(math.exp(mid)) else (lo_l, mid)
    return math.exp(0.5 * (lo_l + hi_l))


@torch.no_grad()
def calibrate_delta(
    s: torch.Tensor,
    positives: torch.Tensor,
    frac_below: float = 0.2,
    level: float = 0.7,
    lo: float = 1e-3,
    hi: float = 1e3,
    iters: int = 60,
) -> float:
    """The ``softmax``-mode delta at which a fraction ``frac_below`` of the negatives gets a weight
    below ``level`` (the paper: about 20% below 0.7). Bisection in log-space; the fraction grows
    with delta (delta -> 0 gives w = 1, nothing below ``level``)."""
    if not 0.0 < frac_below < 1.0:
        raise ValueError(f"frac_below must be in (0, 1), got {frac_below}")

    def frac(delta: float) -> float:
        w = srcl_weights(s, positives, "softmax", delta)
        return float(weight_stats(w, positives, (level,))[level_key(level)])

    at_lo, at_hi = frac(lo), frac(hi)
    if not at_lo < frac_below <= at_hi:
        raise CalibrationError(
            f"calibrate delta by the {100 * frac_below:g}% rule: the share of negatives below {level} is "
            f"{100 * at_lo:.3g}% at delta={lo:g} and {100 * at_hi:.3g}% at delta={hi:g}, the bounds of the "
            f"search; {100 * frac_below:g}% is not reached inside them (a helper whose similarities set too few "
            "negatives apart, e.g. an exact oracle with fewer false negatives than that)"
        )
    return _log_bisect(lambda d: frac(d) < frac_below, lo, hi, iters)


@torch.no_grad()
def relevance_lookup(relevance: torch.Tensor, text_idx: torch.Tensor, image_idx: torch.Tensor) -> torch.Tensor:
    """An oracle helper's "cosines": ``relevance[text_idx[a], image_idx[b]]`` -> [N_t, N_i] (fp32).

    ``relevance`` [n_texts, n_images] ground-truth relevance in [0, 1] (an oracle helper cache);
    ``text_idx`` [N_t] or [N_t, 1] and ``image_idx`` [N_i] or [N_i, 1] its row / column indices as
    floats (the oracle cache's "features"). A negative index (an empty queue slot) gives 0: no
    relevance, like a random negative. One gather of the output's size, whatever the table's."""
    t = text_idx.reshape(-1).round().long()
    i = image_idx.reshape(-1).round().long()
    out = relevance[t.clamp_min(0)[:, None], i.clamp_min(0)[None, :]].float()
    return out.masked_fill_((t < 0)[:, None] | (i < 0)[None, :], 0.0)


def _lower_quantile(v: torch.Tensor, q: float) -> torch.Tensor:
    """The ``ceil(q * n)``-th smallest of ``v`` [n] (nearest rank; q = 0.5: torch's lower median).
    :func:`torch.kthvalue` has no size limit, unlike :func:`torch.quantile`."""
    k = min(max(1, math.ceil(q * v.numel())), v.numel())
    return v.kthvalue(k).values


@torch.no_grad()
def weight_distribution(w: torch.Tensor, levels: tuple[float, ...] = LEVELS) -> dict[str, float]:
    """Summary of a group of weights ``w`` [N] (any shape, flattened): ``count``, ``mean``,
    ``median`` (lower median, as :func:`calibrate_delta_for_weight` uses), ``p10``, ``p90``
    (nearest rank) and ``below_<level>`` (share below each level). NaN for an empty group."""
    v = w.detach().reshape(-1).float()
    out = {"count": float(v.numel())}
    if v.numel() == 0:
        nan = float("nan")
        return {**out, "mean": nan, "median": nan, "p10": nan, "p90": nan, **{level_key(lv, ""): nan for lv in levels}}
    out.update(mean=float(v.mean()), median=float(v.median()))
    out.update(p10=float(_lower_quantile(v, 0.1)), p90=float(_lower_quantile(v, 0.9)))
    for lv in levels:
        out[level_key(lv, "")] = float((v < lv).float().mean())
    return out


WEIGHT_STATISTICS = ("median", "mean")


@torch.no_grad()
def calibrate_delta_for_weight(
    s: torch.Tensor,
    positives: torch.Tensor,
    false_negatives: torch.Tensor,
    target: float = 0.15,
    statistic: str = "median",
    lo: float = 1e-3,
    hi: float = 1e3,
    iters: int = 60,
) -> float:
    """The ``softmax``-mode delta at which the false negatives' ``statistic`` (``median``: torch's
    lower median, or ``mean``) weight equals ``target`` (the paper: false negatives get ~0.12,
    "not more than 0.2").

    ``s`` [Q, C] similarities (> 0), ``positives`` [Q, C] bool, ``false_negatives`` [Q, C] bool:
    the negatives known to be false (ground truth; entries that are also positives are ignored).
    Bisection in log-space over ``[lo, hi]``: delta -> 0 gives every weight 1, and as delta grows
    the weight of the more similar negatives falls. Raises ``ValueError`` when there are no false
    negatives or the target is not reached within ``[lo, hi]`` (e.g. a helper that gives false
    negatives no higher similarity than true ones)."""
    if statistic not in WEIGHT_STATISTICS:
        raise ValueError(f"statistic must be one of {WEIGHT_STATISTICS}, got {statistic!r}")
    if not 0.0 < target < 1.0:
        raise ValueError(f"target must be in (0, 1) (the mean weight of all negatives is 1), got {target}")
    fn = false_negatives & ~positives
    if not bool(fn.any()):
        raise ValueError("calibrate_delta_for_weight: no false negatives among the negatives")

    def stat(delta: float) -> float:
        w = srcl_weights(s, positives, "softmax", delta)[fn]
        return float(w.median() if statistic == "median" else w.mean())

    return _bisect_falling(stat, target, lo, hi, iters, f"the false negatives' {statistic} weight")


def _bisect_falling(
    stat: Callable[[float], float], target: float, lo: float, hi: float, iters: int, what: str
) -> float:
    """The delta in ``[lo, hi]`` where ``stat(delta)``, falling with delta, crosses ``target``;
    ``ValueError`` naming ``what`` when the target lies outside ``[stat(hi), stat(lo)]``."""
    at_lo, at_hi = stat(lo), stat(hi)
    if not at_hi <= target <= at_lo:
        raise CalibrationError(
            f"calibrate delta: {what} is {at_lo:.4g} at delta={lo:g} and {at_hi:.4g} at delta={hi:g}, the "
            f"bounds of the search; the target {target} is outside that range (does the helper give false "
            "negatives a higher similarity than true negatives?)"
        )
    return _log_bisect(lambda d: stat(d) > target, lo, hi, iters)


@torch.no_grad()
def probe_weights(
    s: torch.Tensor, positives: torch.Tensor, s_probe: torch.Tensor, mode: str = "softmax", delta: float = 1.0
) -> torch.Tensor:
    """The weight each probe would get as one more negative of its row: [Q, P].

    ``s`` [Q, C] and ``positives`` [Q, C] are the rows as :func:`srcl_weights` takes them (n_q
    negatives in row q); ``s_probe`` [Q, P] (> 0; NaN marks an empty probe slot, whose weight is
    NaN) the similarities of candidates that are not in the row, e.g. the other captions of the
    anchor's image (known false negatives the queue may hold). Probe j of row q is weighted as if
    the row had it as negative n_q + 1 (only itself added):
    ``softmax``: ``(n_q + 1) exp(delta u_j) / (sum_neg exp(delta u_k) + exp(delta u_j))``;
    ``mean``: ``(n_q + 1) u_j / (sum_neg u_k + u_j)``, with ``u = 1 / s``. Computed in float64
    (``delta u`` reaches thousands when delta is calibrated on a sharp helper)."""
    n_neg = (s.shape[1] - torch.count_nonzero(positives, dim=1)[:, None]).double()
    u = torch.reciprocal(s.double()).masked_fill_(positives, float("nan"))
    u_p = torch.reciprocal(s_probe.double())
    if mode == "mean":
        total = u.nansum(1, keepdim=True)
        return ((n_neg + 1) * u_p / (total + u_p)).float()
    if mode != "softmax":
        raise ValueError(f"SRCL weight mode must be 'softmax' or 'mean', got {mode!r}")
    z = torch.logsumexp((delta * u).masked_fill_(positives, float("-inf")), 1, keepdim=True)
    log_w = torch.log(n_neg + 1) + delta * u_p - torch.logaddexp(z, delta * u_p)
    return log_w.exp().float()


@torch.no_grad()
def calibrate_delta_for_probes(
    s: torch.Tensor,
    positives: torch.Tensor,
    s_probe: torch.Tensor,
    target: float = 0.12,
    lo: float = 1e-3,
    hi: float = 1e3,
    iters: int = 60,
) -> float:
    """The ``softmax``-mode delta at which the probes' lower median weight
    (:func:`probe_weights`; NaN slots ignored) equals ``target``: with the other captions of each
    anchor's image as probes, the delta that gives a typical known false negative the weight the
    paper reports (~0.12). Bisection in log-space; ``ValueError`` when there is no probe or the
    target is out of reach within ``[lo, hi]``."""
    if not 0.0 < target < 1.0:
        raise ValueError(f"target must be in (0, 1) (the mean weight of all negatives is 1), got {target}")
    valid = ~torch.isnan(s_probe)
    if not bool(valid.any()):
        raise CalibrationError("calibrate_delta_for_probes: no probes (no image with a second caption in the rows)")

    def median(delta: float) -> float:
        return float(probe_weights(s, positives, s_probe, "softmax", delta)[valid].median())

    return _bisect_falling(median, target, lo, hi, iters, "the same-image captions' median weight")


@torch.no_grad()
def distillation_optimum(
    momentum_logits: torch.Tensor, positive: int, log_w: torch.Tensor, alpha: float, weight_targets: bool
) -> torch.Tensor:
    """The student's unweighted softmax at the optimum of weighted ITC with momentum distillation,
    for one row: [C] (float64).

    The student minimises ``-sum_j t_j log softmax(l + log w)_j`` over free logits ``l`` [C]; the
    optimum is ``softmax(l + log w) = t``, so ``softmax(l)_j ∝ t_j / w_j``. The targets are
    ``t = alpha * softmax(m) + (1 - alpha) * onehot(positive)`` (``weight_targets=False``, ALBEF's
    targets) or ``alpha * softmax(m + log w) + (1 - alpha) * onehot(positive)``
    (``weight_targets=True``). ``momentum_logits`` [C] (already divided by the temperature),
    ``log_w`` [C] finite log-weights (0 for the positive). With unweighted targets a negative of
    small weight ``w`` gets its probability inflated by ``1 / w``; with weighted targets the
    negatives keep the momentum model's ordering, ``softmax(l)_j ∝ alpha * exp(m_j) / Z_w`` for
    ``j != positive``."""
    m, lw = momentum_logits.double().reshape(-1), log_w.double().reshape(-1)
    if m.shape != lw.shape or not 0 <= positive < m.numel():
        raise ValueError(f"momentum_logits {tuple(m.shape)} and log_w {tuple(lw.shape)} must match, positive in range")
    if not bool(torch.isfinite(lw).all()):
        raise ValueError("distillation_optimum needs finite log-weights (a removed entry has no optimum)")
    pos = torch.zeros(1, m.numel(), dtype=torch.bool)
    pos[0, positive] = True
    t = itc_targets(pos, (m + lw if weight_targets else m)[None], alpha)[0].double()
    p = t * torch.exp(-lw)
    return p / p.sum()
