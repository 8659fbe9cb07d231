"""Shards read by URL (issue 42): over HTTP and from an S3-compatible server, both started by the
tests on 127.0.0.1 (tests/data/shard_servers.py). The batches are the same as from the same
shards on local disk; start-up reads only the stats files; counts without stats come from
`vlp data index` or data.train_num_samples."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from tests.data.shard_servers import Fault, http_server, s3_server
from tests.data.test_img2dataset_shards import PER_SHARD, loader, write_img2dataset
from vlp.data.shard_counts import read_stats
from vlp.data.shard_format import index_entry, read_sizes
from vlp.data.shard_samples import iter_samples
from vlp.errors import DataError
from vlp.remote.shard_urls import shard_urls
from vlp.remote.url_deadlines import UrlTimeouts

BRACE = "{00000..00003}.tar"


def fingerprint(batches: list[dict]) -> list[tuple]:
    """Each batch's image ids, captions and image pixels (a digest of them)."""
    return [(tuple(b["ids"]), tuple(b["caps"]), float(b["images"].double().sum())) for b in batches]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_img2dataset(tmp_path_factory.mktemp("urls") / "cc")


def test_http_shards_give_the_local_batches_and_start_up_reads_only_stats(folder: Path) -> None:
    local = fingerprint(list(loader([folder])))
    with http_server(folder) as server:
        ld = loader([f"{server.url}/{BRACE}"])
        assert len(server.log) == 4 and all(r.startswith("GET") and r.endswith("_stats.json") for r in server.log)
        assert (ld.images, len(ld)) == (20, 5)
        assert fingerprint(list(ld)) == local
        assert any(p.endswith(".tar") for p in server.log)
        two = loader([f"{server.url}/{BRACE}"], num_workers=2)  # loader worker processes stream too
        assert fingerprint(list(two)) == fingerprint(list(loader([folder], num_workers=2)))


def test_resume_of_a_url_set_gives_the_rest_of_the_epoch(folder: Path) -> None:
    with http_server(folder) as server:
        entry = f"{server.url}/{BRACE}"
        full = fingerprint(list(loader([entry])))
        ld = loader([entry])
        it = iter(ld)
        [next(it) for _ in range(2)]
        state = ld.state_dict()
        again = loader([entry])
        again.load_state_dict(state)
        assert fingerprint(list(again)) == full[2:]


def test_without_stats_counts_come_from_the_index_or_train_num_samples(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "cache"))
    bare = write_img2dataset(tmp_path / "bare", stats=False)
    with http_server(bare) as server:
        entry = f"{server.url}/{BRACE}"
        with pytest.raises(DataError, match=r"without img2dataset's _stats.json .* `vlp data index '.*'`"):
            read_sizes([entry])
        assert not any(r.startswith("GET") and r.endswith(".tar") for r in server.log)  # never scanned at start-up
        # data.train_num_samples: equal shares, no count requested; only whether the first shard is there
        server.log.clear()
        est = read_sizes([entry], num_samples=18)
        assert [s.images for s in est] == [5, 5, 4, 4] and not any(s.counted for s in est)
        assert server.log == ["HEAD /00000.tar"]
        ld = loader([entry], num_samples=18)
        ids = [i for b in ld for i in b["ids"]]
        assert len(ld) == 4 and len(ids) == len(set(ids)) == 16  # floor(18 / 4) batches, distinct images
        # the index, written once (`vlp data index`)
        from vlp.cli import main

        assert main(["data", "index", entry]) == 0
        assert f"{entry}: 4 shards, 20 samples; index " in capsys.readouterr().out
        f, counts = index_entry(entry)  # counted again
        assert counts == [5, 5, 5, 5] and f.is_file()
        server.log.clear()
        assert [s.images for s in read_sizes([entry])] == counts
        assert server.log == ["GET /00000_stats.json", "HEAD /00000.tar"]  # no stats: is the first shard there?
    with pytest.raises(DataError, match="data.train_num_samples is for URL shard sets"):
        read_sizes([bare], num_samples=20)


def test_vlp_data_index_reads_url_shards_at_once_and_stops_at_a_broken_one(tmp_path: Path, monkeypatch) -> None:
    """A scan of a URL set waits on the store: its shards are read several at a time (here each
    response comes after 0.3 s, so requests overlap only if the scan does not wait for each in turn); a
    shard that breaks stops it with the shard named, and no index is kept."""
    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "cache"))
    bare = write_img2dataset(tmp_path / "bare", stats=False, shards=8)
    with http_server(bare) as server:
        entry = f"{server.url}/{{00000..00007}}.tar"
        server.faults.append(Fault(".tar", "delay", seconds=0.3))
        f, counts = index_entry(entry)
        assert counts == [PER_SHARD] * 8 and f.is_file()
        assert server.most_at_once >= 4
        server.faults[:] = [Fault("00005.tar", "reset", after=700)]
        f.unlink()
        with pytest.raises(DataError, match=r"00005\.tar"):
            index_entry(entry)
        assert not f.exists()


def test_s3_shards_give_the_local_batches(folder: Path, monkeypatch) -> None:
    local = fingerprint(list(loader([folder])))
    with s3_server(monkeypatch, "shards", folder):
        ld = loader([f"s3://shards/{BRACE}"])
        assert ld.images == 20
        assert fingerprint(list(ld)) == local


def test_a_missing_bucket_fails_before_the_first_step_naming_the_url(folder: Path, monkeypatch) -> None:
    with s3_server(monkeypatch, "shards", folder):
        with pytest.raises(DataError, match=r"^s3://nobucket/00000.tar: no such shard \(or no such bucket\)"):
            read_sizes([f"s3://nobucket/{BRACE}"])


def test_a_pipe_entry_streams_the_commands_output(folder: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "cache"))
    entry = f"pipe:cat {folder}/{BRACE}"
    f, counts = index_entry(entry)
    assert counts == [5, 5, 5, 5]
    assert fingerprint(list(loader([entry]))) == fingerprint(list(loader([folder])))
    with pytest.raises(DataError, match="exited with status"):
        list(loader([f"pipe:false {BRACE}"], num_samples=20, on_bad="raise"))


def test_a_url_that_is_not_a_tar_is_refused() -> None:
    with pytest.raises(DataError, match=r"'http://127.0.0.1:1/cc/' is not a .tar URL"):
        read_sizes(["http://127.0.0.1:1/cc/"])


def test_images_equal_exactly(folder: Path) -> None:
    with http_server(folder) as server:
        a = next(iter(loader([f"{server.url}/{BRACE}"])))
    b = next(iter(loader([folder])))
    assert torch.equal(a["images"], b["images"])


def test_a_connection_reset_mid_shard_is_retried_from_where_it_broke(folder: Path, monkeypatch) -> None:
    monkeypatch.setattr("vlp.remote.shard_urls.BACKOFF_S", 0.01)
    local = fingerprint(list(loader([folder])))
    with http_server(folder) as server:
        server.faults = [Fault("00001.tar", "reset", after=700, times=1), Fault("00002.tar", "500", times=2)]
        assert fingerprint(list(loader([f"{server.url}/{BRACE}"]))) == local
        assert all(f.times == 0 for f in server.faults)  # each fault struck
        assert server.log.count("GET /00001.tar") >= 2 and server.log.count("GET /00002.tar") >= 3


def test_a_shard_that_keeps_failing_costs_its_samples_named_once(folder: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr("vlp.remote.shard_urls.BACKOFF_S", 0.01)
    with http_server(folder) as server:
        server.faults = [Fault("00002.tar", "503")]
        batches = list(loader([f"{server.url}/{BRACE}"], on_bad="skip"))
    assert len(batches) == 5 and sum(b["bad"] for b in batches) == PER_SHARD  # its 5 samples, once
    named = [line for line in capsys.readouterr().err.splitlines() if "skipped a bad shard" in line]
    assert len(named) == 1 and f"{server.url}/00002.tar: cannot read shard" in named[0]
    assert "(after 5 tries)" in named[0] and "503" in named[0]


def test_the_main_process_reads_urls_after_its_loader_workers_end(folder: Path, monkeypatch) -> None:
    """Forked loader workers inherit the main process's open connections, registered in its event
    loop's epoll set, which a fork shares; workers that closed them (fsspec drops its cached
    filesystems in a child) unregistered them in the main process, whose next requests then waited
    for their read deadline. The main process reads shards and stats, forks workers over each
    kind of entry, and must read on at once after every epoch."""
    short = UrlTimeouts(read_s=5.0)
    with http_server(folder) as web, s3_server(monkeypatch, "shards", folder):
        entries = {"http": f"{web.url}/{BRACE}", "s3": f"s3://shards/{BRACE}", "local": str(folder)}
        for entry in entries.values():  # the read path, in this process: connections left in the pools
            assert sum(1 for _ in iter_samples(read_sizes([entry], timeouts=short))) == 20
        for name, workers in [("s3", 1), ("http", 1), ("local", 2), ("s3", 2), ("http", 2)]:
            assert len(list(loader([entries[name]], num_workers=workers, timeouts=short))) == 5
            for url in ("http", "s3"):
                t = time.perf_counter()
                assert read_stats(shard_urls(entries[url]), short) == [PER_SHARD] * 4, (name, workers, url)
                assert time.perf_counter() - t < 2.0, (name, workers, url)
