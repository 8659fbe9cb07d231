"""Shards that cannot hang or kill a run (issue 41, items 5 and 6).

A FIFO, socket, device or directory named like a shard, index or annotation file is refused by
name, never opened for reading (an open FIFO waits for a writer forever). A truncated tar, a
zero-byte tar and a ``_stats.json`` count other than the tar's cost their samples under
``data.on_bad_sample=skip`` (counted as bad, named once) and stay an error naming the shard and
the member under ``raise``."""

from __future__ import annotations

import json
import os
import re
import tarfile
import threading
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from tests.data.test_img2dataset_shards import PER_SHARD, loader, tiny_run, write_img2dataset
from vlp.data.json_entries import read_json
from vlp.data.shard_format import ShardFault, ShardInfo, _index_file, index_entry, iter_shard, read_sizes
from vlp.errors import DataError
from vlp.remote.shard_urls import shard_urls

FIFO = "is a FIFO (named pipe), not a regular file"


def finishes(fn: Callable[[], Any], fifos: list[Path], seconds: float = 30) -> Any:
    """``fn()``'s result or exception, failing the test if it is still running after ``seconds``
    (blocked on a FIFO: a writer is then opened on each of ``fifos`` so the thread can end)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for f in fifos:
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(10)
        pytest.fail(f"still blocked after {seconds} s (a FIFO was opened for reading)")
    if "error" in out:
        raise out["error"]
    return out.get("value")


# ----------------------------------------------------------------------------- item 5: not regular files


def with_fifo(tmp_path: Path, case: str) -> tuple[list[str], Path]:
    """A shard folder (data.train entries) with a FIFO (or a directory) where ``case`` says."""
    data = write_img2dataset(tmp_path / "S", stats=case != "no_stats")
    odd = data / "00003.tar"
    if case == "stats_fifo":
        odd = data / "00001_stats.json"
    elif case == "vlp_sizes":  # vlp's layout: a listed shard
        (data / "sizes.json").write_text(json.dumps({f"0000{i}.tar": {"images": 5, "pairs": 5} for i in range(4)}))
    entries = [f"{data}/{{00000..00003}}.tar"] if case == "brace" else [str(data)]
    odd.unlink()
    if case == "directory":
        odd.mkdir()
    else:
        os.mkfifo(odd)
    return entries, odd


CASES = ["stats", "no_stats", "brace", "stats_fifo", "vlp_sizes", "directory"]


@pytest.mark.parametrize("case", CASES)
def test_a_fifo_or_directory_named_like_a_shard_is_refused_by_name(tmp_path: Path, case: str) -> None:
    entries, odd = with_fifo(tmp_path, case)
    kind = "is a directory, not a regular file" if case == "directory" else FIFO
    with pytest.raises(DataError) as e:
        finishes(lambda: read_sizes(entries, on_bad="skip"), [odd])
    assert str(e.value).startswith(f"{odd}: ") and kind in str(e.value)


@pytest.mark.parametrize("case", ["stats", "no_stats"])
def test_data_check_names_a_fifo_shard_instead_of_hanging(tmp_path: Path, case: str, capsys) -> None:
    from vlp.cli import main

    entries, odd = with_fifo(tmp_path, case)
    assert finishes(lambda: main(["data", "check", *entries, "--workers", "1"]), [odd]) == 1
    assert f"{odd}: shard {FIFO}" in capsys.readouterr().out


def test_a_shard_replaced_by_a_fifo_after_listing_is_a_bad_shard(tmp_path: Path) -> None:
    """Between the listing and the read: never opened for reading; under skip a fault costing the
    listed samples, else a DataError naming it."""
    path = tmp_path / "00000.tar"
    os.mkfifo(path)
    info = ShardInfo(path, 5, 5, 0, "img2dataset")
    with pytest.raises(DataError, match=re.escape(FIFO)):
        finishes(lambda: list(iter_shard(info)), [path])
    errors: list[DataError] = []
    assert finishes(lambda: list(iter_shard(info, errors=errors)), [path]) == []
    assert len(errors) == 1 and isinstance(errors[0], ShardFault) and errors[0].lost == 5
    assert str(errors[0]).startswith(f"{path}: shard {FIFO}")


def test_an_annotation_file_that_is_a_fifo_is_refused(tmp_path: Path, capsys) -> None:
    from vlp.cli import main

    ann = tmp_path / "ann.json"
    os.mkfifo(ann)
    with pytest.raises(DataError, match=re.escape(f"annotation file {FIFO}")):
        finishes(lambda: read_json(ann), [ann])
    assert finishes(lambda: main(["data", "check", str(ann), "--no-images"]), [ann]) == 1
    assert f"annotation file {FIFO}" in capsys.readouterr().out


# ----------------------------------------------------------------------------- item 6: broken shards


def rewrite(tar: Path, keep: Callable[[list[tuple[str, bytes]]], list[tuple[str, bytes]]]) -> None:
    from tests.data.test_img2dataset_shards import add

    with tarfile.open(tar) as tf:
        members = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
    with tarfile.open(tar, "w") as tf:
        for name, data in keep(members):
            add(tf, name, data)


def truncate_in_member(tar: Path, member: str) -> None:
    """Cut ``tar`` in the middle of ``member``'s data."""
    with tarfile.open(tar) as tf:
        m = tf.getmember(member)
    data = tar.read_bytes()
    tar.write_bytes(data[: m.offset_data + m.size // 2])


TRUNCATED_AT = "000010002.png"  # sample 2 of shard 1 (jpg, png, webp in turn)
LOST = {"00001": PER_SHARD - 2, "00002": PER_SHARD, "00003": 2}  # truncated, zero-byte, stats 7 for 5


def broken_world(
    folder: Path, faults: tuple[str, ...] = ("truncated", "zero_byte", "count"), stats: bool = True
) -> Path:
    """6 img2dataset shards of 5: 00001 cut inside TRUNCATED_AT, 00002 zero bytes, 00003's
    _stats.json says 7."""
    data = write_img2dataset(folder, stats=stats, shards=6)
    if "truncated" in faults:
        truncate_in_member(data / "00001.tar", TRUNCATED_AT)
    if "zero_byte" in faults:
        (data / "00002.tar").write_bytes(b"")
    if "count" in faults and stats:
        (data / "00003_stats.json").write_text(json.dumps({"count": 9, "successes": PER_SHARD + 2}))
    return data


def test_a_truncated_tar_names_the_member_it_broke_in(tmp_path: Path) -> None:
    data = broken_world(tmp_path / "w", ("truncated",))
    info = ShardInfo(data / "00001.tar", PER_SHARD, PER_SHARD, 0, "img2dataset")
    with pytest.raises(DataError) as e:
        list(iter_shard(info))
    assert str(e.value) == f"{info.path}: cannot read shard: unexpected end of data, in member {TRUNCATED_AT}"
    errors: list[DataError] = []
    assert [s.key for s in iter_shard(info, errors=errors)] == ["000010000", "000010001"]
    assert [(str(e), e.lost) for e in errors if isinstance(e, ShardFault)] == [(str(e.value), PER_SHARD - 2)]


@pytest.mark.parametrize(
    "fault, message",
    [
        ("truncated", f"00001.tar: cannot read shard: unexpected end of data, in member {TRUNCATED_AT}"),
        ("zero_byte", "00002.tar: cannot read shard: empty file"),
        ("count", "00003.tar: 5 samples, but {stats} says 7"),
    ],
)
def test_under_raise_a_broken_shard_stays_an_error_naming_shard_and_member(tmp_path, fault, message) -> None:
    data = broken_world(tmp_path / "w", (fault,))
    with pytest.raises(DataError) as e:
        list(loader([data], on_bad="raise"))
    message = message.format(stats=f"{data}/00003_stats.json")
    assert f"{data}/{message}" in str(e.value) and "set data.on_bad_sample=skip" in str(e.value)


def epoch(data: Path, **kw) -> list[dict]:
    return list(loader([data], on_bad="skip", **kw))


def test_under_skip_broken_shards_cost_their_samples_deterministically(tmp_path: Path, capfd) -> None:
    """One epoch (32 listed samples: 8 batches of 4) reads every shard: 3 + 5 + 2 bad samples,
    each shard named once; the same batches twice, and from a resume's position."""
    data = broken_world(tmp_path / "w")
    full = epoch(data)
    assert len(full) == 8 and sum(b["bad"] for b in full) == sum(LOST.values())
    err = capfd.readouterr().err
    for shard, lost in LOST.items():  # a count its tar cannot hold is named at start-up too (issue 52)
        named = [line for line in err.splitlines() if f"{data}/{shard}.tar" in line and "warning:" not in line]
        assert len(named) == 1 and f"skipped a bad shard ({lost} bad samples)" in named[0], named
    for shard in ("00001", "00002"):  # cut inside a member, zero bytes: 5 samples cannot fit
        warned = [line for line in err.splitlines() if f"(the count of {data}/{shard}.tar) is 5, but" in line]
        assert len(warned) == 1 and warned[0].startswith("vlp data: warning: "), warned
    assert f"in member {TRUNCATED_AT}" in err
    again = epoch(data)
    for a, b in zip(full, again):
        assert a["ids"] == b["ids"] and a["caps"] == b["caps"] and torch.equal(a["images"], b["images"])
    ld = loader([data], on_bad="skip")
    it, positions = iter(ld), []
    for _ in range(3):
        next(it)
        positions.append(ld.position())
    resumed = loader([data], on_bad="skip")
    resumed.set_position(0, 3, positions[-1]["reader_units"])
    rest = list(resumed)
    assert [b["ids"] for b in rest] == [b["ids"] for b in full[3:]]
    assert all(torch.equal(a["images"], b["images"]) for a, b in zip(rest, full[3:]))


def test_without_stats_the_scan_counts_up_to_the_break_and_leaves_out_an_empty_tar(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "cache"))
    data = broken_world(tmp_path / "w", stats=False)
    with pytest.raises(
        DataError, match=f"00001.tar: cannot read shard: unexpected end of data, in member {TRUNCATED_AT}"
    ):
        read_sizes([data])
    counts = {s.path.name: s.images for s in read_sizes([data], on_bad="skip")}
    assert counts == {"00000.tar": 5, "00001.tar": 3, "00003.tar": 5, "00004.tar": 5, "00005.tar": 5}
    err = capfd.readouterr().err
    assert "00001.tar: cannot read shard: unexpected end of data, in member 000010002.png; 3 samples counted" in err
    assert "00002.tar: cannot read shard: empty file; no samples counted: the shard is left out" in err
    assert not list((tmp_path / "cache" / "shard_index").glob("*.json"))  # not kept: the next start scans again


def test_data_check_names_each_broken_shard(tmp_path: Path, capsys) -> None:
    from vlp.cli import main

    data = broken_world(tmp_path / "w")
    assert main(["data", "check", str(data), "--no-images"]) == 1
    out = capsys.readouterr().out
    assert f"{data}/00001.tar: cannot read shard: unexpected end of data, in member {TRUNCATED_AT}" in out
    assert f"{data}/00002.tar: cannot read shard: empty file" in out
    assert f"{data}/00003.tar: 5 samples, but {data}/00003_stats.json says 7 (img2dataset's 'successes')" in out
    assert "3 errors" in out and f"{data}: 22 entries" in out


def test_pretrain_under_skip_finishes_and_counts_the_broken_shards(tmp_path: Path, capfd) -> None:
    """Before: `vlp pretrain` exited with status 2 at the first broken shard, no checkpoint written."""
    from vlp.cli import main

    data = broken_world(tmp_path / "w")
    run = tmp_path / "run"
    overrides = tiny_run(run, data, "data.batch_size=4", "data.shuffle_buffer=8", "train.steps=8", "train.log_every=4")
    assert main(["pretrain", "--config", "configs/pretrain/shapes_tiny.yaml", *overrides]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [4, 8] and sum(r["bad_samples"] for r in records) == sum(LOST.values())
    assert (run / "checkpoints" / "step_0000008").is_dir()
    err = capfd.readouterr().err
    for shard, lost in LOST.items():
        assert err.count(f"skipped a bad shard ({lost} bad samples): {data}/{shard}.tar") == 1


def test_broken_shards_are_judged_under_max_bad_fraction(tmp_path: Path, capfd) -> None:
    """10 bad of 32 listed samples per epoch: data.max_bad_fraction=0.05 stops the run once 100
    samples were loaded, with a checkpoint."""
    from vlp.cli import main

    data = broken_world(tmp_path / "w")
    run = tmp_path / "run"
    extra = ("data.batch_size=4", "data.shuffle_buffer=8", "train.steps=40", "train.log_every=4")
    overrides = tiny_run(run, data, "data.max_bad_fraction=0.05", *extra)
    assert main(["pretrain", "--config", "configs/pretrain/shapes_tiny.yaml", *overrides]) == 2
    assert "more than data.max_bad_fraction=0.05" in capfd.readouterr().err


def test_a_url_shards_count_mismatch_says_what_to_do_with_a_store(tmp_path: Path, monkeypatch) -> None:
    """The hint fits a URL set: stats files in a bucket are not "the folder's", and a stale scan
    index of URLs is not counted again by the next run (it refuses without counts): `vlp data index`."""
    from tests.data.shard_servers import http_server

    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "cache"))
    data = broken_world(tmp_path / "w", ("count",))
    with http_server(data) as server:
        entry = f"{server.url}/{{00000..00005}}.tar"
        with pytest.raises(DataError) as e:
            list(loader([entry], on_bad="raise"))
        message = str(e.value)
        assert f"{server.url}/00003.tar: 5 samples, but {server.url}/00003_stats.json says 7" in message
        assert "delete the folder's" not in message and "`vlp data index` on the data.train entry" in message
        for stats in data.glob("*_stats.json"):
            stats.unlink()
        index_entry(entry)
        index_file, counts = _index_file(shard_urls(entry), "caption"), [PER_SHARD] * 6
        index_file.write_text(index_file.read_text().replace(str(counts), str([5, 5, 5, 5, 6, 5])))  # stale
        with pytest.raises(DataError) as e:
            list(loader([entry], on_bad="raise"))
        message = str(e.value)
        assert f"vlp's scan index {index_file} says 6" in message
        assert "run `vlp data index` on the data.train entry again" in message and "the next run counts" not in message
