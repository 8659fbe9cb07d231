"""Caption attributes (vlp.lab.attributes): the value a caption determines, captions with attributes hidden."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.world.conftest import BLUE_SQUARE, RED_CIRCLE, TWO, _rel
from vlp.lab.attributes import (
    attribute_value,
    group_ids,
    parse_attributes,
    removal_groups,
    removed_key,
)
from vlp.world.phrases import CELL_PHRASES
from vlp.world.predicates import CountPred, ObjectPred, ScenePred
from vlp.world.scene import Desc, Obj

#: the world of tests/world's small-world tests (its conftest's ``world``)
WORLD = dict(seed=3, n_train=12, n_val=6, n_test=60, image_size=48)

ONE = ScenePred((RED_CIRCLE,)).to_dict()  # "a large red circle on the left"
RED_SHAPE = ObjectPred(Desc(color="red")).to_dict()
TWO_CIRCLES = CountPred(2, Desc(shape="circle")).to_dict()
RED_LEFT_OF_RED = _rel(Desc(shape="circle", color="red"), "left_of", Desc(shape="square", color="red"))
RED_LEFT_OF_BLUE = _rel(Desc(shape="circle", color="red"), "left_of", Desc(shape="square", color="blue"))


@pytest.mark.parametrize(
    "pred, expected",
    [
        (ONE, {"shape": "circle", "color": "red", "size": "large", "cell": "1,0"}),
        (ScenePred(TWO.objects).to_dict(), {}),  # two values of every attribute, two cells: none determined
        (RED_SHAPE, {"color": "red"}),
        (TWO_CIRCLES, {"shape": "circle", "count": "2"}),
        (RED_LEFT_OF_RED, {"color": "red", "relation": "left_of"}),
        (RED_LEFT_OF_BLUE, {"relation": "left_of"}),
    ],
)
def test_attribute_value_is_the_one_value_the_caption_determines(pred, expected) -> None:
    got = {a: attribute_value(pred, a) for a in ("shape", "color", "size", "cell", "count", "relation")}
    assert got == {a: expected.get(a) for a in got}


def test_attribute_labels_of_a_world_are_words_of_their_captions(world: dict[str, Path]) -> None:
    captions = [c for r in json.loads(world["scenes"].read_text())["splits"]["test"] for c in r["captions"]]
    labelled = 0
    for c in captions:
        for a in ("shape", "color", "size"):
            if (v := attribute_value(c["predicate"], a)) is not None:
                words = c["text"].split()
                assert v in words or f"{v}s" in words  # count captions: plural nouns
                labelled += 1
        if (cell := attribute_value(c["predicate"], "cell")) is not None:
            assert CELL_PHRASES[tuple(map(int, cell.split(",")))] in c["text"]
    assert labelled > len(captions)  # most captions determine at least one attribute


def test_removed_key_groups_captions_that_differ_only_in_the_hidden_attributes() -> None:
    red, blue = ObjectPred(Desc(shape="circle", color="red")), ObjectPred(Desc(shape="circle", color="blue"))
    plain = ObjectPred(Desc(shape="circle"))
    assert removed_key(red, {"color"}) == removed_key(blue, {"color"})
    assert removed_key(red, {"shape"}) != removed_key(blue, {"shape"})
    assert removed_key(plain, {"color"}) != removed_key(red, {"color"})  # mentioning colour at all stays visible
    moved = ScenePred((RED_CIRCLE, Obj("square", "blue", "small", 2, 2)))
    swapped = ScenePred((Obj("circle", "red", "large", 2, 2), Obj("square", "blue", "small", 0, 0)))
    assert (
        removed_key(moved, {"cell"}) == removed_key(ScenePred(TWO.objects), {"cell"}) == removed_key(swapped, {"cell"})
    )
    assert removed_key(moved, {"size"}) != removed_key(ScenePred(TWO.objects), {"size"})
    three = CountPred(3, Desc(shape="circle")).to_dict()
    assert removed_key(three, {"count"}) == removed_key(TWO_CIRCLES, {"count"}) != removed_key(three, {"shape"})
    right_of = _rel(Desc(shape="circle", color="red"), "right_of", Desc(shape="square", color="blue"))
    assert removed_key(right_of, {"relation"}) == removed_key(RED_LEFT_OF_BLUE, {"relation"})
    assert removed_key(right_of, {"caption"}) == removed_key(ONE, {"caption"})


def test_removal_groups_and_attribute_specs() -> None:
    blue_square = ScenePred((BLUE_SQUARE,)).to_dict()
    red_square = ScenePred((Obj("square", "red", "small", 1, 2),)).to_dict()
    assert removal_groups([ONE, blue_square, red_square, ONE], {"color"}) == [0, 1, 1, 0]
    assert removal_groups([ONE, blue_square, red_square], {"color", "shape", "size", "cell"}) == [0, 0, 0]
    assert group_ids(["b", "a", "b", "c"]) == [0, 1, 0, 2]
    assert parse_attributes("size+cell") == {"size", "cell"}
    assert parse_attributes("caption") == {"caption"}
    with pytest.raises(ValueError, match="unknown attribute"):
        parse_attributes("size+position")
