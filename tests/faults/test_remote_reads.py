"""Issue 52, items 1, 2 and 7: every remote read is checked and bounded. A server that ignores
``Range:`` (Python's own ``python -m http.server``) gives the right bytes, each shard downloaded
once; a ranged answer for other bytes than those asked for is refused by name, never read as them;
an endless body costs no more than its shard's listed size (or the cap when none is listed), a stats
file no more than its byte budget; an S3 endpoint that accepts and never answers fails within
``data.url_read_timeout_s`` a try, whatever botocore and s3fs would retry underneath. Servers on
127.0.0.1 only (tests/data/shard_servers.py)."""

from __future__ import annotations

import json
import re
import tarfile
import time
from pathlib import Path

import pytest

from tests.data.shard_servers import Fault, http_server, plain_http_server, s3_env, stalled_server
from tests.data.test_img2dataset_shards import PER_SHARD, add, loader, write_img2dataset
from tests.data.test_shard_faults import finishes
from tests.data.test_shard_urls import fingerprint
from vlp.data.shard_format import ShardFault, ShardInfo, iter_shard, read_sizes
from vlp.data.shard_samples import iter_samples
from vlp.errors import DataError
from vlp.remote.url_deadlines import UrlTimeouts

BRACE = "{00000..00003}.tar"
SKIPPED = re.compile(r"skipped a bad shard \((\d+) bad samples?\): (.*)")
PAD = 5 << 20  # one sample's JSON member this long: the shard spans two 4 MiB blocks


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("vlp.remote.shard_urls.BACKOFF_S", 0.01)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 img2dataset shards of 5; shard 00001's third sample carries 5 MiB in its JSON member."""
    folder = write_img2dataset(tmp_path_factory.mktemp("ranges") / "cc")
    tar = folder / "00001.tar"
    with tarfile.open(tar) as tf:
        members = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
    with tarfile.open(tar, "w") as tf:
        for name, data in members:
            if name == "000010002.json":
                data = json.dumps({**json.loads(data), "pad": "x" * PAD}).encode()
            add(tf, name, data)
    assert tar.stat().st_size > PAD
    return folder


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_img2dataset(tmp_path_factory.mktemp("bodies") / "cc")


def skipped(err: str) -> list[tuple[int, str]]:
    return [(int(m.group(1)), m.group(2)) for m in map(SKIPPED.search, err.splitlines()) if m]


# ----------------------------------------------------------------------------- item 1: ranges


def test_a_server_that_ignores_ranges_gives_the_right_bytes_each_shard_downloaded_once(big: Path, capfd) -> None:
    local = fingerprint(list(loader([big])))
    with plain_http_server(big) as server:
        entry = f"{server.url}/{BRACE}"
        assert fingerprint(list(loader([entry], on_bad="raise"))) == local
        server.log.clear()
        assert sum(1 for _ in iter_samples(read_sizes([entry]))) == 4 * PER_SHARD
        gets = [r for r in server.log if r.startswith("GET") and r.endswith(".tar")]
    assert sorted(gets) == [f"GET /{i:05d}.tar" for i in range(4)]  # each streamed once, from its start
    assert "skipped" not in capfd.readouterr().err


def test_a_ranged_answer_for_other_bytes_is_refused_never_read_as_them(small: Path, capfd) -> None:
    with http_server(small) as server:
        server.faults = [Fault("00001.tar", "wrong_range", after=512)]
        batches = list(loader([f"{server.url}/{BRACE}"], on_bad="skip"))
        gets = server.log.count("GET /00001.tar")
    named = skipped(capfd.readouterr().err)
    assert len(batches) == 5 and len(named) == 1 and named[0][0] == PER_SHARD == sum(b["bad"] for b in batches)
    size = (small / "00001.tar").stat().st_size
    assert (
        f"{server.url}/00001.tar: cannot read shard: asked for bytes 0-{size - 1}, the server answered 206 with "
        f"Content-Range 'bytes 512-{size - 1}/{size}'" in named[0][1]
    )
    assert "tries" not in named[0][1] and gets <= 2  # not retried: the server would answer the same


# ----------------------------------------------------------------------------- item 2: byte budgets


def test_an_endless_body_is_read_only_to_the_shards_listed_size(small: Path, capfd) -> None:
    """A 200 whose body goes on past the file's end (its HEAD lists the real size): the shard's bytes
    are those of its listed size, and no more is read than that and the kernel's buffers."""
    local = fingerprint(list(loader([small])))
    with http_server(small) as server:
        server.faults = [Fault("00001.tar", "endless")]
        assert fingerprint(list(loader([f"{server.url}/{BRACE}"], on_bad="raise"))) == local
        sent = server.sent["/00001.tar"]
    assert sent < 48 << 20, sent  # the server would have sent 128 MiB
    assert "skipped" not in capfd.readouterr().err


def test_an_endless_body_of_no_listed_size_costs_its_shard_at_the_cap(small: Path, monkeypatch, capfd) -> None:
    monkeypatch.setattr("vlp.remote.url_bodies.UNSIZED_SHARD_BYTES", 1 << 20)
    with http_server(small) as server:
        server.faults = [Fault("00001.tar", "endless", sized=False)]
        batches = list(loader([f"{server.url}/{BRACE}"], on_bad="skip"))
        sent = server.sent["/00001.tar"]
    named = skipped(capfd.readouterr().err)
    assert len(batches) == 5 and len(named) == 1 and sum(b["bad"] for b in batches) == named[0][0] >= 1
    assert f"{server.url}/00001.tar: cannot read shard: its body passed 1 MiB, the budget of a shard" in named[0][1]
    assert "tries" not in named[0][1] and sent < 48 << 20


@pytest.mark.parametrize("claim", [0, 1 << 30])
def test_a_stats_file_over_its_byte_budget_is_refused_at_start_up(small: Path, claim: int) -> None:
    """An endless stats file (chunked), and one that says it holds 1 GiB: one error naming it, after
    reading no more than the budget (the thread guard: the old read buffered the whole body)."""
    with http_server(small) as server:
        server.faults = [Fault("00002_stats.json", "endless", claim=claim, after=64 << 20)]
        t0 = time.monotonic()
        with pytest.raises(DataError) as e:
            finishes(lambda: read_sizes([f"{server.url}/{BRACE}"]), [], seconds=60)
        took, sent = time.monotonic() - t0, server.sent.get("/00002_stats.json", 0)
    assert str(e.value).startswith(f"{server.url}/00002_stats.json: cannot read img2dataset's stats: ")
    assert "over its budget of 1 MiB" in str(e.value)
    assert took < 10 and sent < 32 << 20


# ----------------------------------------------------------------------------- item 7: one deadline a try


def stalled_s3(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    import fsspec

    for k, v in s3_env(url).items():
        monkeypatch.setenv(k, v)
    fsspec.filesystem("s3").clear_instance_cache()


def test_a_stalled_s3_endpoint_fails_at_start_up_within_the_read_deadline(monkeypatch) -> None:
    """Before: about 36 read timeouts (botocore's retries inside s3fs's) before the one error."""
    with stalled_server() as stalled:
        stalled_s3(monkeypatch, stalled.url)
        t0 = time.monotonic()
        with pytest.raises(DataError) as e:
            finishes(lambda: read_sizes([f"s3://shards/{BRACE}"], timeouts=UrlTimeouts(read_s=0.5)), [], seconds=60)
        took = time.monotonic() - t0
    assert str(e.value) == "s3://shards/00000_stats.json: cannot read img2dataset's stats: no answer within 0.5 s"
    assert took < 2.5 and stalled.accepted <= 2


def test_a_stalled_s3_shard_costs_its_samples_after_vlps_tries_alone(monkeypatch) -> None:
    """A shard read: 5 tries (vlp's retries) of one request each, each bounded by the read deadline."""
    with stalled_server() as stalled:
        stalled_s3(monkeypatch, stalled.url)
        info = ShardInfo("s3://shards/00001.tar", PER_SHARD, PER_SHARD, 0, "img2dataset")
        errors: list = []
        t0 = time.monotonic()
        assert finishes(lambda: list(iter_shard(info, errors=errors, timeouts=UrlTimeouts(0.5, 600))), [], 90) == []
        took = time.monotonic() - t0
    assert [type(e) for e in errors] == [ShardFault] and errors[0].lost == PER_SHARD
    assert str(errors[0]) == "s3://shards/00001.tar: cannot read shard: no byte for 0.5 s (after 5 tries)"
    assert took < 6 and stalled.accepted <= 6
