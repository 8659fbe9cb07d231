"""``vlp bench`` on a small world: phases, FLOP and MFU bookkeeping, JSON output, CLI."""

import json

import pytest

from tests.helpers import NO_TASKS, QUICK, TINY_ALBEF
from vlp.cli import main
from vlp.config import PretrainConfig, load_config
from vlp.errors import ConfigError
from vlp.flops import step_flops
from vlp.runs.bench.step import PHASES, run_bench

SMALL = [*TINY_ALBEF, *QUICK]
WORLD = dict(seed=0, n_train=24, n_val=0, n_test=0, **NO_TASKS)


def test_bench_reports_phases_flops_and_mfu(world, tmp_path):
    cfg = load_config(
        PretrainConfig, "configs/pretrain/shapes_tiny.yaml", [f"data.train=[{world['pretrain']}]", *SMALL]
    )
    out = tmp_path / "b.json"
    r = run_bench(cfg, steps=3, warmup=1, peak_tflops=0.5, out=out)
    assert json.loads(out.read_text())["pairs_per_s"] == r["pairs_per_s"]
    ms = r["ms_per_step"]
    assert all(ms[p] > 0 for p in PHASES) and ms["step"] == pytest.approx(sum(ms[p] for p in PHASES))
    assert r["pairs_per_s"] == pytest.approx(8 / (ms["step"] / 1000), rel=1e-6)  # 3 steps of 8 pairs
    lo, hi = (step_flops(cfg, t) / 1e9 for t in (3, cfg.model.text.max_len))  # padded length varies by batch
    assert lo < r["gflop_per_pair"] < hi
    assert r["achieved_tflops"] == pytest.approx(r["gflop_per_pair"] * r["pairs_per_s"] / 1e3, rel=1e-6)
    assert r["mfu"] == pytest.approx(r["achieved_tflops"] / 0.5, rel=1e-6)
    assert r["peak_memory_mb"] > 100 and r["processes"] == 1 and r["steps"] == 3


def test_bench_cli_prints_the_table_and_refuses_bad_counts(world, tmp_path, capsys):
    args = [
        "bench",
        "--config",
        "configs/pretrain/shapes_tiny.yaml",
        "--steps",
        "2",
        "--warmup",
        "0",
        f"data.train=[{world['pretrain']}]",
        *SMALL,
    ]
    assert main([*args, "--profile", "1"]) == 0
    printed = capsys.readouterr().out
    assert "pairs/s" in printed and "GFLOP per pair" in printed and "MFU n/a" in printed
    assert "profiled per step" in printed and "(1 steps, torch.profiler" in printed, printed
    with pytest.raises(ConfigError, match="--steps must be >= 1"):
        run_bench(load_config(PretrainConfig, "configs/pretrain/shapes_tiny.yaml", SMALL), steps=0)
    assert main([*args, "--profile", "-1"]) != 0
    assert "--profile >= 0, got 2 / 0 / -1" in capsys.readouterr().err
    assert main([*args, "--count-ops", "--profile", "1"]) != 0
    assert "--count-ops and --profile are separate counts" in capsys.readouterr().err


#: the base topology's structure (ViT 12 blocks, 6 text + 6 fusion layers, queue, bf16, batch 4) at
#: narrow widths: the dispatcher counts depend on the layers and the code path, not on the widths
#: (the same counts as model.vision.preset=base model.text.preset=base, measured)
BASE_STRUCTURE = [
    "model.vision.preset=base",
    "model.text.preset=base",
    "model.text.init=random",
    "model.vision.img_size=64",
    "model.vision.width=64",
    "model.vision.heads=2",
    "model.text.hidden=64",
    "model.text.heads=2",
    "model.text.intermediate=128",
    "model.embed_dim=32",
    "model.queue_size=64",
    "model.momentum_warmup_steps=0",
    "data.batch_size=4",
    "data.num_workers=0",
    "train.precision=bf16",
    "train.progress=false",
    "loss.mlm_slots=fixed",  # what "auto" chooses on CUDA
]


def test_count_ops_holds_the_base_step_to_its_launch_and_sync_budget(world, tmp_path, capsys):
    """``vlp bench --count-ops`` (issue 28): one step of the loop's own code at the dispatcher.
    Before issue 28 this step launched 4,220 kernel ops with 1,511 casts (369 of momentum weights)
    and 7 device syncs."""
    out = tmp_path / "ops.json"
    args = ["bench", "--count-ops", "--warmup", "1", "--config", "configs/pretrain/shapes_tiny.yaml", "--out", str(out)]
    assert main([*args, f"data.train=[{world['pretrain']}]", *BASE_STRUCTURE]) == 0
    printed = capsys.readouterr().out
    assert "kernel-launching ops" in printed and "device syncs" in printed
    r = json.loads(out.read_text())
    for key in ("kernel_ops_per_step", "casts_per_step", "syncs_per_step", "module_calls_per_forward"):
        assert isinstance(r[key], int), key
    assert set(r["per_phase"]) == {"forward", "backward", "optimizer", "statistics"}
    assert sum(p["kernel_ops"] for p in r["per_phase"].values()) == r["kernel_ops_per_step"]
    assert r["syncs_per_step"] == 0, r["sync_sites"]
    assert r["casts_of_watched_per_step"] == 0  # the twin runs on its bf16 copies
    assert 1000 < r["kernel_ops_per_step"] <= 2800
    assert 300 < r["casts_per_step"] <= 800
    assert r["module_calls_per_forward"] <= 1000


def test_count_ops_of_an_srcl_step_has_no_sync(world, tmp_path):
    """SRCL's weights and their statistics (issue 40 part 3: N_eff, alpha_h, the oracle's false
    negatives) are 0-d device tensors: a regulated step reads nothing back either. Before, alpha_h
    and the oracle's NaN were tensors built from host data (2 syncs); measured 2026-11-27 on this
    structure: 2,542 ops before, 2,570 with N_eff."""
    from vlp.lab.oracle import run_cache_oracle_features

    cache = run_cache_oracle_features(world["root"], [world["pretrain"]], tmp_path / "oracle")
    out = tmp_path / "ops.json"
    args = ["bench", "--count-ops", "--warmup", "1", "--config", "configs/pretrain/shapes_tiny.yaml", "--out", str(out)]
    srcl = ["loss.regulation=srcl", "loss.srcl.delta=4.0", f"loss.srcl.helper_features={cache}"]
    assert main([*args, f"data.train=[{world['pretrain']}]", *BASE_STRUCTURE, *srcl]) == 0
    r = json.loads(out.read_text())
    assert r["syncs_per_step"] == 0, r["sync_sites"]
    assert 1000 < r["kernel_ops_per_step"] <= 2800


def test_compiled_step_is_one_graph_without_recompiles_through_the_ramps(world, tmp_path, capsys):
    """``train.compile=full`` (issue 28): the forward, online and twin, is one graph with no break,
    the post-backward work (clipping, the non-finite check, AdamW, EMA, queues, statistics) one
    more, and 20 steps through the lr warm-up, the alpha ramp and the momentum ramp compile nothing
    after the first step. Dynamo's capture is backend-independent; the "eager" backend skips codegen."""
    import torch._dynamo

    torch._dynamo.reset()
    out = tmp_path / "ops.json"
    args = [
        "bench",
        "--count-ops",
        "--warmup",
        "19",
        "--config",
        "configs/pretrain/shapes_tiny.yaml",
        "--out",
        str(out),
    ]
    ramps = ["train.warmup_steps=10", "loss.alpha_ramp_steps=10", "model.momentum_warmup_steps=10"]
    compiled = ["train.compile=full", "train.compile_backend=eager", "data.text_padding=max_len"]
    small = [o for o in SMALL if not o.startswith("data.batch_size=")]  # a key given twice is refused
    assert main([*args, f"data.train=[{world['pretrain']}]", *small, "data.batch_size=4", *ramps, *compiled]) == 0
    assert "train.compile=full: 2 graphs, 0 graph breaks, 0 compiled after step 1" in capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["graphs_per_step"] == [2] * 20 and r["graph_breaks"] == 0
    # outside the graphs (issue 44: the forward's eager work before its graph is counted; a counter
    # lifted for the whole forward phase saw 4): the forward's 33 (MLM masks, ITM races, clamp_temp,
    # the alpha fill), the step number and the learning rate filled in, the bad-sample count; no sync
    assert set(r["per_phase"]) == {"forward", "optimizer", "statistics"} and r["syncs_per_step"] == 0
    assert r["per_phase"]["forward"]["kernel_ops"] == 33, (r["top_ops"], r["per_phase"])
    assert r["kernel_ops_per_step"] == 37, (r["top_ops"], r["per_phase"])
    torch._dynamo.reset()


#: what inductor logs when it cannot capture a graph (compile_fx's "mutated inputs" reason, shortened)
SKIP_REASON = "skipping cudagraphs due to mutated inputs (1 instances)"


def skipping_backend(gm, example_inputs):
    """A dynamo backend that, like inductor in reduce-overhead mode when it cannot capture a graph, counts
    and logs a CUDA-graph skip through inductor's own function, then runs the graph eagerly."""
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    log_cudagraph_skip_and_bump_counter(SKIP_REASON)
    return gm.forward


def skipping_config(world, tmp_path, *extra):
    """A compiled CUDA-graph pretraining config whose backend is :func:`skipping_backend`."""
    import torch._dynamo

    torch._dynamo.reset()
    if "vlp_test_cudagraph_skip" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(skipping_backend, name="vlp_test_cudagraph_skip")
    compiled = ["train.compile=full", "train.cuda_graphs=true", "data.text_padding=max_len", "data.batch_size=4"]
    cfg = load_config(
        PretrainConfig,
        "configs/pretrain/shapes_tiny.yaml",
        [f"data.train=[{world['pretrain']}]", *SMALL, *compiled, f"output_dir={tmp_path / 'run'}", *extra],
    )
    cfg.train.compile_backend = "vlp_test_cudagraph_skip"  # after the config's check, which wants inductor
    return cfg


def test_the_training_loop_warns_a_cuda_graph_skip_with_inductors_reason(world, tmp_path):
    """A run whose first compiled step was not captured as CUDA graphs says so once, with the reason
    inductor logged (the same record as ``vlp bench``), not only a count."""
    import warnings

    import torch._dynamo

    from vlp.runs.training.pretrain import run_pretrain

    cfg = skipping_config(world, tmp_path, "train.steps=2")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message="train.cuda_graphs: CUDA graphs need a CUDA device")
        run_pretrain(cfg)
    torch._dynamo.reset()
    skips = [str(w.message) for w in seen if "run without CUDA graphs" in str(w.message)]
    assert skips == [f"train.cuda_graphs: 2 graph(s) of the step run without CUDA graphs (not captured: {SKIP_REASON})"]


def test_a_cuda_graph_skip_is_not_captured_in_vlp_bench_and_gpu_check(world, tmp_path):
    """Issue 44: a fall-back is a failure, not a figure. A step whose graphs inductor did not capture
    as CUDA graphs (forced here: a backend that skips through inductor's skip function) is reported
    as "not captured: REASON" by ``vlp bench`` and by gpu-check's row, table and check, no speed."""
    import warnings

    import torch._dynamo

    from tests.helpers import load_script
    from vlp.runs.bench.step import format_bench

    cfg = skipping_config(world, tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="train.cuda_graphs: CUDA graphs need a CUDA device")
        r = run_bench(cfg, steps=1, warmup=1)
    torch._dynamo.reset()
    assert r["cuda_graphs"] == f"not captured: {SKIP_REASON}"
    assert r["compile_record"]["cudagraph_skips"] == 2 and r["compile_record"]["skip_reasons"] == [SKIP_REASON]
    assert r["compile_record"]["graphs"] == 2 and r["graphs_after_warmup"] == 0  # the forward, the post-step
    printed = format_bench(r)
    assert f"pairs/s             not captured: {SKIP_REASON}" in printed, printed
    assert f"{r['pairs_per_s']:.1f}" not in printed.splitlines()[1]

    load_script("scripts/gpu/check.py", "gpu_check")  # puts scripts/gpu on the path of its modules
    perf, report = load_script("scripts/gpu/check_perf.py"), load_script("scripts/gpu/check_report.py")
    row = perf.bench_row("base bf16 full+cuda_graphs, batch 4", [], r, None, 1.0)
    assert row["not_captured"] == f"not captured: {SKIP_REASON}"
    assert perf.compile_checks([row], on_cuda=False) == {
        "base bf16 full+cuda_graphs, batch 4: pairs/s > 0": True,
        "base bf16 full+cuda_graphs, batch 4: 2 graphs, no break, no recompile": True,
        "base bf16 full+cuda_graphs, batch 4: CUDA graphs captured": False,
    }
    (line,) = [t for t in report.bench_table([row]) if t.startswith("| base bf16 full+cuda_graphs")]
    assert line.startswith(f"| base bf16 full+cuda_graphs, batch 4 | 4 | not captured: {SKIP_REASON} |"), line
    assert f"{r['pairs_per_s']:.1f}" not in line
