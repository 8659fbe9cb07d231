"""Tests for the caption mixes of the shapes world and their false negatives (vlp.data.synthetic.mix)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.data.synthetic.conftest import _load
from vlp.data.synthetic.captions import parse_caption
from vlp.data.synthetic.mix import check_kinds, false_negative_share, write_caption_mix
from vlp.data.synthetic.predicates import caption_matches
from vlp.data.synthetic.scene import scene_from_dict


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


# ---------------------------------------------------------------- false negatives


def _write(path: Path, items: list[dict]) -> Path:
    path.write_text(json.dumps(items))
    return path


def test_false_negative_share_hand_worked(world: dict[str, Path]) -> None:
    """12 images with distinct scenes: the even ones captioned "a shape" (true of every image), the
    odd ones by their scene caption (true of their own image only). One batch = all 12 items."""
    records = _train(world)
    n = len(records)
    assert len({r["captions"][0]["text"] for r in records}) == n
    items = [
        {"image": r["image"], "caption": "a shape" if i % 2 == 0 else r["captions"][0]["text"]}
        for i, r in enumerate(records)
    ]
    data = _write(world["root"] / "half_a_shape.json", items)
    out = false_negative_share(data, world["root"], batch_size=n, batches=3)
    # in a batch: the 6 "a shape" captions are false negatives of the 11 other images each
    assert out["in_batch_share"] == pytest.approx(6 * 11 / (12 * 11))
    assert out["in_batch_per_anchor"] == pytest.approx(5.5) and out["in_batch_anchors"] == 1.0
    assert out["in_batch_share_by_kind"] == {"object": 1.0, "scene": 0.0}
    assert out["caption_kinds"] == {"object": 0.5, "scene": 0.5}
    assert out["i2t_share"] == out["t2i_share"] == out["in_batch_share"] and out["same_image_per_anchor"] == 0
    # queue = the previous batch = the same 12 items: per anchor 11 in-batch + 12 queued negatives;
    # i2t: 6 queued "a shape" for every image + each scene caption for its own image: (66 + 72 + 6) / 12
    q = false_negative_share(data, world["root"], batch_size=n, queue_size=n, batches=3)
    assert q["i2t_per_anchor"] == q["t2i_per_anchor"] == pytest.approx(144 / 12)
    assert q["i2t_share"] == q["t2i_share"] == pytest.approx(144 / (12 * 23))
    assert q["same_image_per_anchor"] == 1.0


def test_false_negative_share_equals_brute_force_caption_matches(world: dict[str, Path]) -> None:
    records = _train(world)
    n = len(records)
    items = [{"image": r["image"], "caption": r["captions"][1]["text"]} for r in records]  # one generic caption each
    data = _write(world["root"] / "second_caption.json", items)
    scenes = [scene_from_dict(r) for r in records]
    preds = [r["captions"][1]["predicate"] for r in records]
    fn = sum(caption_matches(preds[j], scenes[i]) for i in range(n) for j in range(n) if i != j)
    assert fn > 0
    out = false_negative_share(data, world["root"], batch_size=n, batches=2, seed=4)
    assert out["in_batch_share"] == pytest.approx(fn / (n * (n - 1)))
    anchors = sum(any(caption_matches(preds[j], scenes[i]) for j in range(n) if j != i) for i in range(n))
    assert out["in_batch_anchors"] == pytest.approx(anchors / n)


def test_false_negative_share_queue_denominators(world: dict[str, Path]) -> None:
    """Every caption true of every image: every negative, in batch and queue, is a false negative."""
    data = _write(
        world["root"] / "all_a_shape.json", [{"image": r["image"], "caption": "a shape"} for r in _train(world)]
    )
    out = false_negative_share(data, world["root"], batch_size=4, queue_size=8, batches=5)
    assert out["in_batch_share"] == out["i2t_share"] == out["t2i_share"] == 1.0
    assert out["i2t_per_anchor"] == out["t2i_per_anchor"] == 3 + 8


def test_false_negative_share_refuses_bad_inputs(world: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fewer than one batch of 64"):
        false_negative_share(world["pretrain"], world["root"], batch_size=64)
    other = tmp_path / "x.png"
    other.write_bytes(b"")
    data = _write(tmp_path / "foreign.json", [{"image": str(other), "caption": "a shape"}] * 4)
    with pytest.raises(ValueError, match="x.png is not an image of this world"):
        false_negative_share(data, world["root"], batch_size=2)
