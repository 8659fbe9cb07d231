"""Retrieval metrics: recall@k (ALBEF ``itm_eval`` semantics), relevance-aware recall, R-precision,
mAP@R (ECCV Caption), nDCG@k (graded relevance), mAP@k (two definitions) and the text->image
metrics of groups of query captions.

Score matrices are ``[queries, candidates]``; higher is better. Ties are counted against the
query (a positive tied with a negative ranks below it; for graded relevance, a less relevant
candidate ranks above a more relevant one with the same score), so constant scores never give a
perfect result. Every ranking metric here uses the same tie rule (:func:`rank_order`).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch

KS = (1, 5, 10)
CHUNK = 1 << 22  # score entries per block of query rows: bounds the temporaries at COCO size (5k x 25k)


def _row_blocks(scores: torch.Tensor) -> list[slice]:
    """Blocks of query rows of about :data:`CHUNK` entries each (per-query metrics are computed
    block by block, so no full-size temporary copy of a [Q, C] matrix is made)."""
    q, c = scores.shape
    step = max(1, CHUNK // max(c, 1))
    return [slice(s, min(s + step, q)) for s in range(0, q, step)]


def positives_mask(groups: Sequence[Sequence[int]], n_candidates: int) -> torch.Tensor:
    """[Q, C] bool from per-query lists of positive candidate indices."""
    m = torch.zeros(len(groups), n_candidates, dtype=torch.bool)
    for q, g in enumerate(groups):
        m[q, list(g)] = True
    return m


def best_positive_rank(scores: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """0-based rank of each query's best-scored positive: the number of non-positive candidates
    scoring at least as high. ``scores`` [Q, C] float, ``positives`` [Q, C] bool -> [Q] long."""
    out = torch.empty(scores.shape[0], dtype=torch.long)
    for b in _row_blocks(scores):
        sc, pos = scores[b], positives[b]
        best = sc.masked_fill(~pos, float("-inf")).max(1).values
        out[b] = ((sc >= best[:, None]) & ~pos).sum(1)
    return out


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


def rank_order(scores: torch.Tensor, relevance: torch.Tensor) -> torch.Tensor:
    """Candidate indices of each query from best to worst score, ties broken against the query.

    ``scores`` [Q, C] float, ``relevance`` [Q, C] (bool or float gains) -> [Q, C] long. Among
    candidates with equal scores the less relevant come first (then lower index first): two
    stable sorts, by relevance ascending and then by score descending.
    """
    by_rel = torch.sort(relevance.float(), dim=1, stable=True).indices
    by_score = torch.sort(torch.gather(scores, 1, by_rel), dim=1, descending=True, stable=True).indices
    return torch.gather(by_rel, 1, by_score)


def _ranked(scores: torch.Tensor, relevant: torch.Tensor, k: Optional[int] = None) -> torch.Tensor:
    """[Q, k] bool: the relevance of each query's top ``k`` (None: all) candidates in rank order
    (:func:`rank_order`, ties against the query). ``scores`` [Q, C] float, ``relevant`` [Q, C] bool."""
    order = rank_order(scores, relevant)
    return torch.gather(relevant, 1, order if k is None else order[:, :k])


def r_precision(scores: torch.Tensor, relevant: torch.Tensor) -> float:
    """Mean over queries of precision at R, R = the query's number of relevant candidates (%):
    ``(1/R) * sum_{i<=R} rel(i)``, ECCV Caption's R-Precision. Queries with no relevant candidate
    are skipped. ``scores``/``relevant`` [Q, C] (bool). Ties against the query (:func:`rank_order`)."""
    per_query = []
    for b in _row_blocks(scores):
        rel = relevant[b]
        hits = _ranked(scores[b], rel).float().cumsum(1)
        r = rel.sum(1)
        keep = r > 0
        at_r = torch.gather(hits[keep], 1, (r[keep] - 1)[:, None]).squeeze(1)
        per_query.append(at_r / r[keep].float())
    return 100.0 * torch.cat(per_query).mean().item()


def map_at_r(scores: torch.Tensor, relevant: torch.Tensor) -> float:
    """mAP@R (Musgrave et al. 2020; ECCV Caption's main metric): the mean over queries of
    ``AP@R = (1/R) * sum_{i=1..R} P(i) * rel(i)``, R = the query's number of relevant candidates,
    P(i) = precision in the top i, rel(i) = 1 if the candidate at rank i is relevant (%).

    Only the top R ranks count, so 100% means the top R are exactly the relevant candidates.
    Queries with no relevant candidate are skipped (NaN if every query is). ``scores`` [Q, C] float,
    ``relevant`` [Q, C] bool. Ties against the query (:func:`rank_order`).
    """
    per_query = []
    for b in _row_blocks(scores):
        rel = relevant[b]
        r = rel.sum(1)
        keep = r > 0
        rel, r = rel[keep], r[keep]
        width = int(r.max()) if len(r) else 0
        hits = _ranked(scores[b][keep], rel, width).double()  # [q, max R]: ranks beyond a query's R are masked
        rank = torch.arange(1, width + 1, dtype=torch.float64)
        precision = hits.cumsum(1) / rank
        within_r = rank[None, :] <= r[:, None]
        per_query.append((precision * hits * within_r).sum(1) / r.double())
    return 100.0 * torch.cat(per_query).mean().item()


def ndcg_at(scores: torch.Tensor, gains: torch.Tensor, k: int) -> float:
    """Mean nDCG@k over the queries with any positive gain (%).

    ``scores`` [Q, C] float; ``gains`` [Q, C] float >= 0 (0 = irrelevant), used linearly as in
    TERN/LTD (no ``2^g - 1``): DCG@k = sum_{r=1..min(k, C)} gain_r / log2(r + 1) over the ranking by
    score (ties against the query, :func:`rank_order`), IDCG@k the same over the query's gains sorted
    descending. Queries whose gains are all 0 are skipped (NaN if every query is).
    """
    k = min(k, scores.shape[1])
    discount = 1.0 / torch.log2(torch.arange(2, k + 2, dtype=torch.float64))  # [k]
    per_query = []
    for b in _row_blocks(scores):
        g = gains[b].double()
        ranked = torch.gather(g, 1, rank_order(scores[b], gains[b])[:, :k])  # [q, k]
        dcg = (ranked * discount).sum(1)
        idcg = (g.topk(k, dim=1).values * discount).sum(1)
        keep = idcg > 0
        per_query.append(dcg[keep] / idcg[keep])
    return 100.0 * torch.cat(per_query).mean().item()


MAP_DEFINITIONS = ("vlp", "ecir")


def map_at(scores: torch.Tensor, relevant: torch.Tensor, k: int, definition: str = "vlp") -> float:
    """Mean AP@k over the queries with at least one relevant candidate (%).

    ``scores`` [Q, C] float, ``relevant`` [Q, C] bool; R = the query's number of relevant
    candidates, H = the number of them in the top k.

    - ``vlp``: AP@k = (1 / min(R, k)) * sum_{r<=k} P@r * rel_r, so 100% means the top min(R, k)
      are all relevant.
    - ``ecir`` (the ECIR 2022 code, ``average_precision``): AP@k = (1 / H) * sum_{r<=k} P@r * rel_r,
      0 if H = 0: the precision averaged over the hits found, so one hit at rank 1 scores 100%
      however many relevant candidates the top k missed.

    Ties against the query (:func:`rank_order`).
    """
    if definition not in MAP_DEFINITIONS:
        raise ValueError(f"unknown mAP definition {definition!r}; expected one of {MAP_DEFINITIONS}")
    k = min(k, scores.shape[1])
    per_query = []
    for b in _row_blocks(scores):
        rel = relevant[b]
        hits = _ranked(scores[b], rel, k).double()  # [q, k]
        precision = hits.cumsum(1) / torch.arange(1, k + 1, dtype=torch.float64)
        r = rel.sum(1)
        keep = r > 0
        denom = r.clamp(max=k).double() if definition == "vlp" else hits.sum(1).clamp(min=1)
        per_query.append((precision * hits).sum(1)[keep] / denom[keep])
    return 100.0 * torch.cat(per_query).mean().item()


NDCG_KS = (10, 25)
MAP_KS = (5, 10)


def relevance_metrics(
    scores_i2t: torch.Tensor,
    scores_t2i: torch.Tensor,
    relevant_images: Sequence[Sequence[int]],
    ks: Sequence[int] = KS,
    graded: Optional[torch.Tensor] = None,
    ndcg_ks: Sequence[int] = NDCG_KS,
    map_ks: Sequence[int] = MAP_KS,
    relevant_texts: Optional[Sequence[Sequence[int]]] = None,
) -> dict[str, float]:
    """Relevance-aware metrics from exact relevance lists (text -> every image relevant to it).

    ``scores_i2t`` [N_img, N_txt], ``scores_t2i`` [N_txt, N_img]; ``relevant_images`` [N_txt]
    lists; ``relevant_texts`` [N_img] lists of the image->text positives (None: the transpose of
    ``relevant_images``); ``graded`` optional [N_txt, N_img] float gains >= 0. Each direction
    averages over its queries with a non-empty list, counted in ``img_rel_queries`` /
    ``txt_rel_queries``. All other values in percent.

    ``img_r{k}_rel``: text->image, a hit if any relevant image is in the top k. ``txt_r{k}_rel``:
    image->text, a hit if any relevant caption is in the top k (k = 1: ECCV Caption's R@1).
    ``img_r_precision`` and ``txt_r_precision``: R-precision in each direction; ``img_map_at_r``,
    ``txt_map_at_r``: mAP@R (:func:`map_at_r`). ``img_ndcg{k}``: text->image nDCG@k with the
    ``graded`` gains if given, else binary gains from the lists. ``txt_map{k}``: image->text mAP@k;
    ``txt_map{k}_ecir`` the same under the ECIR 2022 definition (:func:`map_at`).
    """
    n_img, n_txt = scores_i2t.shape
    rel_t2i = positives_mask(relevant_images, n_img)  # [N_txt, N_img]
    rel_i2t = positives_mask(relevant_texts, n_txt) if relevant_texts is not None else rel_t2i.T.contiguous()
    if graded is not None and graded.shape != rel_t2i.shape:
        raise ValueError(
            f"graded relevance has shape {tuple(graded.shape)}, expected {tuple(rel_t2i.shape)} (texts, images)"
        )
    out = _t2i_relevance(scores_t2i, rel_t2i, graded, ks, ndcg_ks)
    scores_i2t, rel_i2t, _ = _queries(scores_i2t, rel_i2t)
    out["txt_rel_queries"] = float(len(rel_i2t))
    out |= {f"txt_r{k}_rel": v for k, v in recall_at(best_positive_rank(scores_i2t, rel_i2t), ks).items()}
    out["txt_r_precision"] = r_precision(scores_i2t, rel_i2t)
    out["txt_map_at_r"] = map_at_r(scores_i2t, rel_i2t)
    out |= {f"txt_map{k}": map_at(scores_i2t, rel_i2t, k) for k in map_ks}
    out |= {f"txt_map{k}_ecir": map_at(scores_i2t, rel_i2t, k, "ecir") for k in map_ks}
    return out


def _queries(
    scores: torch.Tensor, rel: torch.Tensor, gains: Optional[torch.Tensor] = None
) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """The rows of ``scores`` [Q, C], ``rel`` [Q, C] bool and ``gains`` [Q, C] (optional) of the
    queries with at least one relevant candidate (no copy when every query has one)."""
    keep = rel.any(1)
    if bool(keep.all()):
        return scores, rel, gains
    return scores[keep], rel[keep], gains[keep] if gains is not None else None


def _t2i_relevance(
    scores_t2i: torch.Tensor,
    rel: torch.Tensor,
    graded: Optional[torch.Tensor],
    ks: Sequence[int],
    ndcg_ks: Sequence[int],
) -> dict[str, float]:
    """``img_rel_queries``, ``img_r{k}_rel``, ``img_r_precision``, ``img_map_at_r`` and
    ``img_ndcg{k}`` (``graded`` [Q, N_img] gains, or binary ones from ``rel`` [Q, N_img] bool) of
    the text queries ``scores_t2i`` [Q, N_img] that have a relevant image."""
    scores_t2i, rel, graded = _queries(scores_t2i, rel, graded)
    gains = graded if graded is not None else rel.float()
    out = {"img_rel_queries": float(len(rel))}
    out |= {f"img_r{k}_rel": v for k, v in recall_at(best_positive_rank(scores_t2i, rel), ks).items()}
    out["img_r_precision"] = r_precision(scores_t2i, rel)
    out["img_map_at_r"] = map_at_r(scores_t2i, rel)
    out |= {f"img_ndcg{k}": ndcg_at(scores_t2i, gains, k) for k in ndcg_ks}
    return out


def text_query_metrics(
    scores_t2i: torch.Tensor,
    txt2img: Sequence[int],
    relevant_images: Optional[Sequence[Sequence[int]]] = None,
    graded: Optional[torch.Tensor] = None,
    ks: Sequence[int] = KS,
    ndcg_ks: Sequence[int] = NDCG_KS,
) -> dict[str, float]:
    """The text->image metrics of :func:`retrieval_metrics` and :func:`relevance_metrics` (the
    keys starting ``img_``) for the query captions given: ``scores_t2i`` [Q, N_img], ``txt2img``
    [Q] their own images, ``relevant_images`` their relevance lists, ``graded`` [Q, N_img] gains.

    ``img_r{k}``, ``img_r_mean``; with the lists also ``img_rel_queries`` (a count),
    ``img_r{k}_rel``, ``img_r_precision``, ``img_map_at_r`` and ``img_ndcg{k}`` (``graded`` gains
    if given, else binary), over the queries with a non-empty list. All others in percent.
    """
    n_img = scores_t2i.shape[1]
    ir = recall_at(best_positive_rank(scores_t2i, positives_mask([[i] for i in txt2img], n_img)), ks)
    out = {f"img_r{k}": v for k, v in ir.items()}
    out["img_r_mean"] = sum(ir.values()) / len(ir)
    if relevant_images is not None:
        out |= _t2i_relevance(scores_t2i, positives_mask(relevant_images, n_img), graded, ks, ndcg_ks)
    return out


def grouped_text_metrics(
    scores_t2i: torch.Tensor,
    txt2img: Sequence[int],
    groups: Mapping[str, Sequence[int]],
    relevant_images: Optional[Sequence[Sequence[int]]] = None,
    graded: Optional[torch.Tensor] = None,
) -> dict[str, float]:
    """:func:`text_query_metrics` over each group of query captions (indices into the rows of
    ``scores_t2i`` [N_txt, N_img]), keyed ``<metric>@<group>`` (``img_r1@scene``,
    ``img_ndcg10@generic``), plus ``n_queries@<group>``. A query still ranks every image. Empty
    groups give only ``n_queries@<group>`` = 0.
    """
    out: dict[str, float] = {}
    for name, idx in groups.items():
        idx = list(idx)
        out[f"n_queries@{name}"] = float(len(idx))
        if not idx:
            continue
        rows = torch.tensor(idx, dtype=torch.long)
        m = text_query_metrics(
            scores_t2i[rows],
            [txt2img[q] for q in idx],
            [relevant_images[q] for q in idx] if relevant_images is not None else None,
            graded[rows] if graded is not None else None,
        )
        out |= {f"{key}@{name}": v for key, v in m.items()}
    return out


def chance_recall(n_candidates: int, n_positives: int, k: int) -> float:
    """Expected recall@k (%) of a random ranking with ``n_positives`` positives among ``n_candidates``."""
    p_miss = 1.0
    for j in range(min(k, n_candidates)):  # k >= n_candidates retrieves every candidate
        p_miss *= max(0.0, (n_candidates - n_positives - j) / (n_candidates - j))
    return 100.0 * (1.0 - p_miss)
