"""The SRCL helper cache and the LTD targets built from shard sets (issue 42, item 7): from a vlp shard
folder, an img2dataset folder and the same img2dataset shards over HTTP (a loopback server). A
ShardLoader epoch over those shards finds every feature; a URL shard set is checked against the
shards a file records, without a request for a tar; a stale file fails with one line."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.data.shard_servers import S3_KEY, S3_SECRET, http_server, s3_server
from tests.data.test_img2dataset_shards import write_img2dataset
from tests.data.test_shards import shard_data
from tests.helpers import NO_TASKS
from vlp.cli import main
from vlp.data.formats import load_pairs
from vlp.data.shard_writer import write_shards
from vlp.data.shards import ShardLoader
from vlp.errors import DataError
from vlp.features.cache_writer import write_feature_cache
from vlp.features.encoders import FeatureEncoder
from vlp.features.helper_cache import HelperCache, write_cache
from vlp.features.targets import LatentTargets, write_targets
from vlp.runs.training.features import run_make_targets

BRACE = "{00000..00003}.tar"


def preprocess(image: Any) -> torch.Tensor:
    """[3, 4, 4]: the image's pixels at 4 x 4."""
    return torch.from_numpy(np.asarray(image.resize((4, 4)), dtype=np.float32)).permute(2, 0, 1) / 255


def encode_text(texts: list[str]) -> torch.Tensor:
    """[N, 2]: each caption's length and character sum (distinct for the test captions)."""
    return torch.tensor([[len(t), sum(map(ord, t))] for t in texts], dtype=torch.float32)


#: a helper whose features are plain functions of the image pixels and caption text
ENCODER = FeatureEncoder(
    preprocess,
    lambda images: images.flatten(1),
    encode_text,
    {"kind": "learned", "helper": "test", "helper_init": "random"},
)


def build(out: Path, data: list[str]) -> HelperCache:
    return HelperCache.load(write_feature_cache(out, data, ENCODER, batch_size=4, show_progress=False))


def loader(data: list[str], cache: Optional[HelperCache], targets: Optional[LatentTargets] = None, **kw: Any):
    stream = shard_data(data, batch_size=2, **kw)
    return ShardLoader(stream, preprocess, lambda it: it, helper_cache=cache, targets=targets, verbose=False)


def check_epoch(data: list[str], cache: HelperCache, targets: Optional[LatentTargets] = None) -> int:
    """An epoch over ``data`` with ``cache`` (and ``targets``): every item's helper features are the
    helper's of its own image and caption (and its LTD target the file's row of its caption)."""
    items = [it for batch in loader(data, cache, targets) for it in batch]
    for it in items:
        assert torch.equal(it["helper_image"], it["image"].flatten())
        assert torch.equal(it["helper_text"], encode_text([it["caption"]])[0])
        if targets is not None:
            assert torch.equal(it["ltd_target"], targets.lookup(it["caption"]))
    return len(items)


@pytest.fixture(scope="module")
def sets(make_world, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A shapes world's annotation file, its vlp shard folder and an img2dataset folder."""
    root = tmp_path_factory.mktemp("sets")
    ann = make_world("shardcache", seed=0, n_train=8, n_val=0, n_test=0, image_size=32, **NO_TASKS)["pretrain"]
    vlp = write_shards([ann], root / "vlp", size=16, max_per_shard=3, show_progress=False)
    return {"ann": ann, "vlp": vlp, "cc": write_img2dataset(root / "cc")}


def test_a_cache_of_a_vlp_shard_folder_has_the_annotation_caches_keys_and_captions(sets, tmp_path: Path) -> None:
    by_file = build(tmp_path / "file", [str(sets["ann"])])
    by_shards = build(tmp_path / "shards", [str(sets["vlp"])])
    assert list(by_shards.image_index) == list(by_file.image_index)  # FILE:KEY, sorted
    assert list(by_shards.text_index) == list(by_file.text_index) and torch.equal(by_shards.text, by_file.text)
    tars = sorted(str(t.resolve()) for t in sets["vlp"].glob("*.tar"))
    assert by_shards.meta["data"] == [str(sets["vlp"])] and by_shards.meta["shards"] == tars
    assert "shards" not in by_file.meta and by_file.shards is None
    assert check_epoch([str(sets["vlp"])], by_shards) == len(load_pairs([sets["ann"]])) * 5 == 40
    mixed = build(tmp_path / "mixed", [str(sets["ann"]), str(sets["cc"])])  # annotation files and shards together
    assert list(mixed.image_index) == sorted(
        [*by_file.image_index, *(f"{s:05d}{j:04d}" for s in range(4) for j in range(5))]
    )
    assert mixed.shards == sorted(str(t.resolve()) for t in sets["cc"].glob("*.tar"))


def test_img2dataset_caches_from_a_folder_and_over_http_are_equal_and_cover_their_epochs(sets, tmp_path) -> None:
    local = build(tmp_path / "local", [str(sets["cc"])])
    assert list(local.image_index) == [f"{s:05d}{j:04d}" for s in range(4) for j in range(5)]
    assert check_epoch([str(sets["cc"])], local) == 20
    with http_server(sets["cc"]) as server:
        entry = f"{server.url}/{BRACE}"
        remote = build(tmp_path / "remote", [entry])
        assert remote.meta["data"] == [entry]
        assert remote.shards == [f"{server.url}/{s:05d}.tar" for s in range(4)]
        assert list(remote.image_index) == list(local.image_index) and list(remote.text_index) == list(local.text_index)
        assert torch.equal(remote.image, local.image) and torch.equal(remote.text, local.text)
        server.log.clear()
        loader([entry], remote)  # start-up: the stats files only, no tar
        assert server.log and all(r.startswith("GET") and r.endswith("_stats.json") for r in server.log)
        assert check_epoch([entry], remote) == 20


def test_a_cache_of_s3_shards_equals_the_local_one_and_index_json_holds_no_credentials(sets, tmp_path, monkeypatch):
    local = build(tmp_path / "local", [str(sets["cc"])])
    with s3_server(monkeypatch, "shards", sets["cc"]):
        entry = f"s3://shards/{BRACE}"
        remote = build(tmp_path / "remote", [entry])
        assert remote.shards == [f"s3://shards/{s:05d}.tar" for s in range(4)]
        assert torch.equal(remote.image, local.image) and torch.equal(remote.text, local.text)
        assert check_epoch([entry], remote) == 20
    written = b"".join(f.read_bytes() for f in (tmp_path / "remote").iterdir())
    assert S3_KEY.encode() not in written and S3_SECRET.encode() not in written


def test_ltd_targets_from_the_three_shard_sets(sets, tmp_path: Path) -> None:
    def made(name: str, data: list[str]) -> LatentTargets:
        return LatentTargets.load(run_make_targets(data, "all-MiniLM-L6-v2", tmp_path / name, show_progress=False))

    by_file, by_shards = made("file", [str(sets["ann"])]), made("vlp", [str(sets["vlp"])])
    assert (
        torch.equal(by_file.vectors, by_shards.vectors)
        and by_file.header["content_hash"] == by_shards.header["content_hash"]
    )
    assert by_shards.shards == sorted(str(t.resolve()) for t in sets["vlp"].glob("*.tar")) and by_file.shards is None
    local = made("cc", [str(sets["cc"])])
    cache = build(tmp_path / "cache", [str(sets["cc"])])
    assert check_epoch([str(sets["cc"])], cache, local) == 20
    with http_server(sets["cc"]) as server:
        entry = f"{server.url}/{BRACE}"
        remote = made("remote", [entry])
        assert remote.header["data"] == [entry] and remote.shards == [f"{server.url}/{s:05d}.tar" for s in range(4)]
        assert torch.equal(remote.vectors, local.vectors)
        server.log.clear()
        assert check_epoch([entry], build(tmp_path / "rcache", [entry]), remote) == 20


def test_files_built_from_fewer_shards_fail_at_start_up_naming_a_missing_shard(sets, tmp_path: Path) -> None:
    with http_server(sets["cc"]) as server:
        fewer, entry = f"{server.url}/{{00000..00002}}.tar", f"{server.url}/{BRACE}"
        cache = build(tmp_path / "cache", [fewer])
        targets = LatentTargets.load(run_make_targets([fewer], "minilm", tmp_path / "t", show_progress=False))
        for kw in ({"cache": cache}, {"cache": None, "targets": targets}):
            server.log.clear()
            with pytest.raises(DataError) as e:
                loader([entry], **kw)
            msg = str(e.value)
            assert "\n" not in msg and f"not built from shard {server.url}/00003.tar" in msg, msg
            assert (
                "1 of the 4 URL shards" in msg and ("cache-helper-features" if kw["cache"] else "make-targets") in msg
            )
            assert not any(r.endswith(".tar") for r in server.log)  # decided without reading a tar
        with pytest.raises(DataError, match="built from annotation files, which cannot be checked"):
            loader([entry], build(tmp_path / "ann", [str(sets["ann"])]))
    local_fewer = build(tmp_path / "local", [str(sets["cc"] / "{00000..00002}.tar")])  # local: checked sample by sample
    with pytest.raises(DataError, match=r"lacks 5 images and 5 captions .*00003\.tar sample 000030000"):
        loader([str(sets["cc"])], local_fewer)


def test_a_lookup_miss_mid_run_is_one_error_naming_shard_key_and_cache(sets, tmp_path: Path) -> None:
    full = build(tmp_path / "full", [str(sets["cc"])])
    keys = [k for k in full.image_index if k != "000010002"]  # a stale cache: the shard changed after it was built
    rows = [full.image_index[k] for k in keys]
    with http_server(sets["cc"]) as server:
        entry = f"{server.url}/{BRACE}"
        meta = {**full.meta, "shards": [f"{server.url}/{s:05d}.tar" for s in range(4)]}
        stale = write_cache(tmp_path / "stale", keys, full.image[rows], list(full.text_index), full.text, meta)
        for on_bad in ("raise", "skip"):  # never taken for a bad sample
            with pytest.raises(DataError) as e:
                list(loader([entry], HelperCache.load(stale), on_bad=on_bad))
            msg = str(e.value)
            assert "\n" not in msg and msg.startswith(f"{server.url}/00001.tar sample 000010002: "), msg
            assert f"helper feature cache {stale} has no entry for this sample (image key '000010002'" in msg
        captions = [c for c in full.text_index if c != "a photo number 7"]  # sample 000010002's
        targets = write_targets(tmp_path / "t", captions, torch.ones(len(captions), 2), "test", [entry], meta["shards"])
        with pytest.raises(DataError) as e:
            list(loader([entry], None, LatentTargets.load(targets), on_bad="skip"))
        assert str(e.value).startswith(f"{server.url}/00001.tar sample 000010002: latent targets {targets} has no ")
        assert "caption 'a photo number 7'" in str(e.value)


def test_the_commands_take_shard_entries(sets, tmp_path: Path, capsys) -> None:
    from tests.helpers import load_script

    config, weights = load_script("scripts/make_tiny_open_clip.py").write_tiny_open_clip(tmp_path / "helper")
    copy = shutil.copytree(sets["cc"], tmp_path / "cc")
    with http_server(copy) as server:
        entry = f"{server.url}/{BRACE}"
        out = tmp_path / "cache"
        argv = ["--helper", f"open_clip:{config}/{weights}", "--data", entry, "--out", str(out), "--batch-size", "8"]
        assert main(["cache-helper-features", *argv]) == 0
        assert main(["make-targets", "--data", entry, "--out", str(tmp_path / "t.safetensors")]) == 0
        index = json.loads((out / "index.json").read_text())
        assert index["data"] == [entry] and len(index["shards"]) == 4 and index["num_images"] == 20
        cache = HelperCache.load(out)
        assert (
            torch.allclose(cache.image.norm(dim=1), torch.ones(20))
            and F.cosine_similarity(cache.image[:1], cache.image[1:]).lt(1).all()
        )
        server.log.clear()
        targets = LatentTargets.load(tmp_path / "t.safetensors")
        ld = loader([entry], cache, targets)
        assert not any(r.endswith(".tar") for r in server.log)
        assert sum(len(b) for b in ld) == 20
    keyed = tmp_path / "urls.safetensors"  # --caption-key: img2dataset's caption under another key of {key}.json
    assert main(["make-targets", "--data", str(sets["cc"]), "--caption-key", "url", "--out", str(keyed)]) == 0
    by_url = LatentTargets.load(keyed)
    assert by_url.header["num_captions"] == 20 and by_url.lookup("http://example.com/3.jpg").shape == (384,)
    wrong = main(
        ["cache-helper-features", "--oracle", "exact", "--world", str(tmp_path), "--data", entry, "--out", "x"]
    )
    assert wrong == 2 and "--oracle reads the world's annotation files, not shards" in capsys.readouterr().err


def rewrite_member(tar: Path, name: str, data: bytes) -> None:
    """``tar`` written again with member ``name`` holding ``data``."""
    with tarfile.open(tar) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(tar, "w") as tf:
        for m, body in members:
            body = data if m.name == name else body
            m.size = len(body)
            tf.addfile(m, io.BytesIO(body))


def test_bad_samples_are_left_out_a_broken_shard_or_a_repeated_key_stops_the_build(sets, tmp_path, capsys) -> None:
    cc = shutil.copytree(sets["cc"], tmp_path / "cc")
    rewrite_member(cc / "00001.tar", "000010001.jpg", b"not an image")
    rewrite_member(cc / "00002.tar", "000020003.json", b"{not json")
    cache = build(tmp_path / "cache", [str(cc)])
    assert (
        len(cache.image_index) == 18 and "000010001" not in cache.image_index and "000020003" not in cache.image_index
    )
    err = capsys.readouterr().err
    assert "left out a bad image: " in err and "00001.tar sample 000010001" in err
    assert "left out a malformed sample: " in err and "sample '000020003': invalid 000020003.json" in err
    broken = shutil.copytree(sets["cc"], tmp_path / "broken")
    data = (broken / "00002.tar").read_bytes()
    (broken / "00002.tar").write_bytes(data[: len(data) // 2])
    with pytest.raises(
        DataError, match=r"00002\.tar: cannot read shard: .*; a feature file is built from whole shards only"
    ):
        build(tmp_path / "b", [str(broken)])
    with pytest.raises(DataError, match="image key '000000000' is held by two samples"):
        build(tmp_path / "twice", [str(sets["cc"]), str(cc)])
