"""COCOS: count, per query, the candidates that contribute to the gradient of a contrastive loss.

Same conventions as the loss zoo in :mod:`vlp.losses.contrastive`: one direction per call, ``sim`` [Q, C]
and ``positives`` [Q, C] bool (any number of positives; every other entry is a negative; rows without a
positive are skipped and not counted). Each function returns a dict with ``counts`` [Q] (float tensor,
0 on skipped rows) and python-float statistics; ``valid`` is the number of queries with a positive and
``zeros`` the number of those whose count is 0. Counts are always per query of the given direction
(for t2i, per caption query). :func:`count_stats` makes that dict from per-query counts: a new loss's
:meth:`~vlp.losses.protocol.ContrastiveLoss.cocos` counts its contributing candidates and hands them to it.
"""

from __future__ import annotations

import torch

from vlp.losses.contrastive import positive_index, smoothap_sigmoids, triplet_hinges
from vlp.losses.protocol import Stats


def count_stats(counts: torch.Tensor, valid: torch.Tensor, exclude_zeros: bool = True) -> Stats:
    """The COCOS statistics of per-query ``counts`` [Q] (contributing candidates of each query, any
    number type) over the queries ``valid`` [Q] bool (those with a positive; the others count 0):
    ``counts`` (float [Q]), ``valid`` (how many), ``zeros`` (valid queries counting 0), ``count_total``
    and ``count_mean`` = total / (valid - zeros), or total / valid without ``exclude_zeros``; NaN when
    that denominator is 0."""
    counts = counts.float().masked_fill(~valid, 0.0)
    n_valid = int(valid.sum())
    zeros = int((valid & (counts == 0)).sum())
    total = float(counts.sum())
    denom = n_valid - zeros if exclude_zeros else n_valid
    return {
        "counts": counts,
        "valid": float(n_valid),
        "zeros": float(zeros),
        "count_total": total,
        "count_mean": total / denom if denom else float("nan"),
    }


@torch.no_grad()
def cocos_triplet(sim: torch.Tensor, positives: torch.Tensor, margin: float, hardest: bool) -> Stats:
    """Contributing triplets per query: (q, p, n) with ``margin + s_qn - s_qp > 0``, summed over p in P_q.

    With ``hardest`` (Triplet-SH) only the hardest negative of each (q, p) can contribute (0 or 1 per pair).
    Returns ``counts`` [Q], ``valid``, ``zeros``, ``count_total`` = sum of counts and ``count_mean`` =
    count_total / (valid - zeros) (the reference's ``grads_mean``; NaN when every valid query is zero).
    """
    sim = sim.float()
    if hardest:
        hard = sim.masked_fill(positives, float("-inf")).amax(1, keepdim=True)
        counts = ((margin + hard - sim > 0) & positives).sum(1)
    else:
        counts = (triplet_hinges(sim, positives, margin) > 0).sum((1, 2))
    return count_stats(counts, positives.any(1))


@torch.no_grad()
def cocos_infonce(sim: torch.Tensor, positives: torch.Tensor, tau: float, threshold: float = 0.01) -> Stats:
    """Softmax (gradient) weights of the multi-positive InfoNCE of :func:`vlp.losses.contrastive.infonce`.

    ``p_qj`` is the weight of candidate j in the term of positive p (softmax over {p} ∪ N_q), averaged over
    the query's positives. Returns, as means over valid queries: ``one_minus_p_pos`` = 1 - mean_p p_qp
    (positive-gradient magnitude without the 1/tau), ``neg_mass_below`` / ``neg_mass_above`` = summed
    negative weight with p_qn <= / > ``threshold`` (the two add up to ``one_minus_p_pos``), ``count_mean``
    = number of negatives with p_qn > ``threshold`` (zero-count queries included); plus ``counts`` [Q],
    ``count_total``, ``valid`` and ``zeros``.
    """
    logits = sim.float() / tau
    neg_lse = logits.masked_fill(positives, float("-inf")).logsumexp(1, keepdim=True)
    log_denom = torch.logaddexp(logits, neg_lse).masked_fill(~positives, float("inf"))  # per positive term
    n_pos = positives.sum(1)
    valid = n_pos > 0
    p_pos = torch.exp(logits - log_denom).sum(1) / n_pos.clamp_min(1)
    # mean_p exp(l_n - denom_p) = exp(l_n + log mean_p exp(-denom_p))
    log_mean_inv = (-log_denom).logsumexp(1, keepdim=True) - n_pos.clamp_min(1).log()[:, None]
    p_neg = torch.exp(logits + log_mean_inv).masked_fill(positives | ~valid[:, None], 0.0)
    above = p_neg > threshold
    n_valid = int(valid.sum())
    per_query = {
        "one_minus_p_pos": (1.0 - p_pos).masked_fill(~valid, 0.0),
        "neg_mass_below": p_neg.masked_fill(above, 0.0),
        "neg_mass_above": p_neg.masked_fill(~above, 0.0),
    }
    stats = count_stats(above.sum(1), valid, exclude_zeros=False)
    stats.update({k: float(v.sum()) / n_valid if n_valid else float("nan") for k, v in per_query.items()})
    return stats


@torch.no_grad()
def cocos_smoothap(
    sim: torch.Tensor, positives: torch.Tensor, tau: float, threshold: float = 0.01, inv_tau: bool = False
) -> Stats:
    """SmoothAP pairs (positive row i, candidate j != i) with ``G (1 - G) / R(i, Omega)^2 > threshold``.

    ``G = G(s_qj - s_qi; tau)`` is the clamped sigmoid of :func:`vlp.losses.contrastive.smooth_ap`, so the
    contribution is the sigmoid derivative without its 1/tau factor (the ECIR 2022 definition). With
    ``inv_tau`` it is the true derivative magnitude ``G (1 - G) / tau / R(i, Omega)^2`` (ECIR's appendix A
    g(D; tau)): the same count as ``threshold * tau`` without it. Per query count = contributing pairs
    / |P_q|. Returns ``counts`` [Q], ``valid``, ``zeros``, ``count_total`` and ``count_mean`` =
    count_total / (valid - zeros). Memory O(Q * P_max * C) (positive rows only).
    """
    idx, pmask = positive_index(positives)
    g = smoothap_sigmoids(sim, idx, tau)
    r_all = 1.0 + g.sum(2, keepdim=True)
    contribution = g * (1.0 - g) / r_all**2
    if inv_tau:
        contribution = contribution / tau
    hits = (contribution > threshold) & pmask[:, :, None]  # j = i has g = 0, never a hit
    n_pos = positives.sum(1)
    return count_stats(hits.sum((1, 2)) / n_pos.clamp_min(1), n_pos > 0)
