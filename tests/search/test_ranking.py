"""vlp.search.ranking: block cosines equal one product; the top k equal a full sort, ties in row order."""

from __future__ import annotations

import numpy as np

from vlp.search import cosine_scores, top_k


def _brute(scores: np.ndarray, k: int) -> np.ndarray:
    """Every row sorted by score, highest first, ties by row: the first ``k``."""
    return np.lexsort((np.arange(len(scores)), -scores))[:k]


def test_block_scores_equal_one_product_and_the_top_k_a_full_sort(tmp_path) -> None:
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((1000, 32)).astype(np.float32)
    feats /= np.linalg.norm(feats, axis=1, keepdims=True)
    np.save(tmp_path / "f.npy", feats)
    mapped = np.load(tmp_path / "f.npy", mmap_mode="r")
    q = feats[17]
    scores = cosine_scores(mapped, q, block_rows=64)
    np.testing.assert_allclose(scores, feats @ q, atol=1e-6, rtol=0)
    for k in (1, 10, 999, 1000, 5000):
        np.testing.assert_array_equal(top_k(scores, k), _brute(scores, k))
    assert top_k(scores, 1)[0] == 17 and len(top_k(scores, 0)) == 0


def test_ties_are_kept_in_row_order_whatever_argpartition_picks() -> None:
    scores = np.array([0.5, 0.9, 0.5, 0.1, 0.5, 0.9, 0.5, 0.5], dtype=np.float32)
    assert top_k(scores, 3).tolist() == [1, 5, 0]
    assert top_k(scores, 5).tolist() == [1, 5, 0, 2, 4]
    assert top_k(scores, 8).tolist() == [1, 5, 0, 2, 4, 6, 7, 3]
    rng = np.random.default_rng(1)
    many = rng.integers(0, 4, 500).astype(np.float32)  # four distinct values, many ties
    for k in (1, 37, 250, 499):
        np.testing.assert_array_equal(top_k(many, k), _brute(many, k))
