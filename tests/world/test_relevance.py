"""Tests for exact and graded relevance in the shapes world (vlp.world.relevance)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.world.conftest import BLUE_SQUARE, RED_CIRCLE, THREE_CIRCLES, TWO, _rel, _sample_scenes
from vlp.world.captions import make_captions
from vlp.world.predicates import CountPred, ObjectPred, ScenePred, caption_matches
from vlp.world.relevance import SceneTable, caption_grade, compute_graded_relevance
from vlp.world.scene import SHAPES, Desc, Obj, Scene


def test_vectorised_table_agrees_with_reference() -> None:
    scenes = _sample_scenes(150, seed=11)
    rng = random.Random(5)
    preds = [p for s in _sample_scenes(60, seed=12) for _, p in make_captions(s, rng)]
    # also predicates that are false of their source scene
    preds += [CountPred(n, Desc(shape=sh)).to_dict() for n in range(5) for sh in SHAPES]
    table = SceneTable(scenes)
    for p in preds:
        expect = np.array([caption_matches(p, s) for s in scenes])
        assert (table.matches(p) == expect).all(), p


# ---------------------------------------------------------------- graded relevance


def test_graded_scene_captions() -> None:
    pred = ScenePred((RED_CIRCLE, BLUE_SQUARE)).to_dict()
    assert caption_grade(pred, TWO) == 1.0  # true of the image
    # the circle is green instead of red: facts = 4 per object + 1 object count = 9;
    # circle 3/4 (shape, size, cell) + square 4/4 + count 1 -> 8/9
    wrong_colour = Scene((Obj("circle", "green", "large", 1, 0), BLUE_SQUARE))
    assert caption_grade(pred, wrong_colour) == pytest.approx(8 / 9)
    # one extra object: every object fact holds, count credit min(3, 2)/max(3, 2) -> (8 + 2/3) / 9
    extra = Scene((Obj("triangle", "green", "small", 0, 0), RED_CIRCLE, BLUE_SQUARE))
    assert caption_grade(pred, extra) == pytest.approx((8 + 2 / 3) / 9)
    # unrelated: a small yellow triangle at the top left pairs best with the small blue square
    # (size only: 1 fact), the circle pairs with nothing; count 1 of 2 -> (1 + 1/2) / 9 = 1/6
    unrelated = Scene((Obj("triangle", "yellow", "small", 0, 0),))
    assert caption_grade(pred, unrelated) == pytest.approx(1 / 6)
    assert caption_grade(pred, unrelated) < caption_grade(pred, wrong_colour)
    # pairing is one-to-one: the image's one circle stands for one of the two caption circles
    # (4 facts), not also for the other (3 facts): (4 + 0 + count 1/2) / 9 = 1/2
    twice = ScenePred((RED_CIRCLE, Obj("circle", "red", "large", 0, 0))).to_dict()
    assert caption_grade(twice, Scene((RED_CIRCLE,))) == pytest.approx(0.5)


def test_graded_object_relation_count_captions() -> None:
    red_circle = ObjectPred(Desc(color="red", shape="circle")).to_dict()
    assert caption_grade(red_circle, TWO) == 1.0
    assert caption_grade(red_circle, Scene((Obj("circle", "blue", "large", 0, 0),))) == 0.5  # colour wrong
    assert caption_grade(red_circle, Scene((Obj("square", "blue", "large", 0, 0),))) == 0.0  # unrelated
    # facts bind to one object: TWO has a red circle and a blue square, no red square -> 1/2
    assert caption_grade(ObjectPred(Desc(color="red", shape="square")).to_dict(), TWO) == 0.5
    # a cell phrase is one fact: "a small blue shape at the bottom right" on TWO -> 2 of 3
    assert caption_grade(ObjectPred(Desc(size="small", color="blue", row=2, col=2)).to_dict(), TWO) == pytest.approx(
        2 / 3
    )

    rc, bs = Desc(color="red", shape="circle"), Desc(color="blue", shape="square")
    assert caption_grade(_rel(rc, "left_of", bs), TWO) == 1.0
    assert caption_grade(_rel(rc, "right_of", bs), TWO) == pytest.approx(4 / 5)  # relation false
    assert caption_grade(_rel(rc, "left_of", bs), Scene((RED_CIRCLE,))) == pytest.approx(2 / 5)  # no second object
    assert caption_grade(_rel(Desc(shape="circle"), "left_of", Desc(shape="circle")), TWO) == pytest.approx(2 / 3)

    circles = Desc(shape="circle")
    assert caption_grade(CountPred(3, circles).to_dict(), THREE_CIRCLES) == 1.0
    # "two circles" with 3 circles: shape fact 1 + count credit 2/3 over 2 facts -> 5/6
    assert caption_grade(CountPred(2, circles).to_dict(), THREE_CIRCLES) == pytest.approx(5 / 6)
    # "one red shape" with 2 red shapes -> (1 + 1/2) / 2
    assert caption_grade(CountPred(1, Desc(color="red")).to_dict(), THREE_CIRCLES) == pytest.approx(0.75)
    assert caption_grade(CountPred(2, Desc(shape="square")).to_dict(), THREE_CIRCLES) == 0.0
    assert caption_grade(CountPred(4, Desc()).to_dict(), THREE_CIRCLES) == pytest.approx(3 / 4)  # "four shapes"
    assert caption_grade(CountPred(0, Desc(color="red")).to_dict(), THREE_CIRCLES) == 0.0
    assert caption_grade(CountPred(0, Desc(color="blue")).to_dict(), THREE_CIRCLES) == 1.0


def test_graded_vectorised_agrees_with_reference_and_is_one_iff_true() -> None:
    scenes = _sample_scenes(120, seed=21) + [Scene(())]
    rng = random.Random(6)
    preds = [p for s in _sample_scenes(40, seed=22) for _, p in make_captions(s, rng)]
    preds += [CountPred(n, Desc(shape=sh)).to_dict() for n in range(5) for sh in SHAPES]
    preds += [ObjectPred(Desc()).to_dict(), ScenePred(()).to_dict()]
    graded = compute_graded_relevance(preds, scenes)
    assert graded.dtype == np.float32 and graded.shape == (len(preds), len(scenes))
    for k, p in enumerate(preds):
        ref = np.array([caption_grade(p, s) for s in scenes])
        assert np.allclose(graded[k], ref, atol=1e-6), p
        true = np.array([caption_matches(p, s) for s in scenes])
        assert ((graded[k] == 1.0) == true).all() and ((ref == 1.0) == true).all(), p
    assert ((graded >= 0) & (graded <= 1)).all()
