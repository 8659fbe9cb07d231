"""``make gpu-check`` and ``make gpu-check-compile`` (scripts/gpu/check.py ``--part eager`` and
``--part compile``) in ``--cpu`` mode: every section at tiny sizes, in a subprocess through the same
wrapper the Makefile runs, so the GPU check cannot rot unnoticed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, load_script

SECTIONS = ["world", "itc", "resume", "collectives", "bench", "loader", "zero2", "gloo2"]  # --part eager, the default
COMPILE_SECTIONS = ["world", "compile_64", "compile_128"]  # --part compile


def run_check(args: list[str], timeout: int = 600) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, GPU_PYTHON=sys.executable)
    env.pop("GPU_CHECK_FORCE_WHEELS", None)
    t0 = time.perf_counter()
    res = subprocess.run(
        ["sh", "scripts/gpu/check.sh", "--cpu", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return res, time.perf_counter() - t0


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    res, seconds = run_check(["--out", str(out)])
    assert (out / "gpu_check.json").is_file(), res.stdout[-3000:] + res.stderr[-3000:]
    return res, json.loads((out / "gpu_check.json").read_text()), out, seconds


@pytest.fixture(scope="module")
def cpu_compile_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check_compile")
    res, seconds = run_check(["--part", "compile", "--out", str(out)])
    assert (out / "gpu_check_compile.json").is_file(), res.stdout[-3000:] + res.stderr[-3000:]
    return res, json.loads((out / "gpu_check_compile.json").read_text()), out, seconds


def test_every_section_passes_and_the_report_is_complete(cpu_check):
    res, report, out, seconds = cpu_check
    failed = {k: v.get("error") for k, v in report["sections"].items() if not v["passed"]}
    assert res.returncode == 0 and not failed, (failed, res.stdout[-3000:])
    assert report["passed"] and report["complete"] and report["mode"] == "cpu"
    assert report["section_order"] == SECTIONS and sorted(report["sections"]) == sorted(SECTIONS)
    for name, sec in report["sections"].items():
        assert sec["checks"] and all(sec["checks"].values()), name
        assert 0 < sec["seconds"] < sec["budget_s"], name
    assert report["environment"]["device"].startswith("CPU") and report["environment"]["cuda_available"] is False
    table = (out / "gpu_check.md").read_text()
    assert table.startswith("# gpu-check: PASSED") and table in res.stdout  # the table is also printed
    for name in SECTIONS:
        assert f"| {name} | pass |" in table
    assert seconds < 300  # ~30 s on the 2-core development machine, shared with other jobs


def test_section_numbers_are_plausible(cpu_check):
    s = cpu_check[1]["sections"]
    w = s["world"]["results"]
    assert (w["test_images"], w["test_captions"]) == (20, 100) and w["train_pairs"] > 0

    itc = s["itc"]["results"]
    assert itc["abs_diff"] < 1e-4 and math.isfinite(itc["loss_fp32"]) and itc["loss_fp32"] > 0
    assert itc["abs_diff"] == pytest.approx(abs(itc["loss_bf16_autocast"] - itc["loss_fp32"]))

    r = s["resume"]["results"]
    assert (r["steps"], r["checkpoint_step"]) == (4, 2) and r["tensors_compared"] > 100
    assert r["max_loss_diff_resumed"] == 0.0 and r["max_weight_diff_resumed"] == 0.0  # exact on CPU
    assert math.isfinite(r["final_loss"]) and r["pairs_per_s_last_step"] > 0

    c = s["collectives"]["results"]
    assert c["backend"] == "gloo" and all(
        all(v for k, v in f.items() if k != "device") for f in c["functions"].values()
    )
    assert all(f["device"] == "cpu" for f in c["functions"].values())
    assert c["torch_distributed_calls"]["all_gather"] >= 2 and c["torch_distributed_calls"]["all_reduce"] >= 5
    assert all(n > 0 for fn, n in c["collective_calls"].items() if fn not in ("gather_rows", "fetch_rows"))

    rows = s["bench"]["results"]["rows"]  # eager bf16 at the two batches (64 and 128 on CUDA)
    assert [(r["precision"], r["batch"], r["compile"]) for r in rows] == [("bf16", 4, "off"), ("bf16", 8, "off")]
    for row in rows:
        assert row["pairs_per_s"] > 0 and row["gflop_per_pair"] > 0 and row["ms_per_step"] > 0
        assert row["mfu"] is None and row["peak_tflops"] is None  # no peak for a CPU
        assert row["pairs_per_s"] == pytest.approx(row["batch"] / (row["ms_per_step"] / 1000), rel=1e-6)
        # the profiled step: no CUDA runtime call on a CPU, but its aten ops were seen
        prof = row["profile"]
        assert prof["steps"] == 1 and prof["aten_ops_per_step"] > 100
        assert prof["kernel_launches_per_step"] == prof["syncs_per_step"] == 0 and prof["runtime_calls"] == {}

    z = s["zero2"]["results"]  # one process under DeepSpeed ZeRO-2 against the same run without it
    assert [r["step"] for r in z["zero2"]] == [1, 2, 3, 4] and max(z["max_loss_diff_per_step"]) <= 1e-5
    g = s["gloo2"]["results"]  # two gloo processes; on a GPU their tensors are CUDA tensors
    assert [r["rank"] for r in g["ranks"]] == [0, 1] and all(r["backend"] == "gloo" for r in g["ranks"])
    assert len(s["gloo2"]["checks"]) == 64 and g["device"] == "cpu"

    (loader,) = s["loader"]["results"]["rows"]  # data.image.decode=device, its device's share on the CPU here
    assert loader["source"] == "200x150" and loader["image_size"] == 64 and loader["batch"] == 4
    assert loader["device"].startswith("cpu") and loader["jpeg_share"] == 1.0 and loader["mean_abs_diff_vs_cpu"] is None
    assert min(loader["full_per_worker"], loader["device_loader_per_worker"], loader["device_images_per_s"]) > 0
    assert (
        json.loads(Path(loader["json"]).read_text())["device_decode"]["images_per_s"] == loader["device_images_per_s"]
    )
    assert "| loader, decode=device |" in (cpu_check[2] / "gpu_check.md").read_text()


def test_the_compile_part_passes_with_compilation_apart_and_cuda_graphs_not_captured(cpu_compile_check):
    """``--part compile``: train.compile=full at both batches with its warm-up (compilation) apart from the
    timed steps; on a CPU the CUDA-graph rows are not run and read "not captured", with no speed."""
    res, report, out, seconds = cpu_compile_check
    failed = {k: v.get("error") for k, v in report["sections"].items() if not v["passed"]}
    assert res.returncode == 0 and not failed, (failed, res.stdout[-3000:])
    assert report["part"] == "compile" and report["section_order"] == COMPILE_SECTIONS and report["complete"]
    assert not (out / "gpu_check.json").exists()  # the eager part's results are another file
    rows = [r for name in ("compile_64", "compile_128") for r in report["sections"][name]["results"]["rows"]]
    assert [(r["batch"], r["compile"], r["cuda_graphs"]) for r in rows] == [
        (4, "off", None),
        (4, "full", None),
        (4, "full", "not captured: CUDA graphs need a CUDA device"),
        (8, "full", None),
        (8, "full", "not captured: CUDA graphs need a CUDA device"),
    ]
    for r in rows:
        if r["cuda_graphs"] is not None:
            assert r["pairs_per_s"] is None and r["not_captured"] == r["cuda_graphs"]
            continue
        assert r["pairs_per_s"] > 0 and r["warmup"] == 1 and r["steps"] == 1
        assert r["first_step_s"] == r["warmup_s"] > 0  # the compilation, apart from the timed step
        if r["compile"] == "full":  # the forward and the post-step, compiled in the warm-up
            c = r["compile_record"]
            assert (c["graphs"], c["graph_breaks"], c["recompiles"], r["graphs_after_warmup"]) == (2, 0, 0, 0)
    table = (out / "gpu_check_compile.md").read_text()
    assert table.startswith("# gpu-check-compile: PASSED") and table in res.stdout
    assert "| base bf16 full+cuda_graphs, batch 8 | 8 | not captured: CUDA graphs need a CUDA device |" in table
    assert seconds < 300


def test_retrieval_runs_when_named(tmp_path):
    """Retrieval is in neither part (its target is met): ``--sections retrieval`` runs it."""
    out = tmp_path / "out"
    res, _ = run_check(["--out", str(out), "--sections", "retrieval"])
    s = json.loads((out / "gpu_check.json").read_text())["sections"]
    assert res.returncode == 0 and sorted(s) == ["retrieval", "world"], res.stdout[-3000:]
    ret = s["retrieval"]["results"]
    assert [r["precision"] for r in ret["rows"]] == ["fp32", "bf16"]
    for row in ret["rows"]:
        assert (row["n_images"], row["n_texts"]) == (20, 100) and 400 <= row["itm_pairs"] <= 480
        assert row["seconds"] > 0 and row["peak_memory_mb"] > 0
        assert row["eval_record"]["image_size"] == 32 and row["eval_record"]["k_test"] == 4


def test_a_failing_or_overrunning_section_is_recorded_and_the_others_still_run(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    # resume before the world exists: an error; retrieval over its 1 s budget: killed, and a fresh
    # worker runs collectives
    res, _ = run_check(
        [
            "--out",
            str(out),
            "--work",
            str(work),
            "--sections",
            "resume,world,retrieval,collectives",
            "--budget",
            "retrieval=1",
        ]
    )
    report = json.loads((out / "gpu_check.json").read_text())
    s = report["sections"]
    assert res.returncode == 1 and not report["passed"]
    assert not s["resume"]["passed"] and "no world" in s["resume"]["error"]
    assert s["world"]["passed"] and s["collectives"]["passed"]
    assert not s["retrieval"]["passed"] and s["retrieval"]["error"].startswith("timed out after")
    assert (out / "worker-2.log").is_file()  # the fresh worker
    assert "| retrieval | FAIL |" in (out / "gpu_check.md").read_text()


def load_check_module():
    return load_script("scripts/gpu/check.py", "gpu_check")


def test_cuda_rng_states_counted_in_every_checkpoint_format():
    """The first H100 run crashed here: a checkpoint holds the current device's state (a tensor)."""
    import torch

    count = load_check_module().cuda_rng_states
    assert count({"cuda": torch.zeros(16, dtype=torch.uint8)}) == 1  # this vlp: one device's state
    assert count({"cuda": [torch.zeros(16, dtype=torch.uint8)] * 3}) == 3  # older vlp: every visible device
    assert count({"cuda": None}) == 0 and count({"cuda": []}) == 0 and count({}) == 0


def test_peak_table():
    mod = load_check_module()
    assert mod.peak_bf16_tflops("NVIDIA H100 80GB HBM3") == (989.0, "H100 SXM")
    assert mod.peak_bf16_tflops("NVIDIA H100 PCIe") == (756.0, "H100 PCIe")
    assert mod.peak_bf16_tflops("NVIDIA H200") == (989.0, "H200")
    assert mod.peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == (312.0, "A100")
    assert mod.peak_bf16_tflops("NVIDIA L4") == (None, None)
