"""Tests for the files of the shapes world (vlp.world.writer): formats, relevance, determinism."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.world.conftest import OTHER_KEYS, SMALL, TASK_KEYS, _load
from vlp.world.mix import write_generic_mix
from vlp.world.predicates import caption_matches
from vlp.world.relevance import compute_graded_relevance, compute_relevance
from vlp.world.scene import COLORS, SHAPES, SIZES, scene_from_dict
from vlp.world.writer import CAPTION_GROUPS_FORMAT, generate_world


def test_world_files_and_formats(world: dict[str, Path]) -> None:
    root = world["root"]
    assert set(world) == {
        *OTHER_KEYS,
        "caption_kinds_val",
        "caption_kinds_test",
        "root",
        *TASK_KEYS,
        "grounding_train",
        "grounding_val",
        "grounding_test",
        "ve_train",
        "ve_dev",
        "ve_test",
        *(f"classification_{a}_{s}" for a in ("shape", "colour", "count") for s in ("val", "test")),
        *(f"classification_{a}_{f}" for a in ("shape", "colour", "count") for f in ("classes", "templates")),
    }
    assert all(world[k].is_file() for k in world if k != "root")
    pre = _load(world["pretrain"])
    assert len(pre) == SMALL["n_train"]
    assert pre[0]["image"] == "images/train/train_000000.png"
    assert all(len(e["caption"]) == 5 for e in pre)
    helper = _load(world["helper"])  # clean captions: the fully specified scene caption per image
    assert helper == [{"image": e["image"], "caption": e["caption"][0]} for e in pre]
    rt = _load(world["retrieval_train"])
    assert len(rt) == 5 * SMALL["n_train"]
    assert rt[0] == {"image": pre[0]["image"], "caption": pre[0]["caption"][0], "image_id": "train_000000"}
    assert [e["caption"] for e in rt[5:10]] == pre[1]["caption"]
    scenes = _load(world["scenes"])
    assert scenes["seed"] == 3 and scenes["image_size"] == SMALL["image_size"]
    assert scenes["attributes"] == {"shapes": list(SHAPES), "colors": list(COLORS), "sizes": list(SIZES)}
    for split in ("train", "val", "test"):
        n = SMALL[f"n_{split}"]
        entries = scenes["splits"][split]
        assert len(entries) == n
        assert sorted(p.name for p in (root / "images" / split).iterdir()) == [f"{split}_{i:06d}.png" for i in range(n)]
        for e in entries:
            with Image.open(root / e["image"]) as im:
                assert im.size == (SMALL["image_size"],) * 2
            scene = scene_from_dict(e)
            for c in e["captions"]:
                assert caption_matches(c["predicate"], scene)
    for split in ("val", "test"):
        ann = _load(world[f"retrieval_{split}"])
        assert [a["caption"] for a in ann] == [[c["text"] for c in e["captions"]] for e in scenes["splits"][split]]
        assert [a["image"] for a in ann] == [e["image"] for e in scenes["splits"][split]]


def test_relevance_file(world: dict[str, Path]) -> None:
    rel = _load(world["relevance_test"])
    ann = _load(world["retrieval_test"])
    scenes = [scene_from_dict(e) for e in _load(world["scenes"])["splits"]["test"]]
    preds = [c["predicate"] for e in _load(world["scenes"])["splits"]["test"] for c in e["captions"]]
    assert rel["format"] == "vlp-relevance-v1"
    assert rel["annotation"] == "retrieval_test.json"
    assert rel["num_images"] == len(ann) == len(scenes)
    assert rel["texts"] == [c for a in ann for c in a["caption"]]
    assert len(rel["relevant_images"]) == len(rel["texts"]) == 5 * len(ann)
    sizes_by_kind: dict[str, list[int]] = {}
    for k, (pred, lst) in enumerate(zip(preds, rel["relevant_images"])):
        assert k // 5 in lst  # own image
        assert lst == sorted(set(lst))
        brute = [i for i, s in enumerate(scenes) if caption_matches(pred, s)]
        assert lst == brute
        sizes_by_kind.setdefault(pred["kind"], []).append(len(lst))
    # real false negatives: many non-scene captions match several images ...
    for kind in ("object", "count"):
        assert np.mean(np.array(sizes_by_kind[kind]) > 1) > 0.5
    assert max(max(v) for v in sizes_by_kind.values()) > 5
    # ... while a fully specified scene caption usually matches only its own image
    assert np.mean(np.array(sizes_by_kind["scene"]) == 1) > 0.7
    val = _load(world["relevance_val"])
    assert val["annotation"] == "retrieval_val.json" and val["num_images"] == SMALL["n_val"]
    assert compute_relevance([], scenes) == []


def test_graded_relevance_file(world: dict[str, Path]) -> None:
    from vlp.data.formats import load_graded_relevance, load_retrieval_split

    entries = _load(world["scenes"])["splits"]["test"]
    scenes = [scene_from_dict(e) for e in entries]
    preds = [c["predicate"] for e in entries for c in e["captions"]]
    graded = np.load(world["relevance_graded_test"])
    assert graded.dtype == np.float32 and graded.shape == (5 * SMALL["n_test"], SMALL["n_test"])
    assert np.array_equal(graded, compute_graded_relevance(preds, scenes))
    exact = np.zeros(graded.shape, dtype=bool)
    for k, lst in enumerate(_load(world["relevance_test"])["relevant_images"]):
        exact[k, lst] = True
    assert np.array_equal(graded == 1.0, exact)
    assert 0.0 < graded[~exact].mean() < 1.0  # partial credit for the other images
    split = load_retrieval_split(world["retrieval_test"])
    assert load_graded_relevance(world["relevance_graded_test"], split).shape == graded.shape
    val = np.load(world["relevance_graded_val"])
    assert val.shape == (5 * SMALL["n_val"], SMALL["n_val"])


def test_determinism(world: dict[str, Path], tmp_path: Path) -> None:
    again = generate_world(tmp_path / "again", seed=3, **SMALL)
    for key in world:
        if key == "root":
            continue
        assert again[key].read_bytes() == world[key].read_bytes(), key
    for split in ("train", "val", "test"):
        for p in sorted((world["root"] / "images" / split).iterdir()):
            assert (again["root"] / "images" / split / p.name).read_bytes() == p.read_bytes()
    other = generate_world(tmp_path / "other", seed=4, **SMALL)
    assert other["scenes"].read_bytes() != world["scenes"].read_bytes()
    assert other["pretrain"].read_bytes() != world["pretrain"].read_bytes()
    a = np.asarray(Image.open(world["root"] / "images/test/test_000000.png"))
    b = np.asarray(Image.open(other["root"] / "images/test/test_000000.png"))
    assert not np.array_equal(a, b)


def test_regenerating_smaller_world_removes_stale_images(tmp_path: Path) -> None:
    small = dict(SMALL, n_train=4, n_val=2, n_test=3)
    generate_world(tmp_path, seed=0, **small)
    paths = generate_world(tmp_path, seed=0, **dict(small, n_train=2))
    assert sorted(p.name for p in (tmp_path / "images" / "train").iterdir()) == ["train_000000.png", "train_000001.png"]
    assert len(_load(paths["pretrain"])) == 2
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_generic_mix_share_and_captions(world: dict[str, Path], share: float, tmp_path: Path) -> None:
    root = world["root"]
    pre = _load(world["pretrain"])
    mix = _load(write_generic_mix(root, share, seed=1))
    assert [e["image"] for e in mix] == [e["image"] for e in pre]
    generic = [isinstance(e["caption"], list) for e in mix]
    for e, p, g in zip(mix, pre, generic):
        assert e["caption"] == (p["caption"][1:] if g else p["caption"][0])
    n = len(mix)
    assert sum(generic) == {0.0: 0, 1.0: n}.get(share, sum(generic))
    if share == 0.5:
        assert 0 < sum(generic) < n
    # elsewhere: absolute image paths that still resolve
    other = _load(write_generic_mix(root, share, seed=1, out=tmp_path / "mix.json"))
    assert all(Path(e["image"]).is_file() for e in other)


# SHA-256 of the files of generate_world(root, seed=0, n_train=40, n_val=4, n_test=20), computed
# with the code before the helper split and the caption-kind files existed: n_helper=0 (the
# default) must leave every one of them byte-identical.
REFERENCE_SHA256 = {
    "helper.json": "97079ec6fe01bcec6e286cfd75b1256936ef88cf8e74dfbaf1cac87037dd925d",
    "pretrain.json": "36f480ada10266bc66e1bbefc13923df2848a2fb50b3ccfe7127d27ee4f12260",
    "relevance_graded_test.npy": "c007e752d6655d3555ab390149cd59a8d0684814c83bfd3490d642f6299505cd",
    "relevance_graded_val.npy": "66b40beba46d815bd89b1353eafa618d33372fb71a43e4b25e0c13e0edd5c363",
    "relevance_test.json": "29b7d7c021260b7a67aadf4112174514c058f3e6e1c77ddc2c0745ea1d3ff81d",
    "relevance_val.json": "f1c935473de559b9871d9b7d6d0fb0a6d9e576b31a2ed9698ce72e723af1d9b0",
    "retrieval_test.json": "903082ee722ffb06aa071e87205725f7d8194741c40a651297d886fc6d622497",
    "retrieval_train.json": "26d8157575b9b639cc0cd9b268e6c2d12135a6856c45daddabb0de36eccf9813",
    "retrieval_val.json": "eba98fb37ab0bf1755569c5d2f3784b95fdaeafb1c390c4ab6eddaaf7466aab6",
    "scenes.json": "734301b0c9d67bd057a1a0c6418fc47ae911c78bc6f5b8fb66364f152adfa356",
}
REFERENCE_WORLD = dict(seed=0, n_train=40, n_val=4, n_test=20, progress=False)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_default_world_files_are_byte_identical_to_before_the_helper_split(tmp_path: Path) -> None:
    paths = generate_world(tmp_path, **REFERENCE_WORLD)
    assert {name: _sha(tmp_path / name) for name in REFERENCE_SHA256} == REFERENCE_SHA256
    assert "helper_split" not in paths
    assert not (tmp_path / "helper_split.json").exists() and not (tmp_path / "images" / "helper").exists()


def test_helper_split_disjoint_images_every_kind(tmp_path: Path) -> None:
    base = generate_world(tmp_path / "base", **REFERENCE_WORLD)
    paths = generate_world(tmp_path / "h", **REFERENCE_WORLD, n_helper=6)
    root = paths["root"]
    # the other files do not depend on n_helper; scenes.json only gains the helper split
    for key, path in base.items():
        if key not in ("root", "scenes"):
            assert paths[key].read_bytes() == path.read_bytes(), key
    scenes, scenes_base = _load(paths["scenes"]), _load(base["scenes"])
    assert {k: v for k, v in scenes["splits"].items() if k != "helper"} == scenes_base["splits"]
    records = scenes["splits"]["helper"]
    helper = _load(paths["helper_split"])
    assert paths["helper_split"] == root / "helper_split.json"
    assert [e["image"] for e in helper] == [f"images/helper/helper_{i:06d}.png" for i in range(6)]
    assert sorted(p.name for p in (root / "images" / "helper").iterdir()) == [f"helper_{i:06d}.png" for i in range(6)]
    kinds = set()
    for e, r in zip(helper, records):
        assert e["image"] == r["image"] and e["caption"] == [c["text"] for c in r["captions"]]
        assert len(e["caption"]) == 5
        for c in r["captions"]:
            assert caption_matches(c["predicate"], scene_from_dict(r))
            kinds.add(c["predicate"]["kind"])
    assert kinds == {"scene", "object", "relation", "count"}
    # images of their own: no helper scene is the scene of a training image at the same index
    train = scenes["splits"]["train"]
    assert all(h["objects"] != t["objects"] for h, t in zip(records, train))
    # regenerating without the split removes its images and file
    again = generate_world(root, **REFERENCE_WORLD)
    assert "helper_split" not in again and not (root / "helper_split.json").exists()
    assert not list((root / "images" / "helper").iterdir())
    assert again["scenes"].read_bytes() == base["scenes"].read_bytes()
    with pytest.raises(ValueError, match="n_helper must be >= 0"):
        generate_world(tmp_path / "bad", **REFERENCE_WORLD, n_helper=-1)


def test_caption_kinds_files(world: dict[str, Path]) -> None:
    entries = _load(world["scenes"])["splits"]
    for split in ("val", "test"):
        kinds = _load(world[f"caption_kinds_{split}"])
        assert kinds["format"] == CAPTION_GROUPS_FORMAT and kinds["annotation"] == f"retrieval_{split}.json"
        assert kinds["labels"] == [c["predicate"]["kind"] for e in entries[split] for c in e["captions"]]
        assert len(kinds["labels"]) == len(_load(world[f"relevance_{split}"])["texts"])
        assert kinds["unions"] == {"generic": ["object", "relation", "count"]}
    labels = _load(world["caption_kinds_test"])["labels"]
    assert labels[::5] == ["scene"] * SMALL["n_test"]  # the scene caption comes first
