"""Zero-shot classification splits of a shapes world (vlp.world.task_files.classification): labels agree
with the scenes, and every prompt is a caption of the world's grammar."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.world.conftest import _load
from vlp.data.classification import read_classification_inputs
from vlp.errors import DataError
from vlp.world.captions import caption_text, parse_caption
from vlp.world.predicates import caption_matches
from vlp.world.scene import COLORS, SHAPES, scene_from_dict
from vlp.world.task_files.classification import CLASSIFICATION_ATTRIBUTES, write_classification_splits

NUMBER = {"one": 1, "two": 2, "three": 3, "four": 4}


@pytest.fixture(scope="module")
def splits(world: dict[str, Path]) -> dict[str, Path]:
    return write_classification_splits(world["root"], "test")


def test_files_and_classes(splits: dict[str, Path], world: dict[str, Path]) -> None:
    assert set(splits) == {
        f"classification_{a}_{kind}" for a in CLASSIFICATION_ATTRIBUTES for kind in ("test", "classes", "templates")
    }
    assert all(p.parent == world["root"] and p.is_file() for p in splits.values())
    assert splits["classification_shape_classes"].read_text().split("\n") == [*SHAPES, ""]
    assert splits["classification_colour_classes"].read_text().splitlines() == list(COLORS)
    assert splits["classification_count_classes"].read_text().splitlines() == [
        "one shape",
        "two shapes",
        "three shapes",
        "four shapes",
    ]


def test_labels_agree_with_the_scenes(splits: dict[str, Path], world: dict[str, Path]) -> None:
    records = _load(world["scenes"])["splits"]["test"]
    by_image = {r["image"]: r["objects"] for r in records}
    for attr, key in (("shape", "shape"), ("colour", "color")):
        entries = _load(splits[f"classification_{attr}_test"])
        kept = [e["image"] for e in entries]
        assert kept == [r["image"] for r in records if r["image"] in set(kept)]  # the split's order
        for e in entries:
            assert {o[key] for o in by_image[e["image"]]} == {e["label"]}
        left_out = [r for r in records if r["image"] not in set(kept)]
        assert all(len({o[key] for o in r["objects"]}) > 1 for r in left_out)
        assert left_out and entries  # both kinds occur in a 60-image world
    count = _load(splits["classification_count_test"])
    assert [e["image"] for e in count] == [r["image"] for r in records]
    assert [NUMBER[e["label"].split()[0]] for e in count] == [len(r["objects"]) for r in records]


def test_every_prompt_is_a_caption_and_the_right_count_is_true_of_the_image(
    splits: dict[str, Path], world: dict[str, Path]
) -> None:
    records = {r["image"]: r for r in _load(world["scenes"])["splits"]["test"]}
    for attr in CLASSIFICATION_ATTRIBUTES:
        inp = read_classification_inputs(
            splits[f"classification_{attr}_test"],
            splits[f"classification_{attr}_classes"],
            splits[f"classification_{attr}_templates"],
        )
        assert all(Path(p).is_file() for p in inp.images)
        prompts = inp.prompts()
        assert all(caption_text(parse_caption(p)) == p for p in prompts)  # the grammar writes each prompt
        t = len(inp.templates)
        for path, label in zip(inp.images, inp.labels):
            rel = Path(path).relative_to(world["root"]).as_posix()
            scene = scene_from_dict(records[rel])
            true = [p for p in prompts[label * t : (label + 1) * t] if caption_matches(parse_caption(p), scene)]
            # the class's prompt that counts the image's objects (count: the class name itself) is true
            assert any(p.split()[0] == _word(len(scene.objects)) for p in true), (attr, rel, true)
            wrong = [p for c in range(len(inp.classes)) if c != label for p in prompts[c * t : (c + 1) * t]]
            assert not any(caption_matches(parse_caption(p), scene) for p in wrong)


def _word(n: int) -> str:
    return {v: k for k, v in NUMBER.items()}[n]


def test_templates_hold_one_slot(splits: dict[str, Path]) -> None:
    for attr in CLASSIFICATION_ATTRIBUTES:
        lines = splits[f"classification_{attr}_templates"].read_text().splitlines()
        assert lines and all(t.count("{}") == 1 for t in lines)


def test_a_missing_split_is_a_clear_error(world: dict[str, Path]) -> None:
    with pytest.raises(DataError, match="no split 'helper'"):
        write_classification_splits(world["root"], "helper")


def test_json_entries_are_image_and_label(splits: dict[str, Path]) -> None:
    entries = json.loads(splits["classification_colour_test"].read_text())
    assert all(set(e) == {"image", "label"} and e["label"] in COLORS for e in entries)
