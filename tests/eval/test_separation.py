import pytest
import torch

from vlp.eval.separation import roc_auc


def test_auc_with_ties_by_hand():
    # positives 0.9, 0.5, 0.3; negatives 0.5, 0.5, 0.1. Pairs (positive, negative):
    # 0.9 beats all three -> 3; 0.5 ties 0.5 twice (1/2 each) and beats 0.1 -> 2; 0.3 beats 0.1 -> 1.
    # AUC = (3 + 2 + 1) / 9 = 2/3
    scores = torch.tensor([0.9, 0.5, 0.5, 0.3, 0.5, 0.1])
    labels = torch.tensor([True, True, False, True, False, False])
    assert roc_auc(scores, labels) == pytest.approx(2 / 3, abs=1e-12)


def test_auc_extremes_and_all_ties():
    labels = torch.tensor([True, True, False, False, False])
    assert roc_auc(torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0]), labels) == 1.0
    assert roc_auc(torch.tensor([-3.0, -2.0, 1.0, 0.0, 5.0]), labels) == 0.0
    assert roc_auc(torch.ones(5), labels) == 0.5


def test_auc_matches_brute_force_on_random_scores_with_ties():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 7, (300,), generator=g).float()  # many ties
    labels = torch.rand(300, generator=g) < 0.3
    pos, neg = scores[labels], scores[~labels]
    diff = pos[:, None] - neg[None, :]
    brute = float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())
    assert roc_auc(scores, labels) == pytest.approx(brute, abs=1e-12)


def test_auc_needs_both_groups_and_matching_shapes():
    with pytest.raises(ValueError, match="both groups"):
        roc_auc(torch.tensor([1.0, 2.0]), torch.tensor([True, True]))
    with pytest.raises(ValueError, match="same size"):
        roc_auc(torch.tensor([1.0, 2.0]), torch.tensor([True, False, False]))
