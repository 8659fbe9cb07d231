"""Webdataset shards: the writer, and the stream's splitting, reshuffling, equal batch counts, resume and
corrupt members (bad samples)."""

from __future__ import annotations

import io
import json
import math
import random
import re
import shutil
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from tests.data.shard_servers import http_server
from tests.helpers import NO_TASKS
from vlp.config import DataConfig
from vlp.data.formats import load_pairs
from vlp.data.shard_format import SIZES_FILE, ShardInfo, iter_shard, read_sizes
from vlp.data.shard_writer import write_shards
from vlp.data.shards import ShardLoader, ShardStream
from vlp.errors import ConfigError, DataError
from vlp.features.helper_cache import HelperCache
from vlp.features.targets import LatentTargets, caption_key

IMAGES, CAPTIONS = 24, 5  # the world: 24 images x 5 captions = 120 pairs


@pytest.fixture(scope="module")
def world(make_world) -> Path:
    return make_world("shards", seed=0, n_train=IMAGES, n_val=0, n_test=0, image_size=32, **NO_TASKS)["pretrain"]


@pytest.fixture(scope="module")
def shards(world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 shards of 3 images (15 pairs) each, images resized 32 -> 16 px."""
    out = tmp_path_factory.mktemp("shards") / "sh"
    return write_shards([world], out, size=16, max_per_shard=3, show_progress=False)


def collect(items: list[dict]) -> dict:
    """A test collator that keeps what we compare: ids, captions, images, replaced bad samples."""
    return {
        "ids": [it["image_id"] for it in items],
        "caps": [it["caption"] for it in items],
        "images": torch.stack([it["image"] for it in items]),
        "bad": sum(it["bad_samples"] for it in items),
    }


#: these tests' short loader keywords -> the data config keys they stand for
DATA_KEYS = {"on_bad": "on_bad_sample", "num_samples": "train_num_samples"}
#: the keywords that are ShardLoader's own, not data config keys
LOADER_KEYS = ("transform", "collator", "seed", "rank", "world_size", "helper_cache", "targets", "verbose")


def shard_data(dirs: list, **kw: Any) -> DataConfig:
    """The ``data`` section of a webdataset run over ``dirs`` with the keys ``kw`` (short names of
    :data:`DATA_KEYS`; ``timeouts``: a :class:`UrlTimeouts`)."""
    timeouts = kw.pop("timeouts", None)
    if timeouts is not None:
        kw.update(url_read_timeout_s=timeouts.read_s, url_shard_timeout_s=timeouts.shard_s)
    keys = {DATA_KEYS.get(k, k): v for k, v in kw.items()}
    return DataConfig(train=[str(d) for d in dirs], format="webdataset", **keys)


def loader(dirs: list, **kw: Any) -> ShardLoader:
    # a random transform: resume must reproduce even the augmentations
    args = dict(
        transform=T.Compose([T.RandomResizedCrop(8, scale=(0.5, 1.0)), T.ToTensor()]),
        collator=collect,
        batch_size=4,
        shuffle_buffer=8,
        seed=3,
        verbose=False,
    )
    args.update(kw)
    own = {k: args.pop(k) for k in LOADER_KEYS if k in args}
    return ShardLoader(shard_data(dirs, **args), own.pop("transform"), own.pop("collator"), **own)


def vlp_shard(path: Path, images: int = 1) -> ShardInfo:
    return ShardInfo(path, images, images, 0)


def pairs_of(batches: list[dict]) -> list[tuple[int, str]]:
    return [(i, c) for b in batches for i, c in zip(b["ids"], b["caps"])]


def source_pairs(world: Path) -> Counter:
    samples = load_pairs([world])
    keys = sorted({s.image_key for s in samples})
    return Counter((keys.index(s.image_key), c) for s in samples for c in s.captions)


# ----------------------------------------------------------------------------- writer


def test_writer_counts_captions_ids_and_sizes(world: Path, shards: Path) -> None:
    sizes = json.loads((shards / SIZES_FILE).read_text())
    assert sorted(sizes) == [f"shard-{i:05d}.tar" for i in range(math.ceil(IMAGES / 3))]
    assert sum(v["images"] for v in sizes.values()) == IMAGES
    assert sum(v["pairs"] for v in sizes.values()) == IMAGES * CAPTIONS
    written: Counter = Counter()
    for name, v in sizes.items():
        raws = list(iter_shard(ShardInfo(shards / name, v["images"], v["pairs"], 0), check_count=True))
        assert sum(len(r.meta["captions"]) for r in raws) == v["pairs"]
        for r in raws:
            written.update((r.meta["image_id"], c) for c in r.meta["captions"])
            assert r.meta["source"] == str(world)
            with Image.open(io.BytesIO(r.image)) as im:
                assert im.format == "JPEG" and im.size == (16, 16)  # 32 px squares, shorter side -> 16
    assert written == source_pairs(world)  # every caption exactly once, ids = sorted image keys
    first = [r.meta["image_id"] for r in iter_shard(vlp_shard(shards / "shard-00000.tar"))]
    assert first != sorted(first) or first[0] != 0  # globally shuffled before writing


def test_writer_resizes_the_shorter_side_and_never_upscales(tmp_path: Path) -> None:
    Image.new("RGB", (40, 20), (200, 10, 10)).save(tmp_path / "wide.png")
    Image.new("RGB", (6, 12), (10, 200, 10)).save(tmp_path / "small.png")
    ann = tmp_path / "a.json"
    ann.write_text(json.dumps([{"image": "wide.png", "caption": "red"}, {"image": "small.png", "caption": ["g", "h"]}]))
    out = write_shards([ann], tmp_path / "out", size=10, show_progress=False)
    got = {}
    for r in iter_shard(vlp_shard(out / "shard-00000.tar")):
        with Image.open(io.BytesIO(r.image)) as im:
            got[tuple(r.meta["captions"])] = im.size
    assert got == {("red",): (20, 10), ("g", "h"): (6, 12)}
    assert json.loads((out / SIZES_FILE).read_text()) == {"shard-00000.tar": {"images": 2, "pairs": 3}}


def test_writer_refuses_a_caption_cleaning_empties(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``vlp make-shards`` does not write a caption the shard reader would drop as bad ('...')."""
    from vlp.cli import main

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    ann = tmp_path / "a.json"
    ann.write_text(json.dumps([{"image": "a.png", "caption": ["red", "..."]}]))
    assert main(["make-shards", "--data", str(ann), "--out", str(tmp_path / "out")]) == 2
    assert f"{ann}: entry 0: key 'caption' item 1 '...' has no words left" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_writer_refuses_a_folder_with_shards(world: Path, shards: Path, capsys: pytest.CaptureFixture) -> None:
    from vlp.cli import main

    before = {p.name: p.read_bytes() for p in shards.iterdir()}
    with pytest.raises(DataError, match="already holds shards"):
        write_shards([world], shards, size=16, show_progress=False)
    assert main(["make-shards", "--data", str(world), "--out", str(shards)]) == 2
    assert f"vlp: error: {shards} already holds shards" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in shards.iterdir()} == before


def test_writer_puts_img2dataset_stats_beside_each_tar_so_urls_need_no_index(
    shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 54: read by URL, a make-shards folder is counted by its `_stats.json` files: no `vlp data
    index` (VLP_CACHE is empty), no tar read at start-up, and an epoch (one caption drawn per image)
    gives every image once."""
    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "no_index"))
    sizes = json.loads((shards / SIZES_FILE).read_text())
    for name, v in sizes.items():
        stats = json.loads((shards / name.replace(".tar", "_stats.json")).read_text())
        assert stats["successes"] == stats["count"] == v["images"]
    with http_server(shards) as server:
        entry = f"{server.url}/shard-{{00000..{len(sizes) - 1:05d}}}.tar"
        infos = read_sizes([entry])
        assert [s.images for s in infos] == [v["images"] for v in sizes.values()] and all(s.counted for s in infos)
        assert server.log and all(r.startswith("GET") and r.endswith("_stats.json") for r in server.log)
        ld = loader([entry], caption_mode="sample")
        assert len(ld) == IMAGES // 4
        assert sorted(i for b in ld for i in b["ids"]) == list(range(IMAGES))
    assert not (tmp_path / "no_index").exists()


@pytest.mark.parametrize("bad", ["missing", "corrupt"])
def test_writer_bad_image_names_entry_and_path_and_leaves_nothing(tmp_path: Path, bad: str) -> None:
    Image.new("RGB", (8, 8)).save(tmp_path / "ok.png")
    if bad == "corrupt":
        (tmp_path / "nope.png").write_bytes(b"not an image")
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps([{"image": "ok.png", "caption": "a"}, {"image": "nope.png", "caption": "b"}] * 2))
    with pytest.raises(DataError) as e:
        write_shards([ann], tmp_path / "out", size=4, max_per_shard=1, show_progress=False)
    assert f"{ann} entry 1" in str(e.value) and str(tmp_path / "nope.png") in str(e.value)
    assert not (tmp_path / "out").exists()  # no shard, no sizes.json


# ----------------------------------------------------------------------------- stream


def test_two_ranks_two_workers_split_the_epoch(shards: Path) -> None:
    # 8 shards -> 4 readers x 2 shards (30 pairs); 120 // (4 x 2) = 15 batches per rank: worker 0 of
    # each rank yields 8 batches (32 pairs: 30 + 2 of the cycling fill), worker 1 7 (28 of its 30).
    ranks = [loader([shards], rank=r, world_size=2, num_workers=2) for r in (0, 1)]
    assert [len(x) for x in ranks] == [15, 15]
    per_rank = [list(ranks[0]), [b for b in ranks[1]]]  # rank 0 through real DataLoader workers
    for r, batches in enumerate(per_rank):
        assert len(batches) == 15 and all(len(b["ids"]) == 4 for b in batches)
        for w in (0, 1):
            mine = pairs_of(batches[w::2])
            shards_of = ranks[r].stream.reader_shards(0, w)
            expected = {
                (r_.meta["image_id"], c) for s in shards_of for r_ in iter_shard(s) for c in r_.meta["captions"]
            }
            assert len(expected) == 30 and set(mine) <= expected
            assert len(mine) == (32 if w == 0 else 28)
            assert len(set(mine)) == (30 if w == 0 else 28)  # duplicates: the 2-pair cycling fill only
    everyone = [set(pairs_of(b[w::2])) for b in per_rank for w in (0, 1)]
    assert sum(len(s) for s in everyone) == len(set().union(*everyone)) == 116  # readers are disjoint


def test_epochs_reshuffle_and_an_epoch_repeats_exactly(shards: Path) -> None:
    ld = loader([shards])
    py_state, torch_state = random.getstate(), torch.get_rng_state()
    e0 = list(ld)
    assert random.getstate() == py_state  # the caller's RNG streams are untouched
    assert torch.equal(torch.get_rng_state(), torch_state)
    ld.set_epoch(1)
    e1 = list(ld)
    ld.set_epoch(0)
    again = list(ld)
    assert len(e0) == len(e1) == 30
    assert pairs_of(e0) != pairs_of(e1) and sorted(pairs_of(e0)) == sorted(pairs_of(e1))  # all 120, reordered
    assert pairs_of(again) == pairs_of(e0)
    assert all(torch.equal(a["images"], b["images"]) for a, b in zip(again, e0))


@pytest.mark.parametrize("start", [3, 8])
def test_resume_reproduces_the_rest_of_the_epoch(shards: Path, start: int) -> None:
    ld = loader([shards], rank=1, world_size=2, num_workers=2)
    ld.set_epoch(1)
    full = list(ld)
    resumed = loader([shards], rank=1, world_size=2, num_workers=2)
    resumed.load_state_dict({**ld.state_dict(), "epoch": 1, "batches_done": start})
    resumed.set_epoch(1)  # what the training loop calls: keeps the position within the epoch
    rest = list(resumed)
    assert len(rest) == len(full) - start
    for a, b in zip(rest, full[start:]):
        assert a["ids"] == b["ids"] and a["caps"] == b["caps"] and torch.equal(a["images"], b["images"])


def test_resume_skips_without_decoding(shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ld = loader([shards])
    full = list(ld)
    decoded = []
    real = ShardStream._image
    monkeypatch.setattr(ShardStream, "_image", lambda self, u: decoded.append(u) or real(self, u))
    ld.set_position(0, 26)
    rest = list(ld)
    assert len(decoded) == 4 * 4 and pairs_of(rest) == pairs_of(full[26:])
    assert ld.state_dict()["batches_done"] == 0  # the epoch is complete


def test_sample_mode_draws_one_caption_per_image_and_epoch(world: Path, shards: Path) -> None:
    ld = loader([shards], caption_mode="sample")
    assert len(ld) == IMAGES // 4
    e0 = pairs_of(list(ld))
    ld.set_epoch(1)
    e1 = pairs_of(list(ld))
    src = source_pairs(world)
    for e in (e0, e1):
        assert sorted(i for i, _ in e) == list(range(IMAGES)) and all(p in src for p in e)
    assert dict(e0) != dict(e1)  # other captions drawn in another epoch


def test_several_folders_continue_the_image_ids(shards: Path) -> None:
    ld = loader([shards, shards], caption_mode="sample")  # the same folder twice: 48 distinct images
    assert (ld.images, ld.pairs, len(ld)) == (2 * IMAGES, 2 * IMAGES * CAPTIONS, 12)
    assert sorted(i for i, _ in pairs_of(list(ld))) == list(range(2 * IMAGES))


def test_items_carry_helper_features_and_ltd_targets_by_key_and_caption(world: Path, shards: Path) -> None:
    samples = load_pairs([world])
    keys = sorted({s.image_key for s in samples})
    texts = sorted({c for s in samples for c in s.captions})
    rows = lambda n: torch.arange(n, dtype=torch.float)[:, None]  # noqa: E731  feature = row number
    cache = HelperCache(
        rows(len(keys)),
        rows(len(texts)),
        {k: i for i, k in enumerate(keys)},
        {t: i for i, t in enumerate(texts)},
        {},
        Path("cache"),
    )
    targets = LatentTargets(-rows(len(texts)), {caption_key(t): i for i, t in enumerate(texts)}, {}, Path("targets"))
    ld = loader([shards], helper_cache=cache, targets=targets, collator=lambda items: items)
    items = [it for batch in ld for it in batch]
    assert len(items) == IMAGES * CAPTIONS
    for it in items:
        assert it["helper_image"].item() == it["image_id"]  # the cache row of the image's key (sorted keys)
        assert it["helper_text"].item() == texts.index(it["caption"]) == -it["ltd_target"].item()
    del cache.image_index[keys[5]]
    with pytest.raises(DataError, match="helper feature cache cache lacks 1 images"):
        loader([shards], helper_cache=cache)


def test_errors_too_few_shards_missing_sizes_and_bad_config(shards: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError) as e:
        loader([shards], rank=0, world_size=4, num_workers=3)
    msg = str(e.value)
    assert "8 shards" in msg and "world_size 4 x 3" in msg and "12 readers" in msg and "--max-per-shard 2" in msg
    with pytest.raises(DataError, match="no sizes.json.*vlp make-shards"):
        loader([tmp_path])
    with pytest.raises(ConfigError, match="'data.format'"):
        DataConfig(format="tar")
    with pytest.raises(ConfigError, match="'data.caption_mode'"):
        DataConfig(format="webdataset", captions_per_image=2)


def test_stale_sizes_json_is_reported(shards: Path, tmp_path: Path) -> None:
    d = tmp_path / "stale"
    d.mkdir()
    for p in shards.iterdir():
        (d / p.name).write_bytes(p.read_bytes())
    sizes = json.loads((d / SIZES_FILE).read_text())
    sizes["shard-00000.tar"]["images"] = 4
    (d / SIZES_FILE).write_text(json.dumps(sizes))
    with pytest.raises(DataError, match=r"3 samples, but .*sizes.json says 4; .*vlp make-shards"):
        list(iter_shard(vlp_shard(d / "shard-00000.tar", 4), check_count=True))


def test_pretrain_from_shards_end_to_end(shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from vlp.cli import main

    run = tmp_path / "run"
    rc = main(
        [
            "pretrain",
            "--config",
            "configs/pretrain/shapes_tiny.yaml",
            f"output_dir={run}",
            "data.format=webdataset",
            f"data.train=[{shards}]",
            "data.batch_size=4",
            "data.num_workers=0",
            "data.shuffle_buffer=16",
            "train.steps=3",
            "train.log_every=1",
            "train.ckpt_every=0",
            "train.warmup_steps=0",
            "train.progress=false",
            "model.vision.depth=1",
            "model.vision.img_size=32",
            "model.text.layers=1",
            "model.text.fusion_layers=1",
            "model.queue_size=16",
        ]
    )
    assert rc == 0
    assert f"vlp pretrain: {IMAGES * CAPTIONS} pairs, {IMAGES} images" in capsys.readouterr().out
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(math.isfinite(r[k]) for r in records for k in ("loss", "itc", "itm", "mlm"))


# ----------------------------------------------------------------------------- bad samples


def corrupt_first_jpeg(shard: Path) -> tuple[str, int]:
    """Rewrite ``shard`` with its first JPEG member cut to half its bytes; returns (key, image id)."""
    with tarfile.open(shard) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers() if m.isfile()]
    jpg = next(m for m, _ in members if m.name.endswith(".jpg"))
    key = jpg.name.rpartition("/")[2].partition(".")[0]
    meta = json.loads(next(data for m, data in members if m.name == jpg.name[: -len("jpg")] + "json"))
    with tarfile.open(shard, "w") as tf:
        for m, data in members:
            if m is jpg:
                data = data[: len(data) // 2]
                m.size = len(data)
            tf.addfile(m, io.BytesIO(data))
    return key, meta["image_id"]


def test_a_corrupt_member_raises_or_is_replaced_from_the_stream(shards: Path, tmp_path: Path, capfd) -> None:
    """``raise`` names shard and member; ``skip`` leaves the sample out and takes the stream's next
    unit in its place (not another sample of the same batch, which a corrupt shard would fill):
    the same order without it, named once on stderr and counted once."""
    bad_dir = tmp_path / "bad"
    shutil.copytree(shards, bad_dir)
    shard = bad_dir / "shard-00000.tar"
    key, bad_id = corrupt_first_jpeg(shard)
    with pytest.raises(DataError) as e:
        list(loader([bad_dir], caption_mode="sample", on_bad="raise"))
    assert re.fullmatch(
        re.escape(f"{shard} sample {key}: cannot read image {key}.jpg: truncated or corrupt (")
        + r"[^;]+\)"  # Pillow's own words
        + re.escape("; set data.on_bad_sample=skip to replace bad samples"),
        str(e.value),
    ), str(e.value)
    capfd.readouterr()
    for mode in ("sample", "expand"):
        intact = list(loader([shards], caption_mode=mode))
        batches = list(loader([bad_dir], caption_mode=mode, on_bad="skip"))
        assert len(batches) == len(intact) and all(b["images"].shape == (4, 3, 8, 8) for b in batches)
        want = [(i, c) for b in intact for i, c in zip(b["ids"], b["caps"])]
        got = [(i, c) for b in batches for i, c in zip(b["ids"], b["caps"])]
        first = [i for i, _ in want].index(bad_id)
        assert got[:first] == want[:first] and bad_id not in [i for i, _ in got]
        after = [u for u in want[first:] if u[0] != bad_id][:3]
        assert got[first : first + len(after)] == after  # the stream goes on
        assert sum(b["bad"] for b in batches) == 1 and batches[first // 4]["bad"] == 1  # once, all captions
        err = capfd.readouterr().err
        assert err.count(f"skipped a bad sample: {shard} sample {key}: cannot read image") == 1


def test_a_resume_after_a_bad_sample_is_exact(shards: Path, tmp_path: Path) -> None:
    """A bad sample takes one more unit from its reader's stream, which a resume cannot see without
    decoding: the position of every reader (``position()``, checkpointed per rank) says it."""
    bad_dir = tmp_path / "bad"
    shutil.copytree(shards, bad_dir)
    corrupt_first_jpeg(bad_dir / "shard-00003.tar")
    corrupt_first_jpeg(bad_dir / "shard-00006.tar")
    ld = loader([bad_dir], caption_mode="expand", on_bad="skip", num_workers=2)
    full, positions = [], []
    for b in ld:
        full.append(b)
        positions.append(ld.position())
    bad_at = [k for k, b in enumerate(full) if b["bad"]]
    assert bad_at and sum(b["bad"] for b in full) == 2
    for k in (bad_at[0] + 1, len(full) - 3):
        resumed = loader([bad_dir], caption_mode="expand", on_bad="skip", num_workers=2)
        pos = positions[k - 1]
        resumed.set_position(pos["epoch"], pos["batches_done"], pos["reader_units"])
        rest = list(resumed)
        assert len(rest) == len(full) - k
        for a, b in zip(rest, full[k:]):
            assert a["ids"] == b["ids"] and a["caps"] == b["caps"] and torch.equal(a["images"], b["images"])


def test_data_check_reads_a_vlp_shard_folder(shards: Path, capsys: pytest.CaptureFixture) -> None:
    from vlp.cli import main

    assert main(["data", "check", str(shards), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{shards}: {IMAGES} entries (vlp shards: 8 shards)" in out and f"{IMAGES} images: 0 errors" in out
