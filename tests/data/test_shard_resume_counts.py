"""A resume counts each bad sample of a shard stream once (issue 41, item 2a): a reader whose shards
run out reads them again within the epoch and passes over the bad samples it already counted; the
set of those samples is part of the position a checkpoint records (``ShardLoader.position()``), so a
resume does not count them a second time."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.data.test_shards import corrupt_first_jpeg, loader, shards, world  # noqa: F401 (fixtures)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_counts_every_bad_sample_once(shards: Path, tmp_path: Path, workers: int) -> None:  # noqa: F811
    """8 shards of 15 pairs, 4 with a corrupt image: a reader's good pairs do not fill its quota, so it
    cycles and meets its bad samples again. Resumed from the position after any batch, the bad samples
    counted before the stop plus those counted after it are the uninterrupted epoch's, batch by batch."""
    bad_dir = tmp_path / "bad"
    shutil.copytree(shards, bad_dir)
    for i in (0, 2, 4, 6):
        corrupt_first_jpeg(bad_dir / f"shard-0000{i}.tar")
    ld = loader([bad_dir], caption_mode="expand", on_bad="skip", num_workers=workers)
    full, positions = [], []
    for b in ld:
        full.append(b)
        positions.append(ld.position())
    assert sum(b["bad"] for b in full) >= 2  # the corrupt images met in this epoch, each counted once
    for k in range(1, len(full)):
        resumed = loader([bad_dir], caption_mode="expand", on_bad="skip", num_workers=workers)
        pos = positions[k - 1]
        resumed.set_position(pos["epoch"], pos["batches_done"], pos["reader_units"], pos["reader_bad"])
        rest = list(resumed)
        assert [b["ids"] for b in rest] == [b["ids"] for b in full[k:]], k
        assert [b["bad"] for b in rest] == [b["bad"] for b in full[k:]], k
