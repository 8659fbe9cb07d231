"""Ranking an index's rows by cosine to one query: the scores a block of rows at a time (the
features stay memory-mapped: only one block is paged in at once), the top k by
``np.argpartition``, ties in row order."""

from __future__ import annotations

import numpy as np

#: rows scored per block (at E = 256 float32: 64 MiB of the index read at a time)
BLOCK_ROWS = 1 << 16


def cosine_scores(features: np.ndarray, query: np.ndarray, block_rows: int = BLOCK_ROWS) -> np.ndarray:
    """``features`` [N, E] (normalised; a memmap is read ``block_rows`` rows at a time) @ ``query``
    [E] (normalised) -> the cosines [N] float32."""
    q = np.asarray(query, dtype=np.float32)
    out = np.empty(len(features), dtype=np.float32)
    for lo in range(0, len(features), block_rows):
        out[lo : lo + block_rows] = np.asarray(features[lo : lo + block_rows], dtype=np.float32) @ q
    return out


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """The rows of the ``k`` highest ``scores`` [N] (all of them when k >= N), highest first; equal
    scores in row order, so the answer is the same whichever rows ``np.argpartition`` picked among
    ties at the k-th score."""
    n = len(scores)
    k = min(k, n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    kth = scores[np.argpartition(scores, n - k)[n - k]]  # the k-th highest score
    above = np.flatnonzero(scores > kth)
    ties = np.flatnonzero(scores == kth)[: k - len(above)]
    rows = np.concatenate([above, ties])
    return rows[np.lexsort((rows, -scores[rows]))]
