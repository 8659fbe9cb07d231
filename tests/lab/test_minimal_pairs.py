"""Minimal-pair distractors (vlp.lab.minimal_pairs) on hand-checked scenes and a world's images."""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.world.conftest import RED_CIRCLE, THREE_CIRCLES, TWO
from vlp.lab.minimal_pairs import PAIR_ATTRIBUTES, distractors, sample_distractors
from vlp.world.predicates import ObjectPred, ScenePred, caption_matches
from vlp.world.scene import Desc, Scene, render_scene, scene_from_dict, world_rng

#: the world of tests/world's small-world tests (its conftest's ``world``)
WORLD = dict(seed=3, n_train=12, n_val=6, n_test=60, image_size=48)

FIELDS = {"shape": ("shape",), "color": ("color",), "size": ("size",), "cell": ("row", "col")}


def _changed_fields(target: Scene, other: Scene) -> list[tuple[str, ...]]:
    """The fields in which the one object of ``target`` missing from ``other`` differs from the one
    object of ``other`` that replaced it (asserts exactly one object changed)."""
    gone = [o for o in target.objects if o not in other.objects]
    new = [o for o in other.objects if o not in target.objects]
    assert len(gone) == len(new) == 1
    a, b = asdict(gone[0]), asdict(new[0])
    return [tuple(k for k in a if a[k] != b[k])]


@pytest.mark.parametrize("scene", [TWO, THREE_CIRCLES])
def test_each_scene_caption_distractor_differs_in_exactly_the_named_attribute(scene: Scene) -> None:
    pred = ScenePred(scene.objects)
    n, empty = len(scene.objects), 9 - len(scene.objects)
    expected = {"shape": 3 * n, "color": 5 * n, "size": n, "cell": empty * n, "count": n + n * empty}
    for attribute in PAIR_ATTRIBUTES:
        ds = distractors(pred, scene, attribute)
        assert len(ds) == expected[attribute] and len({d.scene for d in ds}) == len(ds)
        for d in ds:
            assert d.attribute == attribute
            assert caption_matches(pred, scene) and not caption_matches(pred, d.scene)
            if attribute == "count":  # one object removed, or one copied (same shape, colour, size) to an empty cell
                assert abs(len(d.scene.objects) - n) == 1
                small, big = sorted([scene.objects, d.scene.objects], key=len)
                extra = [o for o in big if o not in small]
                assert set(small) <= set(big) and len(extra) == 1
                if len(big) > n:
                    assert any(
                        (o.shape, o.color, o.size) == (extra[0].shape, extra[0].color, extra[0].size) for o in small
                    )
            else:  # a move changes the row, the column or both
                (fields,) = _changed_fields(scene, d.scene)
                assert fields and set(fields) <= set(FIELDS[attribute])


def test_distractors_of_an_object_caption_are_the_changes_that_make_it_false() -> None:
    red = ObjectPred(Desc(color="red"))  # "a red shape" of TWO: only the red circle's colour or removal falsify it
    assert [d.change for d in distractors(red, TWO, "color")] == [
        f"large red circle at (1,0): color -> {c}" for c in ("green", "blue", "yellow", "purple", "orange")
    ]
    assert [d.change for d in distractors(red, TWO, "count")] == ["large red circle at (1,0) removed"]
    assert distractors(red, TWO, "shape") == distractors(red, TWO, "size") == distractors(red, TWO, "cell") == []
    with pytest.raises(ValueError, match="not true of the target"):
        distractors(ObjectPred(Desc(color="green")), TWO, "color")
    with pytest.raises(ValueError, match="unknown attribute"):
        distractors(red, TWO, "texture")


def test_sampling_is_deterministic_and_bounded() -> None:
    pred = ScenePred(TWO.objects)
    a = sample_distractors(pred, TWO, random.Random(5), per_attribute=2)
    b = sample_distractors(pred, TWO, random.Random(5), per_attribute=2)
    assert a == b and {k: len(v) for k, v in a.items()} == dict.fromkeys(PAIR_ATTRIBUTES, 2)
    one = Scene((RED_CIRCLE,))
    c = sample_distractors(ScenePred(one.objects), one, random.Random(0), per_attribute=3, attributes=("size",))
    assert list(c) == ["size"] and len(c["size"]) == 1  # a single object has one other size


def test_rendered_distractor_differs_from_the_world_image_only_in_the_changed_object(world: dict[str, Path]) -> None:
    meta = json.loads(world["scenes"].read_text())
    r = meta["splits"]["test"][0]
    scene, size, rng = scene_from_dict(r), meta["image_size"], lambda: world_rng(meta["seed"], "test", 0, "render")
    target = np.asarray(Image.open(world["root"] / r["image"]).convert("RGB"))
    assert np.array_equal(np.asarray(render_scene(scene, size, rng())), target)  # the world's render, reproduced
    d = distractors(r["captions"][0]["predicate"], scene, "color")[0]
    changed = next(o for o in scene.objects if o not in d.scene.objects)
    diff = np.argwhere((np.asarray(render_scene(d.scene, size, rng())) != target).any(-1))
    cell = size / 3
    assert len(diff) > 0
    assert ((diff[:, 0] // cell == changed.row) & (diff[:, 1] // cell == changed.col)).all()
