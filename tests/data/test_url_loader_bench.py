"""``scripts/bench/url_loader.py`` (the training loader on URL shards: samples/s per worker from the
local S3 and HTTP servers, start-up of a large shard set) at a tiny scale, so the script cannot rot.
Figures are not checked, only their sanity and the requests start-up makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("scripts/bench/url_loader.py")


def test_throughput_reads_every_source_through_the_training_loader(bench, tmp_path: Path) -> None:
    args = ["--images", "48", "--per-shard", "8", "--batch", "8", "--workers", "1", "2", "--rounds", "1"]
    r = bench.main(["throughput", *args, "--tmp", str(tmp_path), "--out", str(tmp_path / "r.json")])
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(json.dumps(r))
    assert (r["resolution"], r["decode"], r["source_size"]) == (256, "full", "500x375")  # albef_4m's transform
    assert 30 < r["mean_jpeg_kb"] < 80  # photo-like JPEGs, not flat colour
    assert set(r["io"]) == set(r["loader"]) == {"local", "http", "s3"}
    for name, per in r["loader"].items():
        assert set(per) == {1, 2}
        for workers, x in per.items():
            assert x["samples"] == 48  # one epoch: 6 shards of 8, batches of 8, nothing lost
            assert x["samples_per_s"] > 0 and x["per_worker"] == pytest.approx(x["samples_per_s"] / workers, abs=0.1)
            assert x["worker_cpu_ms"] > 0 and x["main_cpu_ms"] > 0, (name, workers)
    assert all(x["samples_per_s"] > 0 and x["mb_per_s"] > 0 for x in r["io"].values())
    assert list(tmp_path.iterdir()) == [tmp_path / "r.json"]  # shards and JPEGs removed


@pytest.mark.parametrize("counts", ["stats", "index", "num_samples"])
def test_startup_asks_only_for_the_counts_before_the_first_batch(bench, tmp_path: Path, counts: str) -> None:
    r = bench.main(["startup", "--shards", "30", "--batch", "8", "--counts", counts, "--tmp", str(tmp_path)])
    # stats: one GET per stats file; index: the index file only (after one pass that read every tar,
    # timed apart), beside the first stats file asked for and found missing, then the first tar's HEAD;
    # num_samples: the first tar's HEAD
    expected = {"stats": 30, "index": 2, "num_samples": 1}[counts]
    assert r["requests_before_first_batch"] == expected
    assert r["requests"] > expected and r["startup_s"] >= r["counts_and_loader_s"] >= 0
    if counts == "index":
        assert r["index_requests"] >= 30
