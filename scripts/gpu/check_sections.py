"""The correctness sections of ``make gpu-check`` (``check.py``): world, itc, resume, collectives."""

from __future__ import annotations

import json
import math
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from check_common import ITC_TOLERANCE, CheckFailed, Context, device, load_cfg, pretrain_args, sync

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

    from vlp.runs.training.pretrain import run_pretrain
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


@dataclass
class CollectiveInputs:
    """The fixed inputs of the collectives section (on the worker's device)."""

    x: Any  # [6, 5] rows to gather and reduce
    w: Any  # [6, 5] weights of the backward through the gather
    need: Any  # [4] row indices for fetch_rows
    flags: list[Any]  # bools and bool tensors for any_over_ranks
    values: dict[str, Any]  # floats and a scalar tensor for mean_over_ranks


def collective_inputs(dev: Any) -> CollectiveInputs:
    """The section's inputs from a generator seeded 0 (x, then w), moved to ``dev``."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g).to(dev)
    w = torch.randn(6, 5, generator=g).to(dev)
    need = torch.tensor([4, 0, 5, 2], device=dev)
    flags = [True, False, torch.tensor(True, device=dev), torch.tensor(False, device=dev)]
    values = {"a": 1.5, "b": float("nan"), "c": torch.tensor(-2.25, device=dev)}
    return CollectiveInputs(x, w, need, flags, values)


def run_collectives(inp: CollectiveInputs, dev: Any, counter: CountCalls) -> tuple[dict[str, Any], dict[str, int]]:
    """Every function of vlp.dist once -> (returned tensors by name, collective calls per function)."""
    import vlp.dist as vd

    x, w = inp.x, inp.w
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
        "fetch_rows", lambda: vd.fetch_rows(x, vd.shard_bounds(len(x), vd.world_size()), [inp.need])
    )
    for op in ("sum", "max", "min"):
        got[f"all_reduce_({op})"] = call(f"all_reduce_({op})", lambda op=op: vd.all_reduce_(x.clone(), op))
    got["any_over_ranks"] = call("any_over_ranks", lambda: vd.any_over_ranks(inp.flags, device=dev))
    for k, v in call("mean_over_ranks", lambda: vd.mean_over_ranks(inp.values, device=dev)).items():
        got[f"mean_over_ranks[{k}]"] = v
    call("barrier", vd.barrier)
    return got, calls


def expected_collectives(inp: CollectiveInputs, dev: Any) -> dict[str, Any]:
    """What each function returns at world size 1, by the names of :func:`run_collectives` (tensors)."""
    import torch

    x = inp.x
    return {
        "all_gather_nograd": x,
        "all_gather_with_grad": x,
        "all_gather_with_grad.grad": inp.w,
        "gather_rows": x,
        "fetch_rows": x[inp.need],
        "all_reduce_(sum)": x,
        "all_reduce_(max)": x,
        "all_reduce_(min)": x,
        "any_over_ranks": torch.tensor([True, False, True, False], device=dev),
        "mean_over_ranks[a]": torch.tensor(1.5, dtype=torch.float64),
        "mean_over_ranks[b]": torch.tensor(float("nan")),
        "mean_over_ranks[c]": torch.tensor(-2.25, dtype=torch.float64),
    }


def compare_collectives(
    expected: dict[str, Any], got: dict[str, Any], shortcut: dict[str, Any], dev: Any, checks: dict[str, bool]
) -> dict[str, dict[str, Any]]:
    """Each function's result against the expected value and the one-process shortcut's; adds a check per
    function to ``checks`` and returns the per-function record (value ok, equals the shortcut, device)."""
    import torch

    per: dict[str, dict[str, Any]] = {}
    for name, want in expected.items():
        t, s = got[name], shortcut[name]
        nan = name == "mean_over_ranks[b]"
        ok_value = bool(torch.isnan(t).all()) if nan else bool(torch.equal(t.cpu(), want.to(t.dtype).cpu()))
        ok_short = bool(torch.isnan(s).all()) if nan else bool(torch.equal(t.cpu(), s.cpu()))
        ok_device = t.device.type == dev.type
        per[name] = {"value": ok_value, "equals_one_process": ok_short, "device": str(t.device)}
        checks[f"{name}: value, = one-process result, on {dev.type}"] = ok_value and ok_short and ok_device
    return per


def run_collectives_in_group(
    inp: CollectiveInputs, dev: Any, backend: str
) -> tuple[bool, dict[str, Any], dict[str, int], float, dict[str, int]]:
    """:func:`run_collectives` inside a real one-process group (``backend``) under
    ``collectives_on_one_process()`` -> (is_dist inside, results, calls per function, seconds,
    torch.distributed calls per op)."""
    from datetime import timedelta

    import torch.distributed as dist

    import vlp.dist as vd

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
            got, calls = run_collectives(inp, dev, counter)
            seconds = sync() - t0
            ops = dict(counter.calls)
    finally:
        vd.destroy_group()
    return real, got, calls, seconds, ops


def section_collectives(ctx: Context) -> dict[str, Any]:
    """Every collective of vlp.dist through a real one-process group, against the one-process shortcuts."""
    import torch.distributed as dist

    dev = device()
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dist.is_initialized():
        raise CheckFailed("a process group already exists in the worker")
    inp = collective_inputs(dev)
    with CountCalls() as counter:
        shortcut, shortcut_calls = run_collectives(inp, dev, counter)  # no process group: the one-process shortcuts
    real, got, calls, seconds, ops = run_collectives_in_group(inp, dev, backend)
    checks: dict[str, bool] = {
        f"vlp.dist.is_dist() inside collectives_on_one_process ({backend}, world 1)": real,
        "no collective without a process group": sum(shortcut_calls.values()) == 0,
    }
    for fn, n in calls.items():
        if fn not in IDENTITY_AT_WORLD_1:
            checks[f"{fn}: ran a {backend} collective"] = n > 0
    per = compare_collectives(expected_collectives(inp, dev), got, shortcut, dev, checks)
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
