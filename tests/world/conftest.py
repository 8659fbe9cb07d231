"""Shared data of the shapes-world tests (``vlp.world``): worlds, hand-worked scenes, readers.

``world`` is the small world of the caption and world-file tests and ``task_world`` the larger one
of the VQA and NLVR2 tests (their modules make it their ``world``). The test modules import the
constants and helpers below from ``tests.world.conftest``.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from vlp.world.predicates import RelationPred
from vlp.world.scene import Desc, Obj, Scene, sample_scene, scene_from_dict
from vlp.world.writer import generate_world

SMALL = dict(n_train=12, n_val=6, n_test=60, image_size=48, progress=False)
WORLD = dict(n_train=300, n_val=30, n_test=60, image_size=32, progress=False)
#: the VQA and NLVR2 files of a world
TASK_KEYS = (
    "vqa_train",
    "vqa_val",
    "vqa_test",
    "vqa_test_annotations",
    "answer_list",
    "nlvr_train",
    "nlvr_dev",
    "nlvr_test",
)
#: the files that do not depend on the VQA and NLVR2 parameters
OTHER_KEYS = (
    "pretrain",
    "helper",
    "retrieval_train",
    "retrieval_val",
    "retrieval_test",
    "relevance_val",
    "relevance_test",
    "relevance_graded_val",
    "relevance_graded_test",
    "scenes",
)
CELLS = {
    "top left": (0, 0),
    "top": (0, 1),
    "top right": (0, 2),
    "left": (1, 0),
    "center": (1, 1),
    "right": (1, 2),
    "bottom left": (2, 0),
    "bottom": (2, 1),
    "bottom right": (2, 2),
}
NP = re.compile(
    r"(?:(?P<size>small|large) )?(?:(?P<color>red|green|blue|yellow|purple|orange) )?"
    r"(?P<noun>circle|square|triangle|diamond|shape|object)s?(?: (?:at|on|in) the (?P<cell>[a-z ]+))?"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return generate_world(tmp_path_factory.mktemp("world"), seed=3, **SMALL)


@pytest.fixture(scope="package")
def task_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The world of the VQA and NLVR2 tests, shared by their modules."""
    return generate_world(tmp_path_factory.mktemp("world"), seed=2, **WORLD)


@pytest.fixture(scope="package")
def scenes(task_world: dict[str, Path]) -> dict[str, Scene]:
    """Scene of every image of ``task_world``, by relative image path."""
    splits = json.loads(task_world["scenes"].read_text())["splits"]
    return {e["image"]: scene_from_dict(e) for entries in splits.values() for e in entries}


def _load(p: Path) -> Any:
    return json.loads(p.read_text())


def _sample_scenes(n: int, seed: int = 0) -> list[Scene]:
    rng = random.Random(seed)
    return [sample_scene(rng) for _ in range(n)]


def _matching(phrase: str, scene: Scene) -> list[Obj]:
    """Objects of ``scene`` that the noun phrase describes (test-side reading)."""
    m = NP.fullmatch(phrase)
    assert m, phrase
    cell = CELLS[m["cell"]] if m["cell"] else None
    shape = m["noun"] if m["noun"] not in ("shape", "object") else None
    return [
        o
        for o in scene.objects
        if (m["size"] is None or o.size == m["size"])
        and (m["color"] is None or o.color == m["color"])
        and (shape is None or o.shape == shape)
        and (cell is None or (o.row, o.col) == cell)
    ]


# ---------------------------------------------------------------- hand-worked scenes

RED_CIRCLE = Obj("circle", "red", "large", 1, 0)
BLUE_SQUARE = Obj("square", "blue", "small", 1, 2)
TWO = Scene((RED_CIRCLE, BLUE_SQUARE))
THREE_CIRCLES = Scene(
    (Obj("circle", "red", "small", 0, 0), Obj("circle", "green", "large", 0, 1), Obj("circle", "red", "large", 2, 2))
)


def _rel(a: Desc, r: str, b: Desc) -> dict:
    return RelationPred(a, r, b).to_dict()
