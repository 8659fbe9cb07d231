"""Tests for the shapes world (vlp.data.synthetic)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vlp.data.synthetic import (
    write_generic_mix,
    BACKGROUND_RGB,
    COLOR_RGB,
    COLORS,
    SHAPES,
    SIZES,
    CountPred,
    Desc,
    Obj,
    ObjectPred,
    RelationPred,
    Scene,
    ScenePred,
    SceneTable,
    caption_grade,
    caption_matches,
    caption_text,
    compute_graded_relevance,
    compute_relevance,
    generate_world,
    make_captions,
    parse_caption,
    predicate_from_dict,
    render_scene,
    sample_scene,
    scene_from_dict,
)

SMALL = dict(n_train=12, n_val=6, n_test=60, image_size=48, progress=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return generate_world(tmp_path_factory.mktemp("world"), seed=3, **SMALL)


def _load(p: Path):
    return json.loads(p.read_text())


def _sample_scenes(n: int, seed: int = 0) -> list[Scene]:
    rng = random.Random(seed)
    return [sample_scene(rng) for _ in range(n)]


# ---------------------------------------------------------------- scenes / captions


def test_sample_scene_is_valid_and_covers_counts() -> None:
    scenes = _sample_scenes(400)
    counts = Counter(len(s.objects) for s in scenes)
    assert set(counts) == {1, 2, 3, 4}
    assert min(counts.values()) > 60  # roughly uniform
    for s in scenes:
        cells = [(o.row, o.col) for o in s.objects]
        assert len(set(cells)) == len(cells)
        assert cells == sorted(cells)
        for o in s.objects:
            assert o.shape in SHAPES and o.color in COLORS and o.size in SIZES
            assert 0 <= o.row <= 2 and 0 <= o.col <= 2


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


# ---------------------------------------------------------------- hand-worked predicates

RED_CIRCLE = Obj("circle", "red", "large", 1, 0)
BLUE_SQUARE = Obj("square", "blue", "small", 1, 2)
TWO = Scene((RED_CIRCLE, BLUE_SQUARE))
THREE_CIRCLES = Scene(
    (Obj("circle", "red", "small", 0, 0), Obj("circle", "green", "large", 0, 1), Obj("circle", "red", "large", 2, 2))
)


def _rel(a: Desc, r: str, b: Desc) -> dict:
    return RelationPred(a, r, b).to_dict()


def test_relation_predicates() -> None:
    rc, bs = Desc(color="red", shape="circle"), Desc(color="blue", shape="square")
    assert caption_matches(_rel(rc, "left_of", bs), TWO)
    assert not caption_matches(_rel(rc, "right_of", bs), TWO)
    assert caption_matches(_rel(bs, "right_of", rc), TWO)
    assert not caption_matches(_rel(rc, "above", bs), TWO)  # same row
    assert not caption_matches(_rel(rc, "below", bs), TWO)
    assert not caption_matches(_rel(rc, "left_of", Desc(color="green")), TWO)
    # a and b must be distinct objects
    assert not caption_matches(_rel(Desc(shape="circle"), "left_of", Desc(shape="circle")), TWO)
    # THREE_CIRCLES: red small (0,0), green large (0,1), red large (2,2)
    circ = Desc(shape="circle")
    assert caption_matches(_rel(circ, "left_of", circ), THREE_CIRCLES)
    assert caption_matches(_rel(Desc(color="red", size="small"), "above", Desc(color="red", size="large")), THREE_CIRCLES)
    assert not caption_matches(_rel(Desc(color="green"), "below", circ), THREE_CIRCLES)
    assert caption_matches(_rel(Desc(color="green"), "above", Desc(color="red")), THREE_CIRCLES)
    assert not caption_matches(_rel(Desc(color="green"), "above", Desc(color="green")), THREE_CIRCLES)


def test_count_predicates_are_exact() -> None:
    circ = Desc(shape="circle")
    assert not caption_matches(CountPred(2, circ).to_dict(), THREE_CIRCLES)
    assert caption_matches(CountPred(3, circ).to_dict(), THREE_CIRCLES)
    assert caption_matches(CountPred(3, Desc()).to_dict(), THREE_CIRCLES)
    assert caption_matches(CountPred(2, Desc(color="red")).to_dict(), THREE_CIRCLES)
    assert not caption_matches(CountPred(1, Desc(color="red")).to_dict(), THREE_CIRCLES)
    assert caption_matches(CountPred(1, Desc(color="red", size="small")).to_dict(), THREE_CIRCLES)
    assert caption_matches(CountPred(1, circ).to_dict(), TWO)
    assert caption_matches(CountPred(2, Desc()).to_dict(), TWO)
    assert not caption_matches(CountPred(1, Desc()).to_dict(), TWO)
    assert parse_caption("two circles") == CountPred(2, circ).to_dict()


def test_object_predicates() -> None:
    assert caption_matches(ObjectPred(Desc(color="red", shape="circle")).to_dict(), TWO)
    assert caption_matches(ObjectPred(Desc(size="small", color="blue", row=1, col=2)).to_dict(), TWO)
    assert not caption_matches(ObjectPred(Desc(size="small", color="blue", row=1, col=0)).to_dict(), TWO)
    assert not caption_matches(ObjectPred(Desc(size="large", color="blue")).to_dict(), TWO)
    assert not caption_matches(ObjectPred(Desc(color="red", shape="square")).to_dict(), TWO)  # attrs on one object
    assert caption_matches(ObjectPred(Desc(shape="square", row=1, col=2)).to_dict(), TWO)
    assert parse_caption("a small blue shape on the right") == ObjectPred(
        Desc(size="small", color="blue", row=1, col=2)
    ).to_dict()


def test_scene_predicates() -> None:
    pred = ScenePred((BLUE_SQUARE, RED_CIRCLE)).to_dict()  # order does not matter
    assert caption_text(pred) == "a large red circle on the left and a small blue square on the right"
    assert caption_matches(pred, TWO)
    assert not caption_matches(pred, Scene((RED_CIRCLE,)))  # subset
    extra = Scene((Obj("triangle", "green", "small", 0, 0), RED_CIRCLE, BLUE_SQUARE))
    assert not caption_matches(pred, extra)  # superset
    moved = Scene((RED_CIRCLE, Obj("square", "blue", "small", 2, 2)))
    assert not caption_matches(pred, moved)
    resized = Scene((RED_CIRCLE, Obj("square", "blue", "large", 1, 2)))
    assert not caption_matches(pred, resized)
    # a one-object scene caption is a different predicate from any object caption
    single = ScenePred((RED_CIRCLE,)).to_dict()
    assert parse_caption(caption_text(single)) == single
    assert not caption_matches(single, TWO)


def test_predicate_validation() -> None:
    with pytest.raises(ValueError):
        predicate_from_dict({"kind": "object", "object": {"shape": "hexagon"}})
    with pytest.raises(ValueError):
        predicate_from_dict({"kind": "relation", "relation": "near", "a": {}, "b": {}})
    with pytest.raises(ValueError):
        predicate_from_dict({"kind": "scene", "objects": [{"shape": "circle", "color": "red"}]})
    with pytest.raises(ValueError):
        parse_caption("a hexagon")


def test_vectorised_table_agrees_with_reference() -> None:
    scenes = _sample_scenes(150, seed=11)
    rng = random.Random(5)
    preds = [p for s in _sample_scenes(60, seed=12) for _, p in make_captions(s, rng)]
    # also predicates that are false of their source scene
    preds += [CountPred(n, Desc(shape=sh)).to_dict() for n in range(5) for sh in SHAPES]
    table = SceneTable(scenes)
    for p in preds:
        expect = np.array([caption_matches(p, s) for s in scenes])
        assert (table.matches(p) == expect).all(), p


# ---------------------------------------------------------------- graded relevance


def test_graded_scene_captions() -> None:
    pred = ScenePred((RED_CIRCLE, BLUE_SQUARE)).to_dict()
    assert caption_grade(pred, TWO) == 1.0  # true of the image
    # the circle is green instead of red: facts = 4 per object + 1 object count = 9;
    # circle 3/4 (shape, size, cell) + square 4/4 + count 1 -> 8/9
    wrong_colour = Scene((Obj("circle", "green", "large", 1, 0), BLUE_SQUARE))
    assert caption_grade(pred, wrong_colour) == pytest.approx(8 / 9)
    # one extra object: every object fact holds, count credit min(3, 2)/max(3, 2) -> (8 + 2/3) / 9
    extra = Scene((Obj("triangle", "green", "small", 0, 0), RED_CIRCLE, BLUE_SQUARE))
    assert caption_grade(pred, extra) == pytest.approx((8 + 2 / 3) / 9)
    # unrelated: a small yellow triangle at the top left pairs best with the small blue square
    # (size only: 1 fact), the circle pairs with nothing; count 1 of 2 -> (1 + 1/2) / 9 = 1/6
    unrelated = Scene((Obj("triangle", "yellow", "small", 0, 0),))
    assert caption_grade(pred, unrelated) == pytest.approx(1 / 6)
    assert caption_grade(pred, unrelated) < caption_grade(pred, wrong_colour)
    # pairing is one-to-one: the image's one circle stands for one of the two caption circles
    # (4 facts), not also for the other (3 facts): (4 + 0 + count 1/2) / 9 = 1/2
    twice = ScenePred((RED_CIRCLE, Obj("circle", "red", "large", 0, 0))).to_dict()
    assert caption_grade(twice, Scene((RED_CIRCLE,))) == pytest.approx(0.5)


def test_graded_object_relation_count_captions() -> None:
    red_circle = ObjectPred(Desc(color="red", shape="circle")).to_dict()
    assert caption_grade(red_circle, TWO) == 1.0
    assert caption_grade(red_circle, Scene((Obj("circle", "blue", "large", 0, 0),))) == 0.5  # colour wrong
    assert caption_grade(red_circle, Scene((Obj("square", "blue", "large", 0, 0),))) == 0.0  # unrelated
    # facts bind to one object: TWO has a red circle and a blue square, no red square -> 1/2
    assert caption_grade(ObjectPred(Desc(color="red", shape="square")).to_dict(), TWO) == 0.5
    # a cell phrase is one fact: "a small blue shape at the bottom right" on TWO -> 2 of 3
    assert caption_grade(ObjectPred(Desc(size="small", color="blue", row=2, col=2)).to_dict(), TWO) == pytest.approx(2 / 3)

    rc, bs = Desc(color="red", shape="circle"), Desc(color="blue", shape="square")
    assert caption_grade(_rel(rc, "left_of", bs), TWO) == 1.0
    assert caption_grade(_rel(rc, "right_of", bs), TWO) == pytest.approx(4 / 5)  # relation false
    assert caption_grade(_rel(rc, "left_of", bs), Scene((RED_CIRCLE,))) == pytest.approx(2 / 5)  # no second object
    assert caption_grade(_rel(Desc(shape="circle"), "left_of", Desc(shape="circle")), TWO) == pytest.approx(2 / 3)

    circles = Desc(shape="circle")
    assert caption_grade(CountPred(3, circles).to_dict(), THREE_CIRCLES) == 1.0
    # "two circles" with 3 circles: shape fact 1 + count credit 2/3 over 2 facts -> 5/6
    assert caption_grade(CountPred(2, circles).to_dict(), THREE_CIRCLES) == pytest.approx(5 / 6)
    # "one red shape" with 2 red shapes -> (1 + 1/2) / 2
    assert caption_grade(CountPred(1, Desc(color="red")).to_dict(), THREE_CIRCLES) == pytest.approx(0.75)
    assert caption_grade(CountPred(2, Desc(shape="square")).to_dict(), THREE_CIRCLES) == 0.0
    assert caption_grade(CountPred(4, Desc()).to_dict(), THREE_CIRCLES) == pytest.approx(3 / 4)  # "four shapes"
    assert caption_grade(CountPred(0, Desc(color="red")).to_dict(), THREE_CIRCLES) == 0.0
    assert caption_grade(CountPred(0, Desc(color="blue")).to_dict(), THREE_CIRCLES) == 1.0


def test_graded_vectorised_agrees_with_reference_and_is_one_iff_true() -> None:
    scenes = _sample_scenes(120, seed=21) + [Scene(())]
    rng = random.Random(6)
    preds = [p for s in _sample_scenes(40, seed=22) for _, p in make_captions(s, rng)]
    preds += [CountPred(n, Desc(shape=sh)).to_dict() for n in range(5) for sh in SHAPES]
    preds += [ObjectPred(Desc()).to_dict(), ScenePred(()).to_dict()]
    graded = compute_graded_relevance(preds, scenes)
    assert graded.dtype == np.float32 and graded.shape == (len(preds), len(scenes))
    for k, p in enumerate(preds):
        ref = np.array([caption_grade(p, s) for s in scenes])
        assert np.allclose(graded[k], ref, atol=1e-6), p
        true = np.array([caption_matches(p, s) for s in scenes])
        assert ((graded[k] == 1.0) == true).all() and ((ref == 1.0) == true).all(), p
    assert ((graded >= 0) & (graded <= 1)).all()


# ---------------------------------------------------------------- rendering


@pytest.mark.parametrize("size", [64, 96, 128, 256])
def test_render_colours(size: int) -> None:

    cell = size / 3
    for k, scene in enumerate(_sample_scenes(25, seed=size)):
        img = render_scene(scene, size, random.Random(k))
        assert img.size == (size, size) and img.mode == "RGB"
        arr = np.asarray(img)
        occupied = {(o.row, o.col): o for o in scene.objects}
        for r in range(3):
            for c in range(3):
                y0, y1 = int(r * cell) + 1, int((r + 1) * cell) - 1
                x0, x1 = int(c * cell) + 1, int((c + 1) * cell) - 1
                block = arr[y0:y1, x0:x1].reshape(-1, 3)
                o = occupied.get((r, c))
                if o is None:
                    assert (block == BACKGROUND_RGB).all()
                    continue
                centre = tuple(arr[int((r + 0.5) * cell), int((c + 0.5) * cell)])
                if o.size == "large":
                    assert centre == COLOR_RGB[o.color]
                colours = {tuple(px) for px in np.unique(block, axis=0)}
                assert colours == {COLOR_RGB[o.color], BACKGROUND_RGB}
                frac = (block == COLOR_RGB[o.color]).all(axis=1).mean()
                assert (0.25 < frac <= 1.0) if o.size == "large" else (0.03 < frac < 0.35), (o, frac)


def test_render_without_rng_is_centred() -> None:
    scene = Scene((Obj("triangle", "yellow", "small", 1, 1),))
    arr = np.asarray(render_scene(scene, 64))
    assert tuple(arr[32, 32]) == COLOR_RGB["yellow"]
    assert tuple(arr[0, 0]) == BACKGROUND_RGB


# ---------------------------------------------------------------- world files


def test_world_files_and_formats(world: dict[str, Path]) -> None:
    root = world["root"]
    assert set(world) == {
        "pretrain", "helper", "retrieval_train", "retrieval_val", "retrieval_test",
        "relevance_val", "relevance_test", "relevance_graded_val", "relevance_graded_test", "scenes", "root",
        "vqa_train", "vqa_val", "vqa_test", "vqa_test_annotations", "answer_list", "nlvr_train", "nlvr_dev", "nlvr_test",
    }
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
