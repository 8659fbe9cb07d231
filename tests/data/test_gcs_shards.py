"""Shards read from GCS (issue 42): gcsfs against a GCS emulator the tests start on 127.0.0.1
(tests/data/shard_servers.py ``gcs_server``). Counts come from the stats files; an epoch gives the
same batches as the same shards on local disk and from S3; a missing bucket is one error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data.shard_servers import gcs_server, s3_server
from tests.data.test_img2dataset_shards import loader, write_img2dataset
from tests.data.test_shard_urls import BRACE, fingerprint
from vlp.data.shard_format import read_sizes
from vlp.errors import DataError


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_img2dataset(tmp_path_factory.mktemp("gcs") / "cc")


def test_read_sizes_counts_gs_shards_by_their_stats(folder: Path, monkeypatch) -> None:
    with gcs_server(monkeypatch, "shards", folder):
        shards = read_sizes([f"gs://shards/{BRACE}"])
    assert [(s.path, s.images, s.count_file) for s in shards] == [
        (f"gs://shards/{k:05d}.tar", 5, f"gs://shards/{k:05d}_stats.json") for k in range(4)
    ]
    assert [s.id_offset for s in shards] == [0, 5, 10, 15] and all(s.counted for s in shards)


def test_an_epoch_over_gs_gives_the_local_and_s3_batches(folder: Path, monkeypatch) -> None:
    local = fingerprint(list(loader([folder])))
    with s3_server(monkeypatch, "shards", folder):
        assert fingerprint(list(loader([f"s3://shards/{BRACE}"]))) == local
    with gcs_server(monkeypatch, "shards", folder):
        ld = loader([f"gs://shards/{BRACE}"])
        assert (ld.images, len(ld)) == (20, 5)
        assert fingerprint(list(ld)) == local
        two = loader([f"gs://shards/{BRACE}"], num_workers=2)  # loader worker processes read gs:// too
        assert fingerprint(list(two)) == fingerprint(list(loader([folder], num_workers=2)))


def test_a_missing_gcs_bucket_fails_naming_the_url(folder: Path, monkeypatch) -> None:
    with gcs_server(monkeypatch, "shards", folder):
        with pytest.raises(DataError, match=r"^gs://nobucket/00000.tar: no such shard \(or no such bucket\)"):
            read_sizes([f"gs://nobucket/{BRACE}"])
