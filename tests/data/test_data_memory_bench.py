"""``scripts/bench/data_memory.py`` (start-up and loader-worker memory at ALBEF 4M scale) at a tiny
scale: it generates the file, loads it, runs forked workers over an epoch and reports every
process's memory, so the script cannot rot. Figures are not checked, only their sanity."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import load_script
from vlp.data.formats import load_pairs
from vlp.features.helper_cache import HelperCache
from vlp.features.targets import LatentTargets


def test_data_memory_benchmark_tiny(tmp_path: Path) -> None:
    bench = load_script("scripts/bench/data_memory.py")
    args = ["--entries", "2000", "--workers", "2", "--batch-size", "64", "--data", str(tmp_path)]
    report = bench.main([*args, "--out", str(tmp_path / "report.json")])
    assert json.loads((tmp_path / "report.json").read_text()) == report
    assert (report["entries"], report["samples"], report["workers"], report["form"]) == (2000, 2000, 2, "SampleTable")
    assert report["images"] == 1500 + 500 // 5  # the first quarter: five entries per image
    assert report["items"] == report["batches"] * 64 == 2000 // 64 * 64 and report["aborted"] is None
    assert 0 < report["held_mib"] < 2 * report["file_mib"]
    assert report["startup_seconds"]["total"] >= 0 and report["epoch_seconds"] > 0
    workers = report["worker_memory"]
    assert sorted(w["worker"] for w in workers) == [0, 1] and len({w["pid"] for w in workers}) == 2
    for m in [report["main_after_startup"], report["main_after_epoch"]] + [w["end"] for w in workers]:
        assert 0 < m["uss"] <= m["pss"] <= m["rss"]
    assert all(w["growth_uss_mib"] == round(w["end"]["uss"] - w["start"]["uss"], 1) for w in workers)
    assert report["worker_growth_mib"]["max"] == max(w["growth_uss_mib"] for w in workers)

    ann = next(tmp_path.glob("albef_2000_*.json"))  # kept in --data: ALBEF's format, as vlp loads it
    entries = json.loads(ann.read_text())
    assert set(entries[0]) == {"image", "caption"} and entries[-1]["image"] == "/data/cc3m/train/000001999.jpg"
    assert 40 <= sum(len(e["caption"]) for e in entries) / len(entries) <= 75
    assert len(load_pairs([ann])) == 2000


def test_data_memory_benchmark_with_helper_cache_and_targets(tmp_path: Path) -> None:
    """``--features DIM``: a synthetic helper cache and LTD targets of the file's samples, loaded in
    the timed start-up, looked up by every item of the epoch."""
    bench = load_script("scripts/bench/data_memory.py")
    args = ["--entries", "1000", "--workers", "1", "--batch-size", "50", "--features", "4", "--data", str(tmp_path)]
    report = bench.main(args)
    startup = report["startup_seconds"]
    assert {"load_pairs", "helper_cache", "targets", "dataset", "total"} <= set(startup)
    assert report["features_dim"] == 4 and report["features_written_seconds"] >= 0 and report["items"] == 1000
    ann = next(tmp_path.glob("albef_1000_*.json"))
    cache = HelperCache.load(ann.with_name(f"{ann.stem}_helper4"))
    targets = LatentTargets.load(ann.with_name(f"{ann.stem}_targets4.safetensors"))
    samples = load_pairs([ann])
    assert (len(cache.image_index), cache.dim, targets.dim) == (750 + 250 // 5, 4, 4)
    cache.check_covers(samples)
    targets.check_covers(samples)
    written = {f: f.stat().st_mtime_ns for f in tmp_path.rglob("*") if f.is_file()}
    assert bench.main(args)["items"] == 1000  # the files are reused, not written again
    assert {f: f.stat().st_mtime_ns for f in tmp_path.rglob("*") if f.is_file()} == written
