"""Helper caches and LTD targets are keyed by what a shard sample carries (its ``image_key`` and
caption text), never by where its shard lies: a shard set read from another place (a copy, another
mount; an object-storage URL reads the same members) finds the features of the same cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from tests.data.test_img2dataset_shards import write_img2dataset
from tests.data.test_shards import shard_data
from tests.helpers import NO_TASKS
from vlp.data.formats import load_pairs
from vlp.data.shard_writer import write_shards
from vlp.data.shards import ShardLoader
from vlp.features.helper_cache import HelperCache, cache_rows, write_cache
from vlp.features.targets import LatentTargets, write_targets


def rows(n: int) -> torch.Tensor:
    """[n, 1] fp32: each row's feature is its row number."""
    return torch.arange(n, dtype=torch.float32)[:, None]


def features(folder: Path, keys: list[str], texts: list[str]) -> tuple[HelperCache, LatentTargets]:
    """A helper cache of ``keys`` and ``texts`` and LTD targets of ``texts``, written and loaded."""
    meta = {"kind": "learned", "helper": "test", "helper_init": "random"}
    cache = write_cache(folder / "cache", keys, rows(len(keys)), texts, rows(len(texts)), meta)
    targets = write_targets(folder / "targets.safetensors", texts, -rows(len(texts)), "test", [])
    return HelperCache.load(cache), LatentTargets.load(targets)


def items_of(shards: Path, cache: HelperCache, targets: LatentTargets, batch_size: int = 4) -> list[dict]:
    """An epoch's items (no image transform) of the shards in ``shards`` with ``cache`` and ``targets``."""
    data = shard_data([shards], batch_size=batch_size)
    ld = ShardLoader(data, lambda im: torch.zeros(1), lambda it: it, helper_cache=cache, targets=targets, verbose=False)
    return [it for batch in ld for it in batch]


def test_vlp_shards_moved_elsewhere_find_the_cache_of_their_annotations(make_world, tmp_path: Path) -> None:
    world = make_world("keys", seed=0, n_train=8, n_val=0, n_test=0, image_size=32, **NO_TASKS)["pretrain"]
    _, keys, texts = cache_rows(load_pairs([world]))
    cache, targets = features(tmp_path, keys, texts)  # as `vlp cache-helper-features` / `make-targets` key them
    made = write_shards([world], tmp_path / "made", size=16, max_per_shard=3, show_progress=False)
    moved = shutil.copytree(made, tmp_path / "elsewhere" / "renamed")
    shutil.rmtree(made)
    items = items_of(moved, cache, targets)
    assert len(items) == len(load_pairs([world])) * 5 == 40
    for it in items:
        assert it["helper_text"].item() == texts.index(it["caption"]) == -it["ltd_target"].item()
    assert sorted({int(it["helper_image"].item()) for it in items}) == list(range(len(keys)))


def test_img2dataset_shards_are_keyed_by_their_member_keys(tmp_path: Path) -> None:
    made = write_img2dataset(tmp_path / "made", shards=2, per_shard=3)
    keys = [f"{s:05d}{j:04d}" for s in range(2) for j in range(3)]
    texts = sorted(f"a photo number {i}" for i in range(6))
    cache, targets = features(tmp_path, keys, texts)
    items = items_of(shutil.copytree(made, tmp_path / "mirror" / "cc"), cache, targets, 2)
    assert len(items) == 6
    for it in items:
        i = int(it["caption"].rsplit(" ", 1)[1])  # image i of shard i // 3, member key shard * 10^4 + i % 3
        assert it["helper_image"].item() == keys.index(f"{i // 3:05d}{i % 3:04d}") == i
        assert it["helper_text"].item() == texts.index(it["caption"]) == -it["ltd_target"].item()
