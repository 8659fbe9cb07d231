"""Zero-shot classification on tensors (vlp.eval.classification): prompt ensembles, metrics on a
hand-worked score matrix, and the ITM re-rank on a constructed case."""

from __future__ import annotations

import math

import pytest
import torch

from vlp.eval.classification import classification_metrics, itm_rerank, predicted_classes, prompt_ensemble


def test_prompt_ensemble_normalises_each_prompt_then_the_class_mean() -> None:
    # class-major rows: class 0's two templates, then class 1's; lengths differ on purpose
    feats = torch.tensor(
        [
            [3.0, 0.0],  # class 0, template 0 -> (1, 0)
            [0.0, 0.5],  # class 0, template 1 -> (0, 1)
            [0.0, -2.0],  # class 1, template 0 -> (0, -1)
            [4.0, 0.0],  # class 1, template 1 -> (1, 0)
        ]
    )
    out = prompt_ensemble(feats, n_classes=2, n_templates=2)
    s = 1 / math.sqrt(2)
    # mean of unit vectors (0.5, 0.5) and (0.5, -0.5), normalised; an unnormalised mean would give
    # (1.5, 0.25) and (2, -1) instead
    torch.testing.assert_close(out, torch.tensor([[s, s], [s, -s]]))
    assert out.dtype == torch.float32


def test_prompt_ensemble_rejects_a_wrong_row_count() -> None:
    with pytest.raises(ValueError, match="5 prompt features for 2 classes x 2 templates"):
        prompt_ensemble(torch.ones(5, 3), 2, 2)


def test_prompt_ensemble_with_one_template_is_the_normalised_features() -> None:
    feats = torch.tensor([[0.0, 2.0], [3.0, 4.0]])
    torch.testing.assert_close(prompt_ensemble(feats, 2, 1), torch.tensor([[0.0, 1.0], [0.6, 0.8]]))


# 4 images x 3 classes, worked by hand:
#   image 0 (true 0): 0.9 0.1 0.0 -> pred 0, true class at rank 0
#   image 1 (true 1): 0.5 0.2 0.3 -> pred 0, true class at rank 2
#   image 2 (true 2): 0.1 0.2 0.7 -> pred 2, rank 0
#   image 3 (true 2): 0.4 0.4 0.4 -> all tied: ties count against the true class -> pred 0, rank 2
SCORES = torch.tensor([[0.9, 0.1, 0.0], [0.5, 0.2, 0.3], [0.1, 0.2, 0.7], [0.4, 0.4, 0.4]])
LABELS = torch.tensor([0, 1, 2, 2])


def test_metrics_on_a_hand_worked_matrix() -> None:
    m = classification_metrics(SCORES, LABELS)
    assert m["top1"] == pytest.approx(50.0)  # images 0 and 2
    assert m["top5_k"] == 3 and m["top5"] == pytest.approx(100.0)  # k = min(5, 3): every class
    assert m["per_class"] == pytest.approx([100.0, 0.0, 50.0])
    assert m["mean_per_class"] == pytest.approx(50.0)
    assert m["per_class_n"] == [1, 1, 2]
    assert m["confusion"] == [[1, 0, 0], [1, 0, 0], [1, 0, 1]]
    assert m["n"] == 4


def test_top_k_counts_ties_against_the_true_class() -> None:
    scores = torch.tensor([[0.2, 0.5, 0.5, 0.9, 0.1, 0.0, 0.0]])
    assert classification_metrics(scores, torch.tensor([1]))["top5"] == 100.0  # rank 2 (0.5 tie, 0.9)
    assert classification_metrics(scores, torch.tensor([1]))["top1"] == 0.0
    # the true class 5 ties with class 6 at the lowest score: rank 6 (everything else scores >=)
    assert classification_metrics(scores, torch.tensor([5]))["top5"] == 0.0


def test_a_class_without_images_is_none_and_left_out_of_the_mean() -> None:
    m = classification_metrics(torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]), torch.tensor([0, 0]))
    assert m["per_class"] == [50.0, None, None]
    assert m["mean_per_class"] == 50.0


def test_predicted_classes_break_ties_against_the_true_class_then_by_index() -> None:
    scores = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 2.0, 2.0], [3.0, 0.0, 0.0]])
    assert predicted_classes(scores, torch.tensor([0, 0, 2, 0])).tolist() == [1, 1, 1, 0]


def test_itm_rerank_reorders_the_top_k_above_the_rest() -> None:
    itc = torch.tensor([[0.9, 0.8, 0.7, 0.1, 0.0], [0.1, 0.2, 0.3, 0.4, 0.5]])
    top = torch.tensor([[0, 1, 2], [4, 3, 2]])  # ITC top 3 of each row
    itm = torch.tensor([[0.1, 0.2, 0.9], [0.5, 0.5, 0.2]])  # row 1: a tie, broken by ITC (class 4 first)
    out = itm_rerank(itc, itm, top)
    assert out.argsort(1, descending=True).tolist() == [[2, 1, 0, 3, 4], [4, 3, 2, 1, 0]]
    # re-ranked classes are lifted to max(itc) + k - place; the others keep their ITC score
    assert out[0].tolist() == pytest.approx([1.9, 2.9, 3.9, 0.1, 0.0])
    assert out[1, :2].tolist() == pytest.approx([0.1, 0.2])
    # top-1 after the re-rank: row 0's true class 2 now first
    assert classification_metrics(out, torch.tensor([2, 4]))["top1"] == 100.0
    assert classification_metrics(itc, torch.tensor([2, 4]))["top1"] == 50.0


def test_itm_rerank_ties_in_itm_and_itc_go_to_the_lower_class_index() -> None:
    itc = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    itm = torch.tensor([[0.7, 0.7, 0.7]])
    out = itm_rerank(itc, itm, torch.tensor([[2, 0, 1]]))  # top-k given in any order
    assert out[0].tolist() == pytest.approx([3.5, 2.5, 1.5, 0.0])


def test_itm_rerank_only_permutes_the_top_k() -> None:
    g = torch.Generator().manual_seed(0)
    itc = torch.rand(6, 8, generator=g)
    top = itc.topk(3, dim=1).indices
    out = itm_rerank(itc, torch.rand(6, 3, generator=g), top)
    assert torch.equal(out.topk(3, dim=1).indices.sort(1).values, top.sort(1).values)
    rest = torch.ones_like(itc, dtype=torch.bool).scatter_(1, top, False)
    assert torch.equal(out[rest], itc[rest])


def test_itm_rerank_checks_shapes() -> None:
    with pytest.raises(ValueError, match="itm_rerank"):
        itm_rerank(torch.zeros(2, 4), torch.zeros(2, 2), torch.zeros(2, 3, dtype=torch.long))
