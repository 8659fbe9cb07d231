import pytest
import torch

from vlp.eval.metrics import (
    best_positive_rank,
    chance_recall,
    r_precision,
    relevance_metrics,
    retrieval_metrics,
)


def test_recall_hand_worked_example():
    # 3 images, 6 texts (2 per image: image i owns texts 2i, 2i+1).
    img2txt = [[0, 1], [2, 3], [4, 5]]
    txt2img = [0, 0, 1, 1, 2, 2]
    s_i2t = torch.tensor([
        [0.9, 0.1, 0.8, 0.2, 0.3, 0.0],  # image 0: best own text (0) ranked 1st -> rank 0
        [0.9, 0.8, 0.7, 0.1, 0.2, 0.3],  # image 1: best own text (2, 0.7) has 2 above -> rank 2
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.05],  # image 2: own texts 4 (0.5) is top -> rank 0
    ])
    s_t2i = torch.tensor([
        [0.9, 0.1, 0.0],  # rank 0
        [0.2, 0.3, 0.1],  # rank 1
        [0.5, 0.6, 0.7],  # own image 1 has 1 above -> rank 1
        [0.1, 0.9, 0.2],  # rank 0
        [0.3, 0.2, 0.1],  # own image 2 last -> rank 2
        [0.0, 0.0, 0.9],  # rank 0
    ])
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
    # image->text: image 0 rel {text 0}, image 1 {text 1}, image 2 {text 0}, image 3 {} (skipped in R-prec)
    assert m["txt_r1_rel"] == pytest.approx(50.0)  # images 0 and 2 hit; image 1 misses; image 3 never
    assert m["txt_r_precision"] == pytest.approx(100 * 2 / 3)


def test_chance_recall():
    assert chance_recall(1000, 1, 5) == pytest.approx(0.5)
    assert chance_recall(10, 10, 1) == pytest.approx(100.0)
    assert chance_recall(5000, 5, 1) == pytest.approx(0.1)
