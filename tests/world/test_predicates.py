"""Tests for the caption predicates of the shapes world (vlp.world.predicates), hand-worked."""

from __future__ import annotations

import pytest

from tests.world.conftest import BLUE_SQUARE, RED_CIRCLE, THREE_CIRCLES, TWO, _rel
from vlp.world.captions import caption_text, parse_caption
from vlp.world.predicates import CountPred, ObjectPred, ScenePred, caption_matches, predicate_from_dict
from vlp.world.scene import Desc, Obj, Scene


def test_relation_predicates() -> None:
    rc, bs = Desc(color="red", shape="circle"), Desc(color="blue", shape="square")
    assert caption_matches(_rel(rc, "left_of", bs), TWO)
    assert not caption_matches(_rel(rc, "right_of", bs), TWO)
    assert caption_matches(_rel(bs, "right_of", rc), TWO)
    assert not caption_matches(_rel(rc, "above", bs), TWO)  # same row
    assert not caption_matches(_rel(rc, "below", bs), TWO)
    assert not caption_matches(_rel(rc, "left_of", Desc(color="green")), TWO)
    # a and b must be distinct objects
    assert not caption_matches(_rel(Desc(shape="circle"), "left_of", Desc(shape="circle")), TWO)
    # THREE_CIRCLES: red small (0,0), green large (0,1), red large (2,2)
    circ = Desc(shape="circle")
    assert caption_matches(_rel(circ, "left_of", circ), THREE_CIRCLES)
    assert caption_matches(
        _rel(Desc(color="red", size="small"), "above", Desc(color="red", size="large")), THREE_CIRCLES
    )
    assert not caption_matches(_rel(Desc(color="green"), "below", circ), THREE_CIRCLES)
    assert caption_matches(_rel(Desc(color="green"), "above", Desc(color="red")), THREE_CIRCLES)
    assert not caption_matches(_rel(Desc(color="green"), "above", Desc(color="green")), THREE_CIRCLES)


def test_count_predicates_are_exact() -> None:
    circ = Desc(shape="circle")
    assert not caption_matches(CountPred(2, circ).to_dict(), THREE_CIRCLES)
    assert caption_matches(CountPred(3, circ).to_dict(), THREE_CIRCLES)
    assert caption_matches(CountPred(3, Desc()).to_dict(), THREE_CIRCLES)
    assert caption_matches(CountPred(2, Desc(color="red")).to_dict(), THREE_CIRCLES)
    assert not caption_matches(CountPred(1, Desc(color="red")).to_dict(), THREE_CIRCLES)
    assert caption_matches(CountPred(1, Desc(color="red", size="small")).to_dict(), THREE_CIRCLES)
    assert caption_matches(CountPred(1, circ).to_dict(), TWO)
    assert caption_matches(CountPred(2, Desc()).to_dict(), TWO)
    assert not caption_matches(CountPred(1, Desc()).to_dict(), TWO)
    assert parse_caption("two circles") == CountPred(2, circ).to_dict()


def test_object_predicates() -> None:
    assert caption_matches(ObjectPred(Desc(color="red", shape="circle")).to_dict(), TWO)
    assert caption_matches(ObjectPred(Desc(size="small", color="blue", row=1, col=2)).to_dict(), TWO)
    assert not caption_matches(ObjectPred(Desc(size="small", color="blue", row=1, col=0)).to_dict(), TWO)
    assert not caption_matches(ObjectPred(Desc(size="large", color="blue")).to_dict(), TWO)
    assert not caption_matches(ObjectPred(Desc(color="red", shape="square")).to_dict(), TWO)  # attrs on one object
    assert caption_matches(ObjectPred(Desc(shape="square", row=1, col=2)).to_dict(), TWO)
    assert (
        parse_caption("a small blue shape on the right")
        == ObjectPred(Desc(size="small", color="blue", row=1, col=2)).to_dict()
    )


def test_scene_predicates() -> None:
    pred = ScenePred((BLUE_SQUARE, RED_CIRCLE)).to_dict()  # order does not matter
    assert caption_text(pred) == "a large red circle on the left and a small blue square on the right"
    assert caption_matches(pred, TWO)
    assert not caption_matches(pred, Scene((RED_CIRCLE,)))  # subset
    extra = Scene((Obj("triangle", "green", "small", 0, 0), RED_CIRCLE, BLUE_SQUARE))
    assert not caption_matches(pred, extra)  # superset
    moved = Scene((RED_CIRCLE, Obj("square", "blue", "small", 2, 2)))
    assert not caption_matches(pred, moved)
    resized = Scene((RED_CIRCLE, Obj("square", "blue", "large", 1, 2)))
    assert not caption_matches(pred, resized)
    # a one-object scene caption is a different predicate from any object caption
    single = ScenePred((RED_CIRCLE,)).to_dict()
    assert parse_caption(caption_text(single)) == single
    assert not caption_matches(single, TWO)


def test_predicate_validation() -> None:
    with pytest.raises(ValueError):
        predicate_from_dict({"kind": "object", "object": {"shape": "hexagon"}})
    with pytest.raises(ValueError):
        predicate_from_dict({"kind": "relation", "relation": "near", "a": {}, "b": {}})
    with pytest.raises(ValueError):
        predicate_from_dict({"kind": "scene", "objects": [{"shape": "circle", "color": "red"}]})
    with pytest.raises(ValueError):
        parse_caption("a hexagon")
