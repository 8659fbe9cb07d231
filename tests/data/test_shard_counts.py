"""Issue 52, item 5: one rule for a shard's listed count, whether img2dataset's ``_stats.json`` or
vlp's scan index lists it (:func:`vlp.data.shard_counts.checked_count`): a whole number of samples
from 0 to the cap. A count that breaks it is one error at start-up naming the file, the shard and
the count; a shard listed with 0 samples is left out, named at start-up (before: a negative or zero
index count dropped the shard silently, and a stats count of 10**18 was named only when its shard
was read). A local tar's count that cannot fit in its bytes is named in a warning at start-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.data.shard_servers import http_server
from tests.data.test_img2dataset_shards import PER_SHARD, write_img2dataset
from vlp.data.shard_counts import MAX_SHARD_SAMPLES
from vlp.data.shard_format import _index_file, index_entry, read_sizes
from vlp.errors import DataError
from vlp.remote.shard_urls import shard_urls

BRACE = "{00000..00003}.tar"
RULE = f"expected a whole number of samples from 0 to {MAX_SHARD_SAMPLES:,}"
BAD = [-5, 10**18, "5", True, 5.5, None]


def set_stats(folder: Path, shard: int, value: object) -> Path:
    f = folder / f"{shard:05d}_stats.json"
    f.write_text(json.dumps({"count": 7, "successes": value}))
    return f


@pytest.mark.parametrize("value", BAD)
def test_a_stats_count_breaking_the_rule_is_named_at_start_up(tmp_path: Path, value: object) -> None:
    data = write_img2dataset(tmp_path / "cc")
    f = set_stats(data, 2, value)
    with pytest.raises(DataError) as e:
        read_sizes([data])
    assert str(e.value) == f"{f}: 'successes' (the count of {data / '00002.tar'}) is {value!r}, {RULE}"
    with http_server(data) as server:
        with pytest.raises(DataError) as e:
            read_sizes([f"{server.url}/{BRACE}"])
    url = f"{server.url}/00002"
    assert str(e.value) == f"{url}_stats.json: 'successes' (the count of {url}.tar) is {value!r}, {RULE}"


def test_a_local_count_that_cannot_fit_in_its_tar_is_named_at_start_up(tmp_path: Path, capfd) -> None:
    """Named in a warning: a count that is wrong and a tar cut short look the same at start-up, and a
    cut tar costs its missing samples when read (issue 41), not the run."""
    data = write_img2dataset(tmp_path / "cc")
    f, tar = set_stats(data, 1, 1000), data / "00001.tar"
    size = tar.stat().st_size
    assert [s.images for s in read_sizes([data], on_bad="skip")] == [5, 1000, 5, 5]
    assert (
        f"vlp data: warning: {f}: 'successes' (the count of {tar}) is 1000, but the tar's {size:,} bytes hold at "
        f"most {size // 2048:,} samples (2,048 bytes each at least: an image and a caption member): the count is "
        "wrong or the tar was cut short; the samples it lacks count as bad samples when it is read"
    ) in capfd.readouterr().err


def write_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_url: str) -> tuple[str, Path]:
    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "cache"))
    entry = f"{server_url}/{BRACE}"
    f, counts = index_entry(entry)
    assert counts == [PER_SHARD] * 4
    return entry, f


def tamper(f: Path, shard: int, value: object) -> None:
    index = json.loads(f.read_text())
    index["counts"][shard] = value
    f.write_text(json.dumps(index))


@pytest.mark.parametrize("value", BAD)
def test_an_index_count_breaking_the_rule_is_named_at_start_up(tmp_path: Path, monkeypatch, value: object) -> None:
    bare = write_img2dataset(tmp_path / "bare", stats=False)
    with http_server(bare) as server:
        entry, f = write_index(tmp_path, monkeypatch, server.url)
        tamper(f, 2, value)
        with pytest.raises(DataError) as e:
            read_sizes([entry])
    assert str(e.value) == (
        f"{f}: the count of {server.url}/00002.tar is {value!r}, {RULE}; vlp's scan index is damaged: run "
        f"`vlp data index '{entry}'` again"
    )
    local = _index_file(sorted(bare.glob("*.tar")), "caption")
    assert [s.images for s in read_sizes([bare])] == [PER_SHARD] * 4 and local.is_file()  # a scan, kept
    tamper(local, 1, value)
    with pytest.raises(DataError) as e:
        read_sizes([bare])
    assert str(e.value) == (
        f"{local}: the count of {bare / '00001.tar'} is {value!r}, {RULE}; vlp's scan index is damaged: delete it "
        "(the next run counts the tars again)"
    )


def test_a_shard_listed_with_no_samples_is_left_out_named_at_start_up(tmp_path: Path, monkeypatch, capfd) -> None:
    data = write_img2dataset(tmp_path / "cc")
    f = set_stats(data, 3, 0)
    assert [s.path.name for s in read_sizes([data])] == ["00000.tar", "00001.tar", "00002.tar"]
    assert (
        f"vlp data: warning: {data / '00003.tar'}: {f} lists no samples; the shard is left out"
        in capfd.readouterr().err
    )
    bare = write_img2dataset(tmp_path / "bare", stats=False)
    with http_server(bare) as server:
        entry, index = write_index(tmp_path, monkeypatch, server.url)
        tamper(index, 0, 0)
        assert [s.path for s in read_sizes([entry])] == shard_urls(entry)[1:]
    err = capfd.readouterr().err
    assert f"vlp data: warning: {server.url}/00000.tar: {index} lists no samples; the shard is left out" in err
