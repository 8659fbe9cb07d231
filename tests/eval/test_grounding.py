"""Tests for the grounding box maths (vlp.eval.grounding) on hand-worked boxes and heat maps."""

from __future__ import annotations

import math

import pytest
import torch

from vlp.eval.grounding import (
    box_iou,
    box_scores,
    choose_box,
    fixed_position_prior,
    grounding_accuracy,
    paired_iou,
    prior_accuracy,
    random_candidate_accuracy,
)


def test_box_iou_hand_worked() -> None:
    a = [[0, 0, 10, 10], [2, 2, 4, 4]]
    b = [[5, 0, 10, 10], [0, 0, 10, 10], [10, 0, 10, 10], [20, 20, 5, 5], [0, 0, 10, 5]]
    iou = box_iou(a, b)
    assert iou.shape == (2, 5) and iou.dtype == torch.float64
    # half overlap: 50 / (100 + 100 - 50); identical; touching; disjoint; half of it
    assert iou[0].tolist() == pytest.approx([1 / 3, 1.0, 0.0, 0.0, 0.5])
    # [2,2,4,4] inside [0,0,10,10]: 16 / 100; with [5,0,10,10]: x 5..6, y 2..6 -> 4 / (16 + 100 - 4)
    assert iou[1].tolist() == pytest.approx([4 / 112, 0.16, 0.0, 0.0, 3 * 4 / (16 + 50 - 12)])
    assert paired_iou([[0, 0, 10, 10], [1.5, 0, 3, 2]], [[5, 0, 10, 10], [0, 0, 3, 2]]).tolist() == pytest.approx(
        [1 / 3, 3 / 9]  # x overlap 1.5 .. 3 = 1.5 * 2 = 3; union 6 + 6 - 3
    )
    with pytest.raises(ValueError, match="boxes"):
        box_iou([[0, 0, 1]], b)


def test_box_scores_sum_inside_over_sqrt_area() -> None:
    c = 0.25
    heat = torch.full((3, 3), c)  # a constant map upsamples to the same constant
    boxes = [
        [0, 0, 4, 9],  # 36 pixels: 36c / 6
        [2.7, 1.2, 3.5, 2.0],  # rows int(1.2)=1 .. int(3.2)-1=2, cols 2 .. int(6.2)-1=5: 8 pixels / sqrt(7)
        [8, 8, 5, 5],  # clipped to rows 8..9, cols 8..9: 4 pixels / 5
        [-2, 0, 4, 2],  # clipped to cols 0..1 (ALBEF's slice would wrap), rows 0..1: 4 pixels / sqrt(8)
        [20, 20, 3, 3],  # outside the image: 0
    ]
    scores = box_scores(heat, boxes, (10, 10))
    assert scores.dtype == torch.float32
    expected = [36 * c / 6, 8 * c / math.sqrt(7), 4 * c / 5, 4 * c / math.sqrt(8), 0.0]
    assert scores.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert box_scores(heat, boxes, (10, 10), alpha=1.0).tolist() == pytest.approx(
        [36 * c / 36, 8 * c / 7, 4 * c / 25, 4 * c / 8, 0.0], rel=1e-5, abs=1e-6
    )


def test_box_scores_on_a_full_resolution_map_and_the_choice() -> None:
    heat = torch.zeros(8, 8)  # same size as the image: upsampling is the identity
    heat[2:4, 5:7] = 1.0  # a hot 2x2 block at rows 2-3, columns 5-6
    tight, large, elsewhere = [5, 2, 2, 2], [3, 0, 4, 4], [0, 4, 4, 4]  # large covers the block
    scores = box_scores(heat, [large, tight, elsewhere], (8, 8))
    assert scores.tolist() == pytest.approx([4 / 4, 4 / 2, 0.0], abs=1e-6)
    assert choose_box(heat, [large, tight, elsewhere], (8, 8)) == 1  # the area term prefers the tight box
    assert choose_box(heat, [large, tight, elsewhere], (8, 8), alpha=0.0) == 0  # plain sums tie: the first


def test_box_scores_upsamples_a_patch_map_to_the_image() -> None:
    heat = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # the left patches are hot
    scores = box_scores(heat, [[0, 0, 20, 40], [20, 0, 20, 40]], (40, 40))
    assert scores[0] > 0.5 * 20 * 40 / math.sqrt(20 * 40) > scores[1]
    assert choose_box(heat, [[20, 0, 20, 40], [0, 0, 20, 40]], (40, 40)) == 1
    # non-square image: W = 60, H = 20; the map covers it all
    assert choose_box(heat, [[40, 0, 20, 20], [0, 0, 20, 20]], (60, 20)) == 1
    with pytest.raises(ValueError, match="width and height > 0"):
        box_scores(heat, [[0, 0, 0, 4]], (4, 4))


def test_grounding_accuracy_counts_iou_at_least_threshold() -> None:
    targets = [[0, 0, 10, 10]] * 4
    chosen = [[0, 0, 10, 5], [5, 0, 10, 10], [0, 0, 10, 10], [1, 1, 10, 10]]  # IoU .5, 1/3, 1, 81/119
    assert grounding_accuracy(chosen, targets) == pytest.approx(75.0)
    assert grounding_accuracy(chosen, targets, threshold=0.9) == pytest.approx(25.0)
    with pytest.raises(ValueError, match="same shape"):
        grounding_accuracy(chosen[:3], targets)


def test_random_candidate_accuracy() -> None:
    target0, target1 = [0, 0, 10, 10], [0, 0, 10, 10]
    cands0 = [[0, 0, 10, 10], [20, 0, 10, 10], [40, 0, 10, 10], [60, 0, 10, 10]]  # 1 hit of 4
    cands1 = [[0, 0, 10, 10], [0, 0, 10, 6]]  # IoU 1 and 0.6: both hits
    assert random_candidate_accuracy([cands0, cands1], [target0, target1]) == pytest.approx(62.5)
    with pytest.raises(ValueError, match="candidate lists"):
        random_candidate_accuracy([cands0], [target0, target1])


def test_fixed_position_prior_fits_on_train_and_scores_eval() -> None:
    left, right = [0, 40, 20, 20], [80, 40, 20, 20]  # centres (0.1, 0.5) and (0.9, 0.5) of 100 x 100
    cands = [[left, right]] * 3
    prior = fixed_position_prior(cands, [left, left, right], [(100, 100)] * 3, grid=2)
    # grid points (.25,.25) (.75,.25) (.25,.75) (.75,.75): x = .25 picks left (2 hits), x = .75 right (1 hit)
    assert prior.point == (0.25, 0.25)
    assert prior.train_accuracy == pytest.approx(200 / 3)
    wide = [[0, 0, 100, 100], [100, 0, 100, 100]]  # a 200 x 100 image: centres (.25, .5) and (.75, .5)
    acc = prior_accuracy(
        prior.point,
        [[left, right], [left, right], wide],
        [left, right, [100, 0, 100, 100]],
        [(100, 100), (100, 100), (200, 100)],
    )
    assert acc == pytest.approx(100 / 3)  # left: hit; right: miss; wide picks its left box: miss
    assert prior_accuracy((0.9, 0.5), [[left, right]], [right], [(100, 100)]) == 100.0
    # equidistant candidates: the first one
    assert prior_accuracy((0.5, 0.5), [[left, right]], [left], [(100, 100)]) == 100.0
    with pytest.raises(ValueError, match="image sizes"):
        prior_accuracy((0.5, 0.5), [[left, right]], [left], [])
