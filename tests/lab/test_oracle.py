"""Oracle helper caches (vlp.features.helper_cache) and the world's ground truth (WorldTruth)."""

import json
import shutil

import pytest
import torch

from vlp.errors import DataError
from vlp.features.helper_cache import HelperCache, cache_rows, index_features, write_cache
from vlp.lab.oracle import WorldTruth
from vlp.weights import publish
from vlp.world import caption_matches
from vlp.world.relevance import caption_grade


def write_oracle(path, n_img=3, n_txt=2, relevance=None, **meta):
    rel = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.0]]) if relevance is None else relevance
    keys, texts = [f"img{i}" for i in range(n_img)], [f"a caption {k}" for k in range(n_txt)]
    meta = {"kind": "oracle-graded", **meta}
    return write_cache(path, keys, index_features(n_img), texts, index_features(n_txt), meta, rel)


def test_oracle_cache_round_trip(tmp_path):
    cache = HelperCache.load(write_oracle(tmp_path / "c"))
    assert cache.kind == "oracle-graded" and cache.is_oracle and cache.dim == 1
    assert torch.equal(cache.relevance, torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.0]]))
    img, txt = cache.lookup("img2", "a caption 0")
    assert float(cache.relevance[int(txt), int(img)]) == 0.5


def test_learned_cache_is_the_default_kind(tmp_path):
    write_cache(tmp_path / "c", ["a"], torch.ones(1, 4), ["t"], torch.ones(1, 4), {})
    cache = HelperCache.load(tmp_path / "c")
    assert cache.kind == "learned" and not cache.is_oracle and cache.relevance is None


def test_bad_oracle_caches_are_refused(tmp_path):
    with pytest.raises(DataError, match=r"needs 'relevance' \[2, 3\]"):
        write_oracle(tmp_path / "a", relevance=torch.zeros(3, 2))
    with pytest.raises(DataError, match=r"in \[0, 1\]"):
        write_oracle(tmp_path / "b", relevance=torch.full((2, 3), 2.0))
    with pytest.raises(DataError, match="row indices"):
        write_cache(
            tmp_path / "c",
            ["a"],
            torch.ones(1, 1),
            ["t"],
            torch.zeros(1, 1),
            {"kind": "oracle-exact"},
            torch.ones(1, 1),
        )
    write_oracle(tmp_path / "d")
    index = json.loads((tmp_path / "d" / "index.json").read_text())
    (tmp_path / "d" / "index.json").write_text(json.dumps({**index, "kind": "oracle"}))
    with pytest.raises(DataError, match="index.json is .* bytes, the manifest says"):  # an edit since the save
        HelperCache.load(tmp_path / "d")
    stage = shutil.copytree(tmp_path / "d", tmp_path / "stage", ignore=shutil.ignore_patterns("manifest.json"))
    publish(stage, tmp_path / "sealed")  # the same edit, written with its manifest: the kind rule itself
    with pytest.raises(DataError, match="key 'kind' is 'oracle'"):
        HelperCache.load(tmp_path / "sealed")


@pytest.fixture(scope="module")
def world(make_world):
    return make_world(seed=0, n_train=40, n_val=4, n_test=20)["root"]


def test_world_truth_is_caption_matches_and_caption_grade(world):
    from vlp.data.formats import load_pairs

    truth = WorldTruth.load(world)
    paths, keys, texts = cache_rows(load_pairs([world / "pretrain.json"]))
    images = [paths[k] for k in keys]
    exact, graded = truth.relevance(texts, images), truth.relevance(texts, images, graded=True)
    assert exact.shape == (len(texts), 40) and exact.sum() > len(texts)  # more true pairs than own pairs
    for t, text in enumerate(texts):
        pred = truth.predicate(text)
        for i, image in enumerate(images):
            scene = truth.scene(image)
            assert exact[t, i] == float(caption_matches(pred, scene))
            if i % 7 == 0:
                assert graded[t, i] == pytest.approx(caption_grade(pred, scene), abs=1e-6)
    assert ((graded == 1.0) == (exact == 1.0)).all()
    with pytest.raises(DataError, match="not an image of this world"):
        truth.scene("elsewhere/cat.png")
    with pytest.raises(DataError, match="not a shapes-world caption"):
        truth.predicate("a photo of a cat")
    assert truth.predicate("a red circle")["kind"] == "object"  # parsed: any caption of the grammar
