"""ECCV Caption's metrics (mAP@R, R-Precision, R@1), both directions, against hand computations.

Definitions (Chun et al. 2022, "ECCV Caption"; mAP@R from Musgrave et al. 2020), for a query with
R relevant candidates and rel(i) = 1 when the candidate at rank i is relevant:
  mAP@R = (1/R) * sum_{i=1..R} P(i) * rel(i),  P(i) = (1/i) * sum_{j<=i} rel(j)
  R-P   = (1/R) * sum_{i=1..R} rel(i)
  R@1   = rel(1)
each averaged over the queries the benchmark annotated (a non-empty list).
"""

import random

import pytest
import torch

from vlp.eval.metrics import map_at_r, r_precision, relevance_metrics

# 3 images x 4 texts. Rows of S_I2T are images, columns texts; S_T2I the other way.
S_I2T = torch.tensor(
    [
        [0.8, 0.2, 0.9, 0.1],  # image 0 ranks texts 2, 0, 1, 3
        [0.1, 0.9, 0.8, 0.7],  # image 1 ranks texts 1, 2, 3, 0
        [0.4, 0.1, 0.2, 0.3],  # image 2: no query (empty list)
    ]
)
S_T2I = torch.tensor(
    [
        [0.5, 0.6, 0.1],  # text 0 ranks images 1, 0, 2
        [0.3, 0.9, 0.8],  # text 1 ranks images 1, 2, 0
        [0.9, 0.1, 0.1],  # text 2: no query (empty list)
        [0.2, 0.7, 0.2],  # text 3 ranks image 1, then images 0 and 2 tied
    ]
)
# image->text positives given on their own: NOT the transpose of RELEVANT_IMAGES (as in ECCV Caption)
RELEVANT_TEXTS = [[0, 1], [0, 1, 3], []]
RELEVANT_IMAGES = [[0], [0, 2], [], [1, 2]]


def test_image_to_text_by_hand():
    # image 0: R = 2 {t0, t1}; ranking t2, t0 -> rel = 0, 1 in the top R
    #   AP@R = (1/2) * (P(1)*0 + P(2)*1) = (1/2) * (1/2) = 0.25;  R-P = 1/2;  R@1 = 0
    # image 1: R = 3 {t0, t1, t3}; ranking t1, t2, t3 (t0 at rank 4, beyond R) -> rel = 1, 0, 1
    #   AP@R = (1/3) * (1 + 0 + (2/3)*1) = 5/9;  R-P = 2/3;  R@1 = 1
    # image 2: no positives -> not a query
    # mAP@R = (0.25 + 5/9) / 2 = 29/72;  R-P = (1/2 + 2/3) / 2 = 7/12;  R@1 = 1/2
    m = relevance_metrics(S_I2T, S_T2I, RELEVANT_IMAGES, ks=(1,), relevant_texts=RELEVANT_TEXTS)
    assert m["txt_rel_queries"] == 2
    assert m["txt_map_at_r"] == pytest.approx(100 * 29 / 72)
    assert m["txt_r_precision"] == pytest.approx(100 * 7 / 12)
    assert m["txt_r1_rel"] == pytest.approx(50.0)


def test_text_to_image_by_hand_ties_count_against_the_query():
    # text 0: R = 1 {i0}; ranking i1 -> rel = 0:  AP@R = 0, R-P = 0, R@1 = 0
    # text 1: R = 2 {i0, i2}; ranking i1, i2 -> rel = 0, 1:  AP@R = (1/2)(0 + 1/2) = 1/4, R-P = 1/2, R@1 = 0
    # text 2: no positives -> not a query
    # text 3: R = 2 {i1, i2}; i1 first, then i0 (irrelevant) and i2 (relevant) tie at 0.2: the tie
    #   goes against the query, so i0 ranks 2nd -> rel = 1, 0:  AP@R = (1/2)(1 + 0) = 1/2, R-P = 1/2, R@1 = 1
    # mAP@R = (0 + 1/4 + 1/2) / 3 = 1/4;  R-P = (0 + 1/2 + 1/2) / 3 = 1/3;  R@1 = 1/3
    m = relevance_metrics(S_I2T, S_T2I, RELEVANT_IMAGES, ks=(1,), relevant_texts=RELEVANT_TEXTS)
    assert m["img_rel_queries"] == 3
    assert m["img_map_at_r"] == pytest.approx(25.0)
    assert m["img_r_precision"] == pytest.approx(100 / 3)
    assert m["img_r1_rel"] == pytest.approx(100 / 3)


def test_without_relevant_texts_image_to_text_is_the_transpose():
    # transpose of RELEVANT_IMAGES: image 0 {t0, t1}, image 1 {t3}, image 2 {t1, t3}
    # image 0: as above, AP@R = 1/4.  image 1: R = 1, ranking t1 -> 0.  image 2: R = 2, ranking t0, t3 ->
    # rel = 0, 1: AP@R = 1/4.  mAP@R = (1/4 + 0 + 1/4) / 3 = 1/6
    m = relevance_metrics(S_I2T, S_T2I, RELEVANT_IMAGES)
    assert m["txt_rel_queries"] == 3
    assert m["txt_map_at_r"] == pytest.approx(100 / 6)


def test_map_at_r_counts_only_the_top_r():
    # R = 2 {c1, c3}; ranking c0, c1, c2, c3: rel = 0, 1 in the top 2 (c3 at rank 4 does not count)
    # AP@R = (1/2)(0 + 1/2) = 1/4. A perfect ranking gives 1; no relevant candidate: skipped (NaN alone)
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6]])
    assert map_at_r(scores, torch.tensor([[False, True, False, True]])) == pytest.approx(25.0)
    assert map_at_r(scores, torch.tensor([[True, True, False, False]])) == pytest.approx(100.0)
    assert torch.isnan(torch.tensor(map_at_r(scores, torch.zeros(1, 4, dtype=torch.bool))))


def _eccv_reference(ranked: list[list[int]], positives: list[set[int]]) -> tuple[float, float, float]:
    """The definitions above on ranked id lists (no ties), one query at a time."""
    maps, rps, r1s = [], [], []
    for order, pos in zip(ranked, positives):
        if not pos:
            continue
        r = len(pos)
        hits = [order[i] in pos for i in range(r)]
        maps.append(sum(sum(hits[: i + 1]) / (i + 1) for i in range(r) if hits[i]) / r)
        rps.append(sum(hits) / r)
        r1s.append(float(order[0] in pos))
    return tuple(100 * sum(v) / len(v) for v in (maps, rps, r1s))  # type: ignore[return-value]


def test_random_scores_match_the_definitions_on_ranked_lists():
    rng = random.Random(0)
    n_img, n_txt = 7, 19
    s_i2t = torch.rand(n_img, n_txt, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    s_t2i = torch.rand(n_txt, n_img, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    rel_img = [sorted(rng.sample(range(n_img), rng.randint(0, 4))) for _ in range(n_txt)]
    rel_txt = [sorted(rng.sample(range(n_txt), rng.randint(0, 8))) for _ in range(n_img)]
    m = relevance_metrics(s_i2t, s_t2i, rel_img, relevant_texts=rel_txt)
    for scores, rel, key in ((s_i2t, rel_txt, "txt"), (s_t2i, rel_img, "img")):
        ranked = [sorted(range(scores.shape[1]), key=lambda c, q=q: -scores[q, c].item()) for q in range(len(rel))]
        want = _eccv_reference(ranked, [set(r) for r in rel])
        assert (m[f"{key}_map_at_r"], m[f"{key}_r_precision"], m[f"{key}_r1_rel"]) == pytest.approx(want)
        assert m[f"{key}_rel_queries"] == sum(1 for r in rel if r)
    mask = torch.zeros(n_img, n_txt, dtype=torch.bool)
    for i, r in enumerate(rel_txt):
        mask[i, r] = True
    assert r_precision(s_i2t, mask) == pytest.approx(m["txt_r_precision"])  # the existing R-precision, reused
