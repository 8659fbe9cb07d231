"""Shapes-world SNLI-VE triples: grammar, hand-worked labels, balance, ground truth, determinism,
and that the surface form alone cannot beat 50 %."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from vlp.data.downstream_formats import load_ve
from vlp.world.scene import Desc, Obj, Scene, scene_from_dict
from vlp.world.task_files.ve import (
    UNRENDERED,
    Hypothesis,
    hypothesis_label,
    hypothesis_text,
    parse_hypothesis,
    write_ve_splits,
)
from vlp.world.writer import generate_world

SCENE = Scene((Obj("circle", "red", "small", 0, 0), Obj("square", "blue", "large", 1, 1)))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ve_world")
    generate_world(root, seed=3, n_train=40, n_val=4, n_test=20, image_size=32, progress=False)
    return root


@pytest.mark.parametrize(
    "hyp,text,label",
    [
        (Hypothesis(Desc(shape="circle", color="red")), "there is a red circle", "entailment"),
        (Hypothesis(Desc(shape="circle", color="blue")), "there is a blue circle", "contradiction"),
        (Hypothesis(Desc(color="red"), negated=True), "there is no red shape", "contradiction"),
        (Hypothesis(Desc(shape="circle", size="large"), negated=True), "there is no large circle", "entailment"),
        (Hypothesis(Desc(shape="circle", color="red"), unrendered="wooden"), "there is a red wooden circle", "neutral"),
        (Hypothesis(Desc(shape="square"), True, "heavy"), "there is no heavy square", "neutral"),
        (Hypothesis(Desc(color="orange"), unrendered="metal"), "there is an orange metal shape", "contradiction"),
        (Hypothesis(Desc(shape="diamond"), True, "glass"), "there is no glass diamond", "entailment"),
    ],
)
def test_hand_worked_labels_and_grammar(hyp: Hypothesis, text: str, label: str) -> None:
    assert hypothesis_text(hyp) == text
    assert parse_hypothesis(text) == hyp
    assert hypothesis_label(hyp, SCENE) == label


@pytest.mark.parametrize(
    "text", ["there is red circle", "there are two circles", "there is a wooden", "there is an red circle"]
)
def test_parse_rejects_outside_the_grammar(text: str) -> None:
    with pytest.raises(ValueError):
        parse_hypothesis(text)


def test_files_balanced_and_labelled_by_the_scenes(world: Path) -> None:
    paths = write_ve_splits(world)
    assert set(paths) == {"ve_train", "ve_dev", "ve_test"}
    scenes_json = json.loads((world / "scenes.json").read_text())["splits"]
    for key, split in (("ve_train", "train"), ("ve_dev", "val"), ("ve_test", "test")):
        entries = json.loads(paths[key].read_text())
        assert len(entries) == 3 * len(scenes_json[split])
        assert Counter(e["label"] for e in entries) == {
            lab: len(scenes_json[split]) for lab in ("entailment", "neutral", "contradiction")
        }
        by_image = {r["image"]: scene_from_dict(r) for r in scenes_json[split]}
        for e in entries:  # independent check against the world's objects
            h = parse_hypothesis(e["sentence"])
            objs = by_image[e["image"]].objects
            present = any(h.desc.matches(o) for o in objs)
            unsettled = h.unrendered is not None and present
            truth = present != h.negated
            assert e["label"] == ("neutral" if unsettled else "entailment" if truth else "contradiction"), e
        assert len(load_ve(paths[key])) == len(entries)  # ALBEF's VE format, readable by vlp


def test_surface_form_alone_reaches_at_most_half(world: Path) -> None:
    """The best hypothesis-only rule on the form (negated, unrendered word): 50 %; majority: 1/3."""
    entries = json.loads(write_ve_splits(world)["ve_train"].read_text())
    forms: dict[tuple, Counter] = defaultdict(Counter)
    for e in entries:
        h = parse_hypothesis(e["sentence"])
        forms[(h.negated, h.unrendered is not None)][e["label"]] += 1
    best = sum(c.most_common(1)[0][1] for c in forms.values()) / len(entries)
    assert best == pytest.approx(0.5, abs=0.02)
    assert len(forms) == 4
    words = {w for e in entries for w in e["sentence"].split()}
    assert set(UNRENDERED) & words and not re.search(r"\b(left|right|top|bottom)\b", " ".join(words))


def test_deterministic_and_per_image(world: Path, tmp_path: Path) -> None:
    first = write_ve_splits(world)["ve_test"].read_bytes()
    assert write_ve_splits(world)["ve_test"].read_bytes() == first
    other = tmp_path / "w"
    generate_world(other, seed=3, n_train=40, n_val=4, n_test=20, image_size=32, progress=False)
    assert write_ve_splits(other)["ve_test"].read_bytes() == first  # a function of the world only
    assert len(json.loads(write_ve_splits(world, per_image=1)["ve_dev"].read_text())) == 4
