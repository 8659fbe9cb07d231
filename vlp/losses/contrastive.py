"""Contrastive losses on similarity matrices ``[queries, candidates]``.

Losses take tensors (logits, target distributions, optional log-weights), never models.

Loss zoo conventions (``infonce``, ``triplet``, ``triplet_sh``, ``smooth_ap``; the registered loss
classes over them are in :mod:`vlp.losses.zoo`, their protocol in :mod:`vlp.losses.protocol`):

- One retrieval direction per call: ``sim`` [Q, C] is the (cosine) similarity of each query to each
  candidate, ``positives`` [Q, C] bool marks any number of positives per row. Every entry that is not
  a positive is a negative (N_q); positives are never negatives of their own query, and the query
  itself is never one of its own positives (cross-modal: queries and candidates are different items).
- Rows without a positive are skipped: they contribute nothing and are not counted in any mean.
- Computation is in fp32 whatever the input dtype; everything is device-agnostic.
- Multiple positives are handled per positive: InfoNCE has one term per (q, p) whose denominator is
  {p} ∪ N_q (the query's other positives are left out), triplets are per (q, p, n).
- Directions: a registered loss takes the i2t and t2i matrices separately
  (:class:`~vlp.losses.protocol.ContrastiveInputs`: a momentum bank gives two different [B, B + K]
  matrices; a dual encoder passes ``sim.T`` and ``pos.T``). Triplet and Triplet-SH SUM the two
  directions, InfoNCE and SmoothAP average them.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F


def itc_targets(
    positives: torch.Tensor, momentum_logits: Optional[torch.Tensor] = None, alpha: float | torch.Tensor = 0.0
) -> torch.Tensor:
    """Target distribution per query row.

    ``positives`` [Q, C] bool -> uniform over each row's positives; with ``momentum_logits`` [Q, C]
    and ``alpha`` > 0 (momentum distillation): ``alpha * softmax(m) + (1 - alpha) * y``. A 0-d
    tensor ``alpha`` (a compiled step's) always blends: at 0 that is ``y`` exactly.
    """
    y = positives.float()
    y = y / y.sum(1, keepdim=True).clamp_min(1.0)
    if momentum_logits is None or (not isinstance(alpha, torch.Tensor) and alpha == 0.0):
        return y
    return alpha * F.softmax(momentum_logits.float(), dim=1) + (1.0 - alpha) * y


def soft_infonce(
    logits: torch.Tensor, targets: torch.Tensor, log_weights: Optional[torch.Tensor] = None, removal: bool = False
) -> torch.Tensor:
    """``-mean_q sum_c targets[q, c] * log_softmax(logits + log_weights)[q, c]``.

    ``logits`` [Q, C] (already divided by the temperature), ``targets`` [Q, C] rows summing to 1,
    ``log_weights`` [Q, C] optional per-negative log-weights (0 = unweighted). Returns a scalar.
    With ``removal``, a log-weight of ``-inf`` removes that candidate from the contrast: it leaves
    the softmax, and its share of a soft (distillation) target is given to the remaining
    candidates. (Without ``removal`` every log-weight must be finite; skipping the bookkeeping
    saves several passes over ``[B, B + Q]``.)
    """
    logits = logits.float()
    if log_weights is None:
        return -(targets * F.log_softmax(logits, dim=1)).sum(1).mean()
    if not removal:
        return -(targets * F.log_softmax(logits + log_weights, dim=1)).sum(1).mean()
    removed = torch.isneginf(log_weights)
    logp = F.log_softmax(logits + log_weights, dim=1).masked_fill(removed, 0.0)
    kept = targets.masked_fill(removed, 0.0)
    kept = kept / kept.sum(1, keepdim=True).clamp_min(1e-12)
    targets = torch.where(removed.any(1, keepdim=True), kept, targets)  # rows without removals: exact
    return -(targets * logp).sum(1).mean()


def positive_index(positives: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Column indices of each row's positives, padded to P_max = max_q |P_q|.

    ``positives`` [Q, C] bool -> ``(idx [Q, P_max] long, mask [Q, P_max] bool)``; ``mask`` is False on
    padding (whose ``idx`` points at some non-positive column).
    """
    p_max = int(positives.sum(1).max()) if positives.numel() else 0
    idx = torch.argsort(positives.to(torch.uint8), dim=1, descending=True, stable=True)[:, :p_max]
    return idx, positives.gather(1, idx)


def _mean_valid(per_query: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of ``per_query`` [Q] over ``valid`` [Q] rows (0 when no row is valid)."""
    return per_query.masked_fill(~valid, 0.0).sum() / valid.sum().clamp_min(1)


def infonce(
    sim: torch.Tensor,
    positives: torch.Tensor,
    tau: Union[float, torch.Tensor],
    log_weights: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Multi-positive NT-Xent (cross-modal negatives only) for one direction. Returns a scalar.

    ``sim``, ``positives``, ``log_weights`` [Q, C]. For every positive p of query q,
    ``l_qp = -log(exp(s_qp/tau) / (exp(s_qp/tau) + sum_{n in N_q} exp(s_qn/tau + lw_qn)))``; the loss is the
    mean over queries with a positive of the mean over their positives. ``tau`` is a float or a 0-d tensor
    (gradient flows into it); the finite ``log_weights`` (e.g. SRCL) shift the negatives' logits only.
    With one positive per row this is ``cross_entropy(sim / tau, targets)``. Memory O(Q*C).
    """
    logits = sim.float() / tau
    neg_logits = logits if log_weights is None else logits + log_weights.float()
    neg_lse = neg_logits.masked_fill(positives, float("-inf")).logsumexp(1, keepdim=True)  # [Q, 1]
    nll = (torch.logaddexp(logits, neg_lse) - logits).masked_fill(~positives, 0.0)  # one term per positive
    n_pos = positives.sum(1)
    return _mean_valid(nll.sum(1) / n_pos.clamp_min(1), n_pos > 0)


def triplet_hinges(sim: torch.Tensor, positives: torch.Tensor, margin: float) -> torch.Tensor:
    """``[margin + s_qn - s_qp]_+`` as [Q, P_max, C], zero unless p is a positive and n a negative."""
    sim = sim.float()
    idx, pmask = positive_index(positives)
    hinge = (margin + sim[:, None, :] - sim.gather(1, idx)[:, :, None]).clamp_min(0.0)
    return hinge.masked_fill(~(pmask[:, :, None] & ~positives[:, None, :]), 0.0)


def triplet(sim: torch.Tensor, positives: torch.Tensor, margin: float) -> torch.Tensor:
    """Triplet loss over all negatives: ``sum_{q, p in P_q, n in N_q} [margin + s_qn - s_qp]_+``.

    ``sim``, ``positives`` [Q, C]. SUM reduction (the reference's; the scale grows with the batch).
    Memory O(Q * P_max * C).
    """
    return triplet_hinges(sim, positives, margin).sum()


def triplet_sh(sim: torch.Tensor, positives: torch.Tensor, margin: float) -> torch.Tensor:
    """VSE++ max-violation triplet: ``sum_{q, p in P_q} max_{n in N_q} [margin + s_qn - s_qp]_+``.

    ``sim``, ``positives`` [Q, C]; the hardest negative of q is shared by all its positives. Memory O(Q*C).
    """
    sim = sim.float()
    hardest = sim.masked_fill(positives, float("-inf")).amax(1, keepdim=True)  # -inf: no negative
    hinge = (margin + hardest - sim).clamp_min(0.0)
    return hinge.masked_fill(~positives, 0.0).sum()


def smoothap_sigmoids(sim: torch.Tensor, idx: torch.Tensor, tau: float) -> torch.Tensor:
    """``G(s_qj - s_qi; tau)`` for the rows i = ``idx`` [Q, P] of each query, all candidates j: [Q, P, C].

    ``G(x; tau) = sigmoid(x / tau)`` with ``x / tau`` clamped to [-50, 50]; the j = i entries are 0.
    """
    sim = sim.float()
    g = torch.sigmoid(((sim[:, None, :] - sim.gather(1, idx)[:, :, None]) / tau).clamp(-50.0, 50.0))
    return g.scatter(2, idx[:, :, None], 0.0)


def smooth_ap(sim: torch.Tensor, positives: torch.Tensor, tau: float) -> torch.Tensor:
    """SmoothAP loss ``1 - mean_q AP_q`` over queries with a positive. Returns a scalar.

    ``sim``, ``positives`` [Q, C]. For positive i of q: ``R(i, Omega) = 1 + sum_{j != i} G(s_qj - s_qi)``,
    ``R(i, P) = 1 + sum_{j in P_q, j != i} G(s_qj - s_qi)``; ``AP_q = mean_{i in P_q} R(i, P) / R(i, Omega)``.
    Only the positive rows i are materialised: [Q, P_max, C] (ECIR i2t at 128 images x 5 captions:
    [128, 5, 640] = 0.4M elements instead of the reference's [128, 640, 640] = 52M), never [Q, C, C].
    """
    idx, pmask = positive_index(positives)
    g = smoothap_sigmoids(sim, idx, tau)
    r_all = 1.0 + g.sum(2)
    r_pos = 1.0 + (g * positives[:, None, :]).sum(2)
    n_pos = positives.sum(1)
    ap = (r_pos / r_all).masked_fill(~pmask, 0.0).sum(1) / n_pos.clamp_min(1)
    return _mean_valid(1.0 - ap, n_pos > 0)


def cosines(a: torch.Tensor, bank: torch.Tensor) -> torch.Tensor:
    """``a`` [B, E] against ``bank`` [N, E] -> [B, N], in fp32 whatever the autocast: at temp 0.07
    a bf16 product would round cos/temp by up to 0.03 (0.2 at temp 0.01), in the logits and in the
    distillation targets alike."""
    with torch.autocast(a.device.type, enabled=False):
        return a.float() @ bank.float().T
