"""How well a score separates two groups (e.g. a helper's similarity: false vs true negatives)."""

from __future__ import annotations

import torch


@torch.no_grad()
def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores`` [N] for ``labels`` [N] (bool, True = positive group):
    the probability that a random positive outscores a random negative, ties counting 1/2.

    Rank-based (Mann-Whitney U with mid-ranks for ties), O(N log N), computed in float64:
    ``AUC = (sum of the positives' ranks - P (P + 1) / 2) / (P * N_neg)``. Raises ``ValueError``
    when the shapes differ or either group is empty."""
    s, y = scores.detach().reshape(-1).double(), labels.detach().reshape(-1).bool()
    if s.shape != y.shape:
        raise ValueError(f"scores {tuple(scores.shape)} and labels {tuple(labels.shape)} must have the same size")
    n_pos = int(y.sum())
    n_neg = y.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"roc_auc needs both groups: {n_pos} positives, {n_neg} negatives")
    _, inverse, counts = torch.unique(s, sorted=True, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()  # 1-based rank of the last member of each tie group
    mid_ranks = ends - (counts.double() - 1.0) / 2.0
    rank_sum = float(mid_ranks[inverse][y].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)
