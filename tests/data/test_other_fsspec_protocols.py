"""A storage backend vlp does not name: any fsspec protocol reads shards with no edit under vlp/
(docs/architecture.md, "Adding a data source"). Here fsspec's in-memory filesystem (``memory://``),
which no vlp module mentions, with img2dataset's ``_stats.json`` files beside the tars."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from tests.data.test_img2dataset_shards import PER_SHARD, SHARDS, loader, write_img2dataset

BUCKET = "memory://vlp-test-bucket/cc"


@pytest.fixture()
def in_memory(tmp_path: Path):
    """img2dataset's shards copied into fsspec's memory filesystem; removed afterwards."""
    folder = write_img2dataset(tmp_path / "cc")
    fs = fsspec.filesystem("memory")
    for f in sorted(folder.iterdir()):
        with fs.open(f"{BUCKET}/{f.name}", "wb") as out:
            out.write(f.read_bytes())
    yield f"{BUCKET}/{{00000..{SHARDS - 1:05d}}}.tar"
    fs.rm(BUCKET, recursive=True)


def test_a_protocol_vlp_does_not_name_streams_every_sample_once(in_memory: str) -> None:
    vlp = Path(__file__).parents[2] / "vlp"
    assert not any("memory://" in p.read_text() for p in vlp.rglob("*.py"))  # nothing in vlp/ names it
    ld = loader([in_memory], batch_size=2, caption_mode="sample")
    ids = [i for batch in ld for i in batch["ids"]]
    assert ld.images == SHARDS * PER_SHARD  # counted from the _stats.json files, not a scan
    assert len(ids) == len(set(ids)) == SHARDS * PER_SHARD // 2 * 2  # every sample of the epoch, once
    again = [i for batch in loader([in_memory], batch_size=2, caption_mode="sample") for i in batch["ids"]]
    assert again == ids  # the same order for the same seed
