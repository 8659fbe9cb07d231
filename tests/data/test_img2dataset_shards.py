"""img2dataset's shards as downloaded (issue 29, part 1): ``{key}.{jpg,png,webp}`` with a caption in
``{key}.txt`` or ``{key}.json``, counts from ``_stats.json`` or one scan indexed outside the
(read-only) data folder, brace patterns, exact resume, clear errors for malformed members."""

from __future__ import annotations

import io
import json
import math
import stat
import tarfile
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.data.test_shards import loader as shard_loader
from vlp.data.shard_format import ShardInfo, index_dir, iter_shard, read_sizes
from vlp.data.shards import ShardLoader
from vlp.errors import DataError

SHARDS, PER_SHARD = 4, 5  # 20 images, one caption each
FORMATS = ("jpg", "png", "webp")


def encoded(i: int, fmt: str) -> bytes:
    img = Image.new("RGB", (24 + i % 3, 20), ((40 * i) % 256, 90, 200 - 5 * i))
    buf = io.BytesIO()
    img.save(buf, format={"jpg": "JPEG"}.get(fmt, fmt.upper()))
    return buf.getvalue()


def add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def write_img2dataset(
    folder: Path, stats: bool = True, caption_in: str = "json", shards: int = SHARDS, per_shard: int = PER_SHARD
) -> Path:
    """What img2dataset writes: NNNNN.tar with {key}.jpg|png|webp, {key}.txt, {key}.json (caption,
    url, key, status) and NNNNN_stats.json; keys are shard * 10^4 + index, zero-padded."""
    folder.mkdir(parents=True)
    for s in range(shards):
        with tarfile.open(folder / f"{s:05d}.tar", "w") as tf:
            for j in range(per_shard):
                i = s * per_shard + j
                key = f"{s:05d}{j:04d}"
                fmt = FORMATS[i % len(FORMATS)]
                add(tf, f"{key}.{fmt}", encoded(i, fmt))
                caption = f"a photo number {i}"
                if caption_in in ("txt", "both"):
                    add(tf, f"{key}.txt", caption.encode())
                meta = {"url": f"http://example.com/{i}.jpg", "key": key, "status": "success"}
                if caption_in in ("json", "both"):
                    meta["caption"] = caption
                add(tf, f"{key}.json", json.dumps(meta).encode())
        if stats:
            (folder / f"{s:05d}_stats.json").write_text(json.dumps({"count": per_shard + 2, "successes": per_shard}))
    return folder


def loader(dirs: list, **kw) -> ShardLoader:
    """test_shards' loader (random crops, the test collator), with this file's buffer and seed."""
    return shard_loader(dirs, **{"shuffle_buffer": 6, "seed": 1, **kw})


def tiny_run(run: Path, data: Path, *extra: str) -> list[str]:
    """Overrides of a tiny `vlp pretrain` on the shards in ``data`` (bad samples skipped) into ``run``."""
    model = ["model.vision.depth=1", "model.vision.img_size=32", "model.text.layers=1", "model.text.fusion_layers=1"]
    data_keys = ["data.format=webdataset", f"data.train=[{data}]", "data.on_bad_sample=skip", "data.num_workers=0"]
    train = ["train.warmup_steps=0", "train.progress=false"]
    return [f"output_dir={run}", *data_keys, *extra, *train, *model, "model.queue_size=8"]


@pytest.fixture(scope="module")
def downloaded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_img2dataset(tmp_path_factory.mktemp("i2d") / "cc")


def test_an_epoch_reads_every_image_once_with_its_caption(downloaded: Path) -> None:
    ld = loader([downloaded])
    assert (ld.images, ld.pairs, len(ld)) == (20, 20, 5)  # counts from _stats.json's successes
    seen = [(i, c) for b in ld for i, c in zip(b["ids"], b["caps"])]
    # ids: position in the folder (shard order, then member order), contiguous and distinct
    assert sorted(seen) == [(i, f"a photo number {i}") for i in range(20)]
    keys = [r.meta["image_key"] for r in iter_shard(read_sizes([downloaded])[1])]
    assert keys == [f"00001{j:04d}" for j in range(PER_SHARD)]  # image keys are img2dataset's keys


def test_caption_key_txt_members_and_a_brace_pattern(tmp_path: Path) -> None:
    txt = write_img2dataset(tmp_path / "txt", caption_in="txt")
    caps = {c for b in loader([txt]) for c in b["caps"]}
    assert caps == {f"a photo number {i}" for i in range(20)}
    custom = tmp_path / "alt"
    write_img2dataset(custom, caption_in="txt")
    for s in range(SHARDS):  # a json caption under another key wins over the .txt
        path = custom / f"{s:05d}.tar"
        with tarfile.open(path) as tf:
            members = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
        with tarfile.open(path, "w") as tf:
            for name, data in members:
                if name.endswith(".json"):
                    data = json.dumps({**json.loads(data), "alt_text": "ALT " + name}).encode()
                add(tf, name, data)
    caps = {c for b in loader([custom], caption_key="alt_text") for c in b["caps"]}
    assert all(c.startswith("ALT ") for c in caps) and len(caps) == 20
    # a brace pattern picks tars: two of the four shards
    ld = loader([f"{txt}/{{00001..00002}}.tar"])
    ids = [i for b in ld for i in b["ids"]]
    assert ld.images == 10 and len(ids) == len(set(ids)) == 8 and set(ids) <= set(range(10))  # 2 batches of 4


def test_a_read_only_folder_without_stats_is_scanned_once(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "cache"))
    folder = write_img2dataset(tmp_path / "ro", stats=False)
    before = sorted(p.name for p in folder.iterdir())
    for p in [folder, *folder.iterdir()]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        assert loader([folder]).images == 20
        assert "indexing 4 shard(s)" in capsys.readouterr().out
        assert loader([folder]).images == 20  # from the index this time
        assert "indexing" not in capsys.readouterr().out
    finally:
        for p in [folder, *folder.iterdir()]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing written into the data folder
    assert index_dir() == tmp_path / "cache" / "shard_index" and len(list(index_dir().iterdir())) == 1
    # a changed tar is indexed again
    with tarfile.open(folder / "00000.tar", "a") as tf:
        add(tf, "000009999.jpg", encoded(0, "jpg"))
        add(tf, "000009999.txt", b"one more")
    assert loader([folder]).images == 21 and "indexing" in capsys.readouterr().out


@pytest.mark.parametrize("start", [2, 3])
def test_resume_reproduces_the_rest_of_the_epoch(downloaded: Path, start: int) -> None:
    ld = loader([downloaded], rank=1, world_size=2, num_workers=2, batch_size=2)
    ld.set_epoch(1)
    full = list(ld)
    resumed = loader([downloaded], rank=1, world_size=2, num_workers=2, batch_size=2)
    resumed.load_state_dict({**ld.state_dict(), "epoch": 1, "batches_done": start})
    resumed.set_epoch(1)
    rest = list(resumed)
    assert len(rest) == len(full) - start > 0
    for a, b in zip(rest, full[start:]):
        assert a["ids"] == b["ids"] and a["caps"] == b["caps"] and torch.equal(a["images"], b["images"])


def broken_member(tmp_path: Path, name: str, data: bytes) -> ShardInfo:
    path = tmp_path / "00000.tar"
    with tarfile.open(path, "w") as tf:
        add(tf, "000000000.jpg", encoded(0, "jpg"))
        add(tf, name, data)
    return ShardInfo(path, 1, 1, 0, "img2dataset")


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("000000000.json", b"[" * 100_000, r"invalid 000000000.json \(RecursionError"),
        ("000000000.json", json.dumps({"caption": [123, None, {}]}).encode(), "no caption under 'caption'"),
        ("000000000.json", b'{"caption": "caf\xe9"}', r"invalid 000000000.json \(UnicodeDecodeError"),
        ("000000000.txt", b"caf\xe9", "000000000.txt is not UTF-8"),
        ("000000000.txt", b"  \n", "the caption in 000000000.txt is an empty string, expected a caption"),
        ("000000000.url", b"http://x", r"expected a caption in 000000000.txt or 000000000.json"),
        # texts ALBEF's cleaning (or the tokenizer's control-character removal) leaves nothing of
        # would train as [CLS][SEP]: the rule of `vlp data check` for JSON files (issue 41, item 9)
        ("000000000.txt", b"...", r"the caption '\.\.\.' in 000000000.txt has no words left after ALBEF cleaning"),
        ("000000000.txt", b"\x00\x00", r"the caption '\\x00\\x00' in 000000000.txt has no words left"),
        ("000000000.json", json.dumps({"caption": "?!"}).encode(), r"'\?!' in 000000000.json has no words left"),
    ],
)
def test_a_malformed_member_is_one_data_error_naming_shard_and_member(tmp_path, name, data, message) -> None:
    with pytest.raises(DataError, match=message) as e:
        list(iter_shard(broken_member(tmp_path, name, data)))
    assert "00000.tar: sample '000000000'" in str(e.value)


def test_a_count_mismatch_hint_fits_the_folder_kind(tmp_path: Path, monkeypatch) -> None:
    """Issue 41, item 9: a tar whose count is not its ``_stats.json``'s (or the scan index's) is
    an img2dataset folder's problem, so the hint is img2dataset's (re-run it, or let vlp count the
    tars), not ``vlp make-shards``; a vlp folder's hint stays make-shards (tests/data/test_shards.py)."""
    data = write_img2dataset(tmp_path / "web", shards=2, per_shard=3)
    stats = data / "00001_stats.json"
    stats.write_text(json.dumps({"successes": 5}))
    info = read_sizes([data])[1]
    with pytest.raises(DataError) as e:
        list(iter_shard(info, check_count=True))
    message = str(e.value)
    assert message.startswith(f"{data / '00001.tar'}: 3 samples, but {stats} says 5 (img2dataset's 'successes')")
    assert "re-run img2dataset" in message and "delete the folder's *_stats.json files" in message
    assert "make-shards" not in message
    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "cache"))
    for f in data.glob("*_stats.json"):
        f.unlink()
    info = read_sizes([data])[1]
    (index,) = (tmp_path / "cache" / "shard_index").glob("*.json")
    index.write_text(json.dumps({**json.loads(index.read_text()), "counts": [3, 4]}))
    info = read_sizes([data])[1]
    with pytest.raises(DataError) as e:
        list(iter_shard(info, check_count=True))
    message = str(e.value)
    assert message.startswith(f"{data / '00001.tar'}: 3 samples, but vlp's scan index {index} says 4")
    assert "delete it" in message and "make-shards" not in message


def test_an_image_less_sample_and_an_empty_folder_are_named(tmp_path: Path) -> None:
    path = tmp_path / "00000.tar"
    with tarfile.open(path, "w") as tf:
        add(tf, "000000000.txt", b"a caption")
    with pytest.raises(
        DataError, match=r"sample '000000000' has \['txt'\], expected an image \(jpg, jpeg, png, webp\)"
    ):
        list(iter_shard(ShardInfo(path, 1, 1, 0, "img2dataset")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no sizes.json and no .tar files"):
        read_sizes([tmp_path / "empty"])
    with pytest.raises(DataError, match=r"2 of 3 tars do not exist"):
        read_sizes([f"{tmp_path}/{{00000..00002}}.tar"])


@pytest.mark.parametrize("corrupt", [False, True])
def test_pretrain_on_img2dataset_shards_and_resume_mid_epoch(
    downloaded: Path, tmp_path: Path, capsys, corrupt: bool
) -> None:
    """A few steps on img2dataset-style shards (jpg/png/webp + json, no vlp index), then a resume from
    the mid-epoch step-2 checkpoint logs what the uninterrupted run logged; with corrupt images too
    (each takes one more unit from the stream: the checkpoint keeps each reader's position)."""
    import shutil

    from vlp.cli import main

    data = downloaded
    if corrupt:  # the first image of every shard cut short
        data = tmp_path / "corrupt"
        shutil.copytree(downloaded, data)
        for tar in sorted(data.glob("*.tar")):
            with tarfile.open(tar) as tf:
                members = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
            with tarfile.open(tar, "w") as tf:
                first = members[0][0]
                for name, blob in members:
                    add(tf, name, blob[: len(blob) // 3] if name == first else blob)
    run = tmp_path / "run"
    overrides = tiny_run(run, data, "data.max_bad_fraction=0.5", "data.batch_size=4", "data.shuffle_buffer=8")
    overrides += ["train.steps=4", "train.log_every=1", "train.ckpt_every=2"]
    assert main(["pretrain", "--config", "configs/pretrain/shapes_tiny.yaml", *overrides]) == 0
    assert "vlp pretrain: 20 pairs, 20 images" in capsys.readouterr().out  # 5 batches an epoch

    def read(r: Path) -> list[dict]:
        return [json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()]

    full = read(run)
    assert [r["step"] for r in full] == [1, 2, 3, 4] and all(math.isfinite(r["loss"]) for r in full)
    bad = [r["bad_samples"] for r in full]
    assert (sum(bad[:2]) > 0 and sum(bad) >= 2) if corrupt else sum(bad) == 0
    again = tmp_path / "resumed"
    shutil.copytree(run, again)
    shutil.rmtree(again / "checkpoints" / "step_0000004")
    assert main(["pretrain", "--config", str(again / "config.yaml"), f"output_dir={again}", "train.resume=auto"]) == 0
    resumed = read(again)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for x, y in zip(full[2:], resumed[2:]):
        for key in ("loss", "itc", "itm", "mlm", "temp", "bad_samples"):
            assert y[key] == pytest.approx(x[key], rel=1e-6, abs=1e-7), (key, x, y)


def test_data_check_reads_shards_and_names_every_bad_member(tmp_path: Path, capsys) -> None:
    """``vlp data check SHARD_DIR``: every member of every shard, each bad one named with its shard."""
    from vlp.cli import main

    good = write_img2dataset(tmp_path / "good")
    assert main(["data", "check", str(good), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{good}: 20 entries (img2dataset shards: 4 shards)" in out and "20 images: 0 errors" in out
    bad = write_img2dataset(tmp_path / "bad")
    path = bad / "00002.tar"
    with tarfile.open(path) as tf:
        members = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            if name == "000020000.png":
                data = data[: len(data) // 2]  # a truncated PNG
            elif name == "000020001.json":
                data = b'{"caption": 7}'
            elif name == "000020002.json":
                data = b"[" * 100_000
            add(tf, name, data)
    assert main(["data", "check", str(bad), "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert f"{path}: sample '000020000': cannot read image 000020000.png: truncated or corrupt" in out
    assert f"{path}: sample '000020001': 000020001.json has no caption under 'caption'" in out
    assert f"{path}: sample '000020002': invalid 000020002.json (RecursionError" in out
    assert "3 errors" in out
    # without images only the members' text is read: the truncated PNG goes unnoticed
    assert main(["data", "check", str(bad), "--no-images"]) == 1
    out = capsys.readouterr().out
    assert "2 errors" in out and "images not checked" in out
    (tmp_path / "nothing").mkdir()
    assert main(["data", "check", str(tmp_path / "nothing")]) == 1
    assert "no sizes.json and no .tar files" in capsys.readouterr().out


def test_data_check_and_training_refuse_captions_cleaning_empties(tmp_path: Path, capsys) -> None:
    """A ``"..."`` or NUL-only caption is a bad sample in a shard check, as in a JSON check, and is
    left out (counted) by the shard reader training uses, instead of training as [CLS][SEP]."""
    from vlp.cli import main

    data = write_img2dataset(tmp_path / "web", shards=1, per_shard=4, caption_in="txt")
    path = data / "00000.tar"
    with tarfile.open(path) as tf:
        members = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
    with tarfile.open(path, "w") as tf:
        for name, blob in members:
            add(tf, name, {"000000001.txt": b"...", "000000002.txt": b"\x00\x00\x00"}.get(name, blob))
    assert main(["data", "check", str(data), "--no-images"]) == 1
    out = capsys.readouterr().out
    assert f"{path}: sample '000000001': the caption '...' in 000000001.txt has no words left after ALBEF" in out
    assert f"{path}: sample '000000002': the caption '\\x00\\x00\\x00' in 000000002.txt has no words left" in out
    assert "2 errors" in out
    errors: list[DataError] = []
    kept = [raw.key for raw in iter_shard(ShardInfo(path, 4, 4, 0, "img2dataset"), errors=errors)]
    assert kept == ["000000000", "000000003"] and len(errors) == 2
    # training: under data.on_bad_sample=skip each is a bad sample, counted and replaced; under raise, the error
    (batch,) = list(loader([data], batch_size=4, shuffle_buffer=2, on_bad="skip"))
    assert batch["bad"] == 2 and "..." not in batch["caps"] and all(c.startswith("a photo") for c in batch["caps"])
    with pytest.raises(DataError, match=r"sample '00000000[12]': the caption .* has no words left"):
        list(loader([data], batch_size=4, shuffle_buffer=2, on_bad="raise"))


def test_one_corrupt_shard_of_40_costs_its_samples_not_the_run(tmp_path: Path, capfd) -> None:
    """Issue 29's case: 1 shard of 40 with every image corrupt (2.5% of the data), shuffle buffer 16,
    data.max_bad_fraction 0.05. Before, every failed replacement from the same batch counted and
    the run stopped at 17% "bad"; now each bad sample counts once, is named once, and the run
    completes its epoch."""
    from vlp.cli import main

    data = write_img2dataset(tmp_path / "web", shards=40, per_shard=10)
    broken = data / "00017.tar"
    with tarfile.open(broken) as tf:
        members = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
    with tarfile.open(broken, "w") as tf:
        for name, blob in members:
            add(tf, name, blob if name.endswith((".json", ".txt")) else b"not an image at all")
    run = tmp_path / "run"
    overrides = tiny_run(run, data, "data.max_bad_fraction=0.05", "data.batch_size=8", "data.shuffle_buffer=16")
    overrides += ["train.steps=50", "train.log_every=10"]  # one epoch: 400 images / 8
    assert main(["pretrain", "--config", "configs/pretrain/shapes_tiny.yaml", *overrides]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [10, 20, 30, 40, 50]
    assert sum(r["bad_samples"] for r in records) == 10  # the shard's 10 images, once each
    err = capfd.readouterr().err
    named = [line for line in err.splitlines() if "skipped a bad sample" in line]
    assert len(named) == 10 and all(f"{broken} sample 0001700" in line for line in named)


def test_data_check_of_1000_shards_reports_progress(tmp_path: Path, capsys) -> None:
    from vlp.cli import main

    many = write_img2dataset(tmp_path / "many", shards=1000, per_shard=1)
    assert main(["data", "check", str(many), "--no-images"]) == 0
    captured = capsys.readouterr()
    assert f"{many}: 1000 entries (img2dataset shards: 1000 shards)" in captured.out
    assert "checking shards" in captured.err and "1000/1000" in captured.err  # the bar over the shards
