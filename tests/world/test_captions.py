"""Tests for the captions of the shapes world (vlp.world.captions): text, parsing, sampling."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

from tests.world.conftest import _load, _sample_scenes
from vlp.world.captions import caption_text, make_captions, parse_caption
from vlp.world.predicates import CountPred, ObjectPred, RelationPred, caption_matches
from vlp.world.scene import Desc, scene_from_dict


def test_captions_true_distinct_and_scene_first() -> None:
    rng = random.Random(1)
    kinds: Counter[str] = Counter()
    for scene in _sample_scenes(300, seed=7):
        caps = make_captions(scene, rng)
        assert len(caps) == 5
        texts = [t for t, _ in caps]
        assert len(set(texts)) == 5
        assert caps[0][1]["kind"] == "scene"
        assert all(p["kind"] != "scene" for _, p in caps[1:])
        # the scene caption describes exactly this scene
        assert scene_from_dict(caps[0][1]) == scene
        own_kinds = {p["kind"] for _, p in caps}
        assert {"object", "count"} <= own_kinds
        if len(scene.objects) >= 2:
            assert "relation" in own_kinds
        for text, pred in caps:
            assert caption_matches(pred, scene), text
            assert re.fullmatch(r"[a-z]+( [a-z]+)*", text), text
            # the text determines the predicate and vice versa
            assert parse_caption(text) == pred
            assert caption_text(pred) == text
            # predicates are plain JSON
            assert json.loads(json.dumps(pred)) == pred
            kinds[pred["kind"]] += 1
    assert set(kinds) == {"scene", "object", "relation", "count"}


def _albef_clean(caption: str) -> str:
    caption = re.sub(r"([,.'!?\"()*#:;~])", "", caption.lower()).replace("-", " ").replace("/", " ")
    return re.sub(r"\s{2,}", " ", caption).rstrip("\n").strip(" ")


def test_caption_cleaning_invariance(world: dict[str, Path]) -> None:
    for entry in _load(world["pretrain"]):
        for c in entry["caption"]:
            assert re.fullmatch(r"[a-z ]+", c)
            assert _albef_clean(c) == c


def test_article_and_plurals() -> None:
    assert caption_text(ObjectPred(Desc(color="orange", shape="circle"))) == "an orange circle"
    assert caption_text(ObjectPred(Desc(size="small", color="green"))) == "a small green shape"
    assert caption_text(ObjectPred(Desc(shape="triangle", row=2, col=2))) == "a triangle at the bottom right"
    assert caption_text(CountPred(2, Desc(shape="circle"))) == "two circles"
    assert caption_text(CountPred(3, Desc())) == "three shapes"
    assert caption_text(CountPred(1, Desc(color="red"))) == "one red shape"
    assert caption_text(RelationPred(Desc(color="green", shape="triangle"), "above", Desc(color="yellow"))) == (
        "a green triangle above a yellow shape"
    )
