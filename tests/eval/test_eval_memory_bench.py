"""``scripts/bench/eval_memory.py --quick`` (the COCO-size evaluation memory benchmark at smoke size)
runs and reports every phase, so the script cannot rot."""

from __future__ import annotations

import json

import vlp.eval.retrieval as retrieval
from tests.helpers import load_script


def test_eval_memory_benchmark_quick(tmp_path):
    bench = load_script("scripts/bench/eval_memory.py")
    score_pairs = retrieval.score_pairs
    report = bench.main(
        [
            "--quick",
            "--images",
            "12",
            "--workers",
            "0",
            "--batch",
            "16",
            "--data",
            str(tmp_path),
            "--out",
            str(tmp_path / "report.json"),
        ]
    )
    assert retrieval.score_pairs is score_pairs  # the timing wrapper is removed again
    assert json.loads((tmp_path / "report.json").read_text()) == report
    assert (report["images"], report["captions"], report["k_test"]) == (12, 60, 4)
    assert 12 * 4 <= report["itm_pairs"] <= 4 * (12 + 60)
    assert list(report["phases"]) == ["embed", "itc", "itm", "final", "metrics"]
    assert all(p["seconds"] >= 0 for p in report["phases"].values()) and report["phases"]["itm"]["seconds"] > 0
    assert report["peak_rss_mib"] > 0 and report["precision"] == "fp32" and report["score_dtype"] == "torch.float64"
    assert 0 <= report["r_mean"] <= 100
