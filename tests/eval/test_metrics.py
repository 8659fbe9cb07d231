import math

import pytest
import torch

from vlp.eval.metrics import (
    best_positive_rank,
    chance_recall,
    grouped_text_metrics,
    map_at,
    ndcg_at,
    r_precision,
    rank_order,
    relevance_metrics,
    retrieval_metrics,
    text_query_metrics,
)


def test_recall_hand_worked_example():
    # 3 images, 6 texts (2 per image: image i owns texts 2i, 2i+1).
    img2txt = [[0, 1], [2, 3], [4, 5]]
    txt2img = [0, 0, 1, 1, 2, 2]
    s_i2t = torch.tensor(
        [
            [0.9, 0.1, 0.8, 0.2, 0.3, 0.0],  # image 0: best own text (0) ranked 1st -> rank 0
            [0.9, 0.8, 0.7, 0.1, 0.2, 0.3],  # image 1: best own text (2, 0.7) has 2 above -> rank 2
            [0.1, 0.2, 0.3, 0.4, 0.5, 0.05],  # image 2: own texts 4 (0.5) is top -> rank 0
        ]
    )
    s_t2i = torch.tensor(
        [
            [0.9, 0.1, 0.0],  # rank 0
            [0.2, 0.3, 0.1],  # rank 1
            [0.5, 0.6, 0.7],  # own image 1 has 1 above -> rank 1
            [0.1, 0.9, 0.2],  # rank 0
            [0.3, 0.2, 0.1],  # own image 2 last -> rank 2
            [0.0, 0.0, 0.9],  # rank 0
        ]
    )
    m = retrieval_metrics(s_i2t, s_t2i, img2txt, txt2img)
    assert m["txt_r1"] == pytest.approx(200 / 3)
    assert m["txt_r5"] == pytest.approx(100.0)
    assert m["img_r1"] == pytest.approx(50.0)
    assert m["img_r5"] == pytest.approx(100.0)
    assert m["txt_r_mean"] == pytest.approx((200 / 3 + 100 + 100) / 3)
    assert m["img_r_mean"] == pytest.approx((50 + 100 + 100) / 3)
    assert m["r_mean"] == pytest.approx((m["txt_r_mean"] + m["img_r_mean"]) / 2)
    assert m["rsum"] == pytest.approx(200 / 3 + 100 + 100 + 50 + 100 + 100)


def test_ties_count_against_the_query():
    scores = torch.zeros(4, 10)  # constant scores: no information
    pos = torch.zeros(4, 10, dtype=torch.bool)
    pos[torch.arange(4), torch.arange(4)] = True
    assert (best_positive_rank(scores, pos) == 9).all()


def test_r_precision_and_relevance_recall():
    # 2 texts x 4 images. text 0 relevant {0, 2}; text 1 relevant {1}.
    s_t2i = torch.tensor([[0.9, 0.8, 0.7, 0.1], [0.5, 0.4, 0.3, 0.2]])
    rel = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0]], dtype=torch.bool)
    # text 0: top-2 = {0, 1}: 1 of 2 relevant -> 0.5; text 1: top-1 = {0}: 0 -> mean 25%
    assert r_precision(s_t2i, rel) == pytest.approx(25.0)
    s_i2t = s_t2i.T.contiguous()
    m = relevance_metrics(s_i2t, s_t2i, [[0, 2], [1]], ks=(1, 2))
    assert m["img_r1_rel"] == pytest.approx(50.0)  # text 0 hit at 1; text 1 misses (image 0 above)
    assert m["img_r2_rel"] == pytest.approx(100.0)
    # image->text: image 0 rel {text 0}, image 1 {text 1}, image 2 {text 0}, image 3 {}: image 3 is no
    # query (nothing relevant to find), so every relevance-aware metric averages over images 0-2
    assert m["txt_rel_queries"] == 3 and m["img_rel_queries"] == 2
    assert m["txt_r1_rel"] == pytest.approx(100 * 2 / 3)  # images 0 and 2 hit; image 1 misses
    assert m["txt_r_precision"] == pytest.approx(100 * 2 / 3)


def test_chance_recall():
    assert chance_recall(1000, 1, 5) == pytest.approx(0.5)


def test_chance_recall_with_k_beyond_the_candidates_is_certain():
    # k = 10 over 8 candidates retrieves them all (a tiny test split used to divide by zero)
    assert chance_recall(8, 1, 10) == 100.0 and chance_recall(8, 1, 8) == 100.0
    assert chance_recall(8, 1, 7) == pytest.approx(100.0 * 7 / 8)
    assert chance_recall(10, 10, 1) == pytest.approx(100.0)
    assert chance_recall(5000, 5, 1) == pytest.approx(0.1)


def test_r_precision_hand_worked_with_three_relevant():
    # 1 query, 6 candidates ranked in index order (scores descending); relevant {0, 2, 5}, R = 3.
    # top 3 = {0, 1, 2}: 2 relevant -> 2/3.
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4]])
    rel = torch.tensor([[1, 0, 1, 0, 0, 1]], dtype=torch.bool)
    assert r_precision(scores, rel) == pytest.approx(100 * 2 / 3)


def test_rank_order_breaks_ties_against_the_query():
    scores = torch.tensor([[0.5, 0.5, 0.9, 0.5]])
    gains = torch.tensor([[2.0, 0.0, 1.0, 1.0]])
    # 0.9 first; among the tied 0.5s the least relevant first: gain 0 (idx 1), 1 (idx 3), 2 (idx 0)
    assert rank_order(scores, gains).tolist() == [[2, 1, 3, 0]]


def test_ndcg_hand_worked():
    # Query 0 ranks the candidates in index order, query 1 in reverse; both have gains [3, 2, 0, 1].
    # Query 2 has no positive gain and is skipped.
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6], [0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]])
    gains = torch.tensor([[3.0, 2.0, 0.0, 1.0], [3.0, 2.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    # Discounts 1/log2(r + 1), r = 1..4: 1, 0.6309298, 0.5, 0.4306766.
    # IDCG@4 (gains sorted 3, 2, 1, 0) = 3 + 2*0.6309298 + 1*0.5 + 0 = 4.7618595
    # query 0: ranked gains 3, 2, 0, 1 -> DCG@4 = 3 + 1.2618595 + 0 + 0.4306766 = 4.6925361 -> 0.9854419
    # query 1: ranked gains 1, 0, 2, 3 -> DCG@4 = 1 + 0 + 2*0.5 + 3*0.4306766 = 3.2920297 -> 0.6913328
    assert ndcg_at(scores[:1], gains[:1], 4) == pytest.approx(98.54419, abs=1e-4)
    assert ndcg_at(scores[1:2], gains[1:2], 4) == pytest.approx(69.13328, abs=1e-4)
    assert ndcg_at(scores, gains, 4) == pytest.approx((98.54419 + 69.13328) / 2, abs=1e-4)
    # k = 2: query 0 ranks 3, 2 = the ideal -> 1; query 1: DCG@2 = 1, IDCG@2 = 3 + 1.2618595 -> 0.2346395
    assert ndcg_at(scores[:2], gains[:2], 2) == pytest.approx(100 * (1 + 1 / (3 + 2 / math.log2(3))) / 2, abs=1e-4)
    # k larger than the number of candidates = k = C
    assert ndcg_at(scores, gains, 25) == ndcg_at(scores, gains, 4)


def test_ndcg_ties_count_against_the_query():
    # constant scores: the irrelevant candidate ranks first -> DCG = 1/log2(3) = 0.6309298, IDCG = 1
    assert ndcg_at(torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), 2) == pytest.approx(63.09298, abs=1e-4)
    assert ndcg_at(torch.zeros(1, 2), torch.tensor([[0.0, 1.0]]), 2) == pytest.approx(63.09298, abs=1e-4)
    assert r_precision(torch.zeros(1, 3), torch.tensor([[True, False, False]])) == 0.0


def test_map_hand_worked():
    # Query 0: candidates ranked in index order, relevant at ranks 1, 3 and 6 (R = 3).
    # Query 1: relevant only at rank 2 (R = 1). Query 2: nothing relevant, skipped.
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4]]).repeat(3, 1)
    rel = torch.tensor([[1, 0, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    # k = 5, query 0: hits at ranks 1 and 3: P@1 = 1, P@3 = 2/3 -> (1 + 2/3) / min(3, 5) = 5/9
    #   (the ECIR code divides by the 2 hits found instead: 5/6)
    # k = 5, query 1: P@2 = 1/2 -> 1/2 / min(1, 5) = 1/2.   mean = (5/9 + 1/2) / 2 = 19/36
    assert map_at(scores, rel, 5) == pytest.approx(100 * 19 / 36)
    # k = 2, query 0: hit at rank 1 only: 1 / min(3, 2) = 1/2; query 1: (1/2) / 1 -> mean 1/2
    assert map_at(scores, rel, 2) == pytest.approx(50.0)
    # the top min(R, k) all relevant -> 100%
    assert map_at(torch.tensor([[3.0, 2.0, 1.0]]), torch.tensor([[True, True, False]]), 1) == pytest.approx(100.0)
    # ties against the query: the tied negative ranks first -> P@2 = 1/2
    assert map_at(torch.zeros(1, 2), torch.tensor([[True, False]]), 5) == pytest.approx(50.0)


def test_relevance_metrics_new_keys_binary_and_graded():
    torch.manual_seed(0)
    s_t2i = torch.randn(6, 4)
    s_i2t = s_t2i.T.contiguous()
    lists = [[0], [0, 1], [1], [2, 3], [2], [3]]
    rel = torch.zeros(6, 4, dtype=torch.bool)
    for t, lst in enumerate(lists):
        rel[t, lst] = True
    m = relevance_metrics(s_i2t, s_t2i, lists)
    assert set(m) == {
        "img_r1_rel",
        "img_r5_rel",
        "img_r10_rel",
        "txt_r1_rel",
        "txt_r5_rel",
        "txt_r10_rel",
        "img_r_precision",
        "txt_r_precision",
        "img_map_at_r",
        "txt_map_at_r",
        "img_rel_queries",
        "txt_rel_queries",
        "img_ndcg10",
        "img_ndcg25",
        "txt_map5",
        "txt_map10",
        "txt_map5_ecir",
        "txt_map10_ecir",
    }
    assert m["txt_map10_ecir"] == pytest.approx(map_at(s_i2t, rel.T, 10, definition="ecir"))
    assert m["img_ndcg10"] == pytest.approx(ndcg_at(s_t2i, rel.float(), 10))  # binary gains from the lists
    assert m["txt_map5"] == pytest.approx(map_at(s_i2t, rel.T, 5))
    graded = rel.float() + 0.3 * (~rel).float()
    mg = relevance_metrics(s_i2t, s_t2i, lists, graded=graded)
    assert mg["img_ndcg25"] == pytest.approx(ndcg_at(s_t2i, graded, 25)) and mg["img_ndcg25"] != m["img_ndcg25"]
    assert {k: v for k, v in mg.items() if "ndcg" not in k} == {k: v for k, v in m.items() if "ndcg" not in k}
    with pytest.raises(ValueError, match=r"shape \(4, 6\), expected \(6, 4\)"):
        relevance_metrics(s_i2t, s_t2i, lists, graded=graded.T)


def test_metrics_computed_in_row_blocks_equal_whole_matrix(monkeypatch):
    """The per-query metrics run over blocks of query rows (no full-size temporary at COCO size);
    blocks of a few rows give exactly the whole-matrix numbers, ties included."""
    import vlp.eval.metrics as metrics

    g = torch.Generator().manual_seed(0)
    n_img, n_txt = 9, 23
    i2t = torch.randint(0, 6, (n_img, n_txt), generator=g).double()  # many ties
    t2i = torch.randint(0, 6, (n_txt, n_img), generator=g).double()
    txt2img = [t % n_img for t in range(n_txt)]
    img2txt = [[t for t in range(n_txt) if t % n_img == i] for i in range(n_img)]
    relevant = [[i for i in range(n_img) if (t + i) % 3 == 0 or i == t % n_img] for t in range(n_txt)]
    graded = torch.rand(n_txt, n_img, generator=g) * positives_mask_of(relevant, n_img)
    whole = {**retrieval_metrics(i2t, t2i, img2txt, txt2img), **relevance_metrics(i2t, t2i, relevant, graded=graded)}
    for chunk in (1, 7, 30):
        monkeypatch.setattr(metrics, "CHUNK", chunk)
        got = {**retrieval_metrics(i2t, t2i, img2txt, txt2img), **relevance_metrics(i2t, t2i, relevant, graded=graded)}
        assert got == whole, chunk


def positives_mask_of(groups, n):
    from vlp.eval.metrics import positives_mask

    return positives_mask(groups, n).float()


def test_map_ecir_definition_hand_worked():
    # Candidates ranked in index order. Relevant: q0 at ranks 1, 3, 6 (R = 3); q1 at rank 2 (R = 1);
    # q2 only at rank 6 (R = 1); q3 none (skipped by both definitions).
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4]]).repeat(4, 1)
    rel = torch.tensor(
        [[1, 0, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0]], dtype=torch.bool
    )
    # k = 5. q0: hits at ranks 1, 3: sum P@r = 1 + 2/3 = 5/3; vlp / min(R, k) = 3 -> 5/9, ecir / H = 2 -> 5/6
    #        q1: P@2 = 1/2 over 1 -> 1/2 both.  q2: no hit in the top 5 -> 0 both (ecir: H = 0 -> 0)
    assert map_at(scores, rel, 5) == pytest.approx(100 * (5 / 9 + 1 / 2 + 0) / 3)  # 19/54
    assert map_at(scores, rel, 5, definition="ecir") == pytest.approx(100 * (5 / 6 + 1 / 2 + 0) / 3)  # 4/9
    # k = 2. q0: hit at rank 1 only: vlp 1 / min(3, 2) = 1/2, ecir 1 / 1 = 1; q1: 1/2 both; q2: 0 both
    assert map_at(scores, rel, 2) == pytest.approx(100 / 3)
    assert map_at(scores, rel, 2, definition="ecir") == pytest.approx(50.0)
    # ties against the query hold for both: the tied negative ranks first -> P@2 = 1/2 over 1 hit
    assert map_at(torch.zeros(1, 2), torch.tensor([[True, False]]), 5, definition="ecir") == pytest.approx(50.0)
    with pytest.raises(ValueError, match="unknown mAP definition 'trec'"):
        map_at(scores, rel, 5, definition="trec")


def _grouped_case():
    """8 captions (2 per image) ranking 4 images, ties included; relevance lists and graded gains."""
    g = torch.Generator().manual_seed(3)
    t2i = torch.randint(0, 5, (8, 4), generator=g).double()
    txt2img = [t // 2 for t in range(8)]
    relevant = [sorted({t // 2, (t + 1) % 4}) if t % 3 else [t // 2] for t in range(8)]
    graded = torch.rand(8, 4, generator=g) * 0.9
    for t, lst in enumerate(relevant):
        graded[t, lst] = 1.0
    return t2i, txt2img, relevant, graded


def test_grouped_text_metrics_equal_the_metrics_of_the_sliced_matrix():
    t2i, txt2img, relevant, graded = _grouped_case()
    groups = {"even": [0, 2, 4, 6], "tail": [5, 6, 7], "all": list(range(8)), "none": []}
    out = grouped_text_metrics(t2i, txt2img, groups, relevant, graded)
    for name, idx in groups.items():
        assert out[f"n_queries@{name}"] == len(idx)
        if not idx:
            assert not [k for k in out if k.endswith("@none") and not k.startswith("n_queries")]
            continue
        sub = t2i[idx]  # the group's queries against every image
        img2txt = [[k for k, q in enumerate(idx) if txt2img[q] == i] for i in range(4)]
        sub_txt2img = [txt2img[q] for q in idx]
        full = {
            **retrieval_metrics(sub.T.contiguous(), sub, img2txt, sub_txt2img),
            **relevance_metrics(sub.T.contiguous(), sub, [relevant[q] for q in idx], graded=graded[idx]),
        }
        expected = {k: v for k, v in full.items() if k.startswith("img_")}
        assert {k[: -len(name) - 1]: v for k, v in out.items() if k.endswith(f"@{name}") and k.startswith("img_")} == (
            expected
        )
    # the whole set of queries gives the ungrouped numbers
    assert out["img_r_precision@all"] == relevance_metrics(t2i.T, t2i, relevant)["img_r_precision"]
    assert out["img_r1@all"] == retrieval_metrics(t2i.T, t2i, [[2 * i, 2 * i + 1] for i in range(4)], txt2img)["img_r1"]


def test_text_query_metrics_hand_worked():
    # 3 captions, 3 images. c0 (own image 0): image 0 ranked first; c1 (own 1): image 1 third;
    # c2 (own 2, relevant {1, 2}): image 1 first, image 2 second.
    t2i = torch.tensor([[0.9, 0.5, 0.1], [0.9, 0.1, 0.5], [0.1, 0.9, 0.5]])
    m = text_query_metrics(t2i, [0, 1, 2], [[0], [1], [1, 2]], ks=(1, 2))
    assert (m["img_r1"], m["img_r2"]) == pytest.approx((100 / 3, 200 / 3))
    assert (m["img_r1_rel"], m["img_r2_rel"]) == pytest.approx((200 / 3, 200 / 3))
    assert m["img_r_precision"] == pytest.approx(100 * (1 + 0 + 1) / 3)
    groups = grouped_text_metrics(t2i, [0, 1, 2], {"a": [0, 2], "b": [1]}, [[0], [1], [1, 2]])
    assert (groups["img_r1@a"], groups["img_r1@b"]) == (50.0, 0.0)
    assert (groups["img_r1_rel@a"], groups["img_r_precision@b"]) == (100.0, 0.0)
    assert "img_r1_rel@a" not in grouped_text_metrics(t2i, [0, 1, 2], {"a": [0, 2]})  # no lists: recall only
