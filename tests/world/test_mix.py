"""Tests for the caption mixes of the shapes world (vlp.world.mix; their false negatives: tests/lab/test_false_negatives.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.world.conftest import _load
from vlp.world.captions import parse_caption
from vlp.world.mix import check_kinds, write_caption_mix
from vlp.world.predicates import caption_matches
from vlp.world.scene import scene_from_dict


def _train(world: dict[str, Path]) -> list[dict]:
    return _load(world["scenes"])["splits"]["train"]


def _captions(entry: dict) -> list[str]:
    return entry["caption"] if isinstance(entry["caption"], list) else [entry["caption"]]


def test_caption_mix_keeps_the_kinds_in_the_world_order(world: dict[str, Path]) -> None:
    records = _train(world)
    mix = write_caption_mix(world["root"], ["count", "object"])
    assert mix.path == world["root"] / "pretrain_kinds_object+count.json" and mix.kinds == ("object", "count")
    items = _load(mix.path)
    assert [e["image"] for e in items] == [r["image"] for r in records]
    for e, r in zip(items, records):
        assert _captions(e) == [c["text"] for c in r["captions"] if c["predicate"]["kind"] in ("object", "count")]
    assert (mix.images, mix.dropped, mix.added) == (len(records), (), 0)
    assert mix.captions == sum(len(_captions(e)) for e in items)
    assert write_caption_mix(world["root"], ["object", "count"], seed=5).path.read_bytes() == mix.path.read_bytes()


def test_caption_mix_drops_images_without_the_kinds(world: dict[str, Path], tmp_path: Path) -> None:
    records = _train(world)
    one_object = tuple(r["image"] for r in records if len(r["objects"]) == 1)  # no relation caption
    assert one_object  # the fixture world has some
    mix = write_caption_mix(world["root"], ["relation"], out=tmp_path / "rel.json")
    assert mix.dropped == one_object and mix.images == len(records) - len(one_object)
    items = _load(mix.path)
    assert all(parse_caption(t)["kind"] == "relation" for e in items for t in _captions(e))
    assert all(Path(e["image"]).is_absolute() and Path(e["image"]).is_file() for e in items)  # written elsewhere


def test_caption_mix_top_up_is_deterministic_and_of_the_kinds(world: dict[str, Path], tmp_path: Path) -> None:
    records = _train(world)
    mix = write_caption_mix(world["root"], ["object"], seed=1, out=tmp_path / "a.json", min_captions=4)
    items = _load(mix.path)
    own = [[c["text"] for c in r["captions"] if c["predicate"]["kind"] == "object"] for r in records]
    assert mix.added == sum(4 - len(o) for o in own if len(o) < 4) > 0
    for e, r, o in zip(items, records, own):
        caps = _captions(e)
        assert len(caps) == max(4, len(o)) == len(set(caps)) and caps[: len(o)] == o
        for t in caps:
            pred = parse_caption(t)
            assert pred["kind"] == "object" and caption_matches(pred, scene_from_dict(r))
    same = write_caption_mix(world["root"], ["object"], seed=1, out=tmp_path / "b.json", min_captions=4)
    assert same.path.read_bytes() == mix.path.read_bytes()
    other = write_caption_mix(world["root"], ["object"], seed=2, out=tmp_path / "c.json", min_captions=4)
    assert other.path.read_bytes() != mix.path.read_bytes()
    # one scene caption per image: a scene-only mix cannot be topped up
    scene = write_caption_mix(world["root"], ["scene"], out=tmp_path / "s.json", min_captions=3)
    assert scene.added == 0 and all(isinstance(e["caption"], str) for e in _load(scene.path))


def test_caption_mix_repeats_weight_a_kind_by_listing_it_n_times(world: dict[str, Path], tmp_path: Path) -> None:
    records = _train(world)
    mix = write_caption_mix(world["root"], ["scene", "object", "count"], repeats={"scene": 3})
    assert mix.path == world["root"] / "pretrain_kinds_scene-x3+object+count.json"
    plain = _load(write_caption_mix(world["root"], ["scene", "object", "count"], out=tmp_path / "p.json").path)
    for e, p, r in zip(_load(mix.path), plain, records):
        scene_caption = next(c["text"] for c in r["captions"] if c["predicate"]["kind"] == "scene")
        caps, once = _captions(e), _captions(p)
        assert caps.count(scene_caption) == 3 and [t for t in caps if t != scene_caption] == once[1:]
        assert caps[:3] == [scene_caption] * 3  # repeats stay in place, in the world's order
    assert mix.captions == sum(len(_captions(e)) for e in _load(mix.path)) == sum(len(_captions(p)) + 2 for p in plain)
    # topped-up captions are repeated by their own kind too
    up = write_caption_mix(
        world["root"], ["object"], seed=1, out=tmp_path / "u.json", min_captions=4, repeats={"object": 2}
    )
    once = write_caption_mix(world["root"], ["object"], seed=1, out=tmp_path / "o.json", min_captions=4)
    for e, o in zip(_load(up.path), _load(once.path)):
        assert _captions(e) == [t for t in _captions(o) for _ in range(2)]
    with pytest.raises(ValueError, match="'relation' is repeated but not among the kinds scene, object"):
        write_caption_mix(world["root"], ["scene", "object"], repeats={"relation": 2}, out=tmp_path / "x.json")
    with pytest.raises(ValueError, match="repeats of caption kind 'scene' must be an integer >= 1, got 0"):
        write_caption_mix(world["root"], ["scene"], repeats={"scene": 0}, out=tmp_path / "x.json")


def test_caption_kinds_are_validated() -> None:
    assert check_kinds(["count", "scene", "count"]) == ("scene", "count")
    with pytest.raises(ValueError, match=r"unknown caption kind 'colour'; .* kinds are scene, object, relation, count"):
        check_kinds(["object", "colour"])
    with pytest.raises(ValueError, match="no caption kinds"):
        check_kinds([])
    with pytest.raises(ValueError, match="the string 'object'"):
        check_kinds("object")
