"""The false negatives of training batches on a shapes world (vlp.lab.false_negatives): hand-worked
shares, the brute-force count by caption_matches, the queue's denominators and bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlp.lab.false_negatives import false_negative_share
from vlp.world.predicates import caption_matches
from vlp.world.scene import scene_from_dict

WORLD = dict(seed=3, n_train=12, n_val=6, n_test=60, image_size=48)


def _train(world: dict[str, Path]) -> list[dict]:
    return json.loads(world["scenes"].read_text())["splits"]["train"]


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
