"""Retrieval metrics: recall@k (ALBEF ``itm_eval`` semantics), relevance-aware recall, R-precision.

Score matrices are ``[queries, candidates]``; higher is better. Ties are counted against the
query (a positive tied with a negative ranks below it), so constant scores give chance-level
recall, never a perfect one.
"""

from __future__ import annotations

from typing import Sequence

import torch

KS = (1, 5, 10)


def positives_mask(groups: Sequence[Sequence[int]], n_candidates: int) -> torch.Tensor:
    """[Q, C] bool from per-query lists of positive candidate indices."""
    m = torch.zeros(len(groups), n_candidates, dtype=torch.bool)
    for q, g in enumerate(groups):
        m[q, list(g)] = True
    return m


def best_positive_rank(scores: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """0-based rank of each query's best-scored positive: the number of non-positive candidates
    scoring at least as high. ``scores`` [Q, C] float, ``positives`` [Q, C] bool -> [Q] long."""
    best = scores.masked_fill(~positives, float("-inf")).max(1).values
    return ((scores >= best[:, None]) & ~positives).sum(1)


def recall_at(ranks: torch.Tensor, ks: Sequence[int] = KS) -> dict[int, float]:
    """Percentage of queries whose rank is below k, per k."""
    return {k: 100.0 * (ranks < k).float().mean().item() for k in ks}


def retrieval_metrics(
    scores_i2t: torch.Tensor, scores_t2i: torch.Tensor, img2txt: Sequence[Sequence[int]], txt2img: Sequence[int]
) -> dict[str, float]:
    """ALBEF keys: ``txt_r{1,5,10}`` (image->text; an image counts its best-ranked caption),
    ``img_r{1,5,10}`` (text->image), their means, ``r_mean`` and ``rsum``, in percent."""
    n_img, n_txt = scores_i2t.shape
    tr = recall_at(best_positive_rank(scores_i2t, positives_mask(img2txt, n_txt)))
    ir = recall_at(best_positive_rank(scores_t2i, positives_mask([[i] for i in txt2img], n_img)))
    out = {f"txt_r{k}": v for k, v in tr.items()} | {f"img_r{k}": v for k, v in ir.items()}
    out["txt_r_mean"] = sum(tr.values()) / len(tr)
    out["img_r_mean"] = sum(ir.values()) / len(ir)
    out["r_mean"] = (out["txt_r_mean"] + out["img_r_mean"]) / 2
    out["rsum"] = sum(tr.values()) + sum(ir.values())
    return out


def r_precision(scores: torch.Tensor, relevant: torch.Tensor) -> float:
    """Mean over queries of precision at R, R = the query's number of relevant candidates (%).
    Queries with no relevant candidate are skipped. ``scores``/``relevant`` [Q, C]."""
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    hits = torch.gather(relevant, 1, order).float().cumsum(1)
    r = relevant.sum(1)
    keep = r > 0
    at_r = torch.gather(hits[keep], 1, (r[keep] - 1)[:, None]).squeeze(1)
    return 100.0 * (at_r / r[keep].float()).mean().item()


def relevance_metrics(
    scores_i2t: torch.Tensor, scores_t2i: torch.Tensor, relevant_images: Sequence[Sequence[int]], ks: Sequence[int] = KS
) -> dict[str, float]:
    """Relevance-aware metrics from exact relevance lists (text -> every image that satisfies it).

    ``img_r{k}_rel``: text->image, a hit if any relevant image is in the top k. ``txt_r{k}_rel``:
    image->text, a hit if any caption true of the image is in the top k. ``img_r_precision`` and
    ``txt_r_precision``: R-precision in each direction.
    """
    n_img = scores_i2t.shape[0]
    rel_t2i = positives_mask(relevant_images, n_img)  # [N_txt, N_img]
    rel_i2t = rel_t2i.T.contiguous()
    out = {f"img_r{k}_rel": v for k, v in recall_at(best_positive_rank(scores_t2i, rel_t2i), ks).items()}
    out |= {f"txt_r{k}_rel": v for k, v in recall_at(best_positive_rank(scores_i2t, rel_i2t), ks).items()}
    out["img_r_precision"] = r_precision(scores_t2i, rel_t2i)
    out["txt_r_precision"] = r_precision(scores_i2t, rel_i2t)
    return out


def chance_recall(n_candidates: int, n_positives: int, k: int) -> float:
    """Expected recall@k (%) of a random ranking with ``n_positives`` positives among ``n_candidates``."""
    p_miss = 1.0
    for j in range(k):
        p_miss *= max(0.0, (n_candidates - n_positives - j) / (n_candidates - j))
    return 100.0 * (1.0 - p_miss)
