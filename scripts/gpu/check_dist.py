"""The launched sections of ``make gpu-check`` (``check.py``, part eager): DeepSpeed ZeRO-2 with one
process, and two processes through gloo with CUDA tensors (one GPU cannot hold two NCCL ranks).

Run as a script by ``torch.distributed.run`` (``--gloo-ranks OUT``), it is one rank of the gloo check.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # check_common when run as a rank

from check_common import ROOT, CheckFailed, Context, pretrain_args  # noqa: E402

ZERO2 = "configs/deepspeed/zero2.json"
STEPS = 4
#: the global rows each of the two ranks fetches (fetch_rows) in the gloo check
NEED = ([5, 0, 3], [1, 6])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd: list[str], log: Path, env: dict[str, str], timeout: float) -> float:
    """Run ``python CMD`` in the repository under ``torch.distributed.run`` on a free port, its output in
    ``log``; returns its seconds, raises :class:`CheckFailed` (with the log's tail) when it fails."""
    full = [sys.executable, "-m", "torch.distributed.run", f"--master_port={_free_port()}", *cmd]
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        rc = subprocess.run(
            full, cwd=ROOT, env={**os.environ, **env}, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout
        )
    if rc.returncode:
        raise CheckFailed(f"{' '.join(cmd[:4])} ... exited with {rc.returncode}: {log.read_text()[-1500:]}")
    return time.perf_counter() - t0


def _losses(run: Path) -> list[dict[str, float]]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: r[k] for k in ("step", "loss", "itc", "itm", "mlm") if k in r} for r in recs]


def section_zero2(ctx: Context) -> dict[str, Any]:
    """``vlp pretrain`` under DeepSpeed ZeRO-2 (accelerate's integration, ``configs/deepspeed/zero2.json``)
    with one process, against the same run without DeepSpeed: losses of 4 fp32 steps."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        raise CheckFailed("DeepSpeed is not importable here (pip install -e '.[deepspeed]', or carry its wheel)")
    p = ctx.plan
    args = pretrain_args(
        ctx,
        p.resume_model,
        f"data.batch_size={p.resume_batch}",
        f"train.steps={STEPS}",
        "train.log_every=1",
        "train.warmup_steps=0",
        "train.grad_clip=1.0",
        "train.save_state=false",
        "model.momentum_warmup_steps=0",
    )
    cli = ["-m", "vlp.cli", "pretrain", "--config", "configs/pretrain/shapes_tiny.yaml"]
    runs = {name: ctx.work / f"zero2_{name}" for name in ("plain", "zero2")}
    ds = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(ROOT / ZERO2)}
    seconds = {
        name: launch(
            ["--nproc_per_node=1", *cli, *args, f"output_dir={run}"],
            ctx.out / f"{run.name}.log",
            ds if name == "zero2" else {},
            240,
        )
        for name, run in runs.items()
    }
    plain, zero2 = _losses(runs["plain"]), _losses(runs["zero2"])
    diffs = [max(abs(a[k] - b[k]) for k in a if k != "step") for a, b in zip(plain, zero2)]
    tol = 1e-5 if ctx.plan.cpu else 1e-3  # CUDA kernels are not bit-deterministic between runs
    checks = {
        f"ZeRO-2 ran {STEPS} steps": [r["step"] for r in zero2] == list(range(1, STEPS + 1)),
        "losses finite": all(math.isfinite(v) for r in zero2 for v in r.values()),
        f"step 1's losses equal the run without DeepSpeed (to {tol:g})": bool(diffs) and diffs[0] <= tol,
        "every step's losses within 1e-2 of it": bool(diffs) and max(diffs) <= 1e-2,
    }
    return {
        "results": {"steps": STEPS, "seconds": seconds, "max_loss_diff_per_step": diffs, "zero2": zero2},
        "checks": checks,
        "summary": f"1 process, {STEPS} fp32 steps: losses vs without DeepSpeed, max abs diff per step "
        + ", ".join(f"{d:.2g}" for d in diffs),
    }


def section_gloo2(ctx: Context) -> dict[str, Any]:
    """Two processes in one gloo group, each with its tensors on the device (CUDA on a GPU): every
    ``vlp.dist`` collective with CUDA tensors against the same with CPU tensors and the expected values."""
    out = ctx.work / "gloo2"
    out.mkdir(parents=True, exist_ok=True)
    env = {"OMP_NUM_THREADS": "1"}
    seconds = launch(["--nproc_per_node=2", __file__, "--gloo-ranks", str(out)], ctx.out / "gloo2.log", env, 120)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    names = sorted(ranks[0]["checks"])
    checks = {f"rank {r}: {n}": bool(ranks[r]["checks"].get(n)) for r in range(2) for n in names}
    return {
        "results": {"seconds": seconds, "device": ranks[0]["device"], "ranks": ranks},
        "checks": checks,
        "summary": f"gloo, 2 processes, tensors on {ranks[0]['device']}: {sum(checks.values())}/{len(checks)} checks hold",
    }


def _collectives(dev: Any) -> dict[str, Any]:
    """Every vlp.dist collective once on this rank's inputs on ``dev`` -> results by name (on the CPU)."""
    import torch

    import vlp.dist as vd

    r, w = vd.rank(), vd.world_size()
    x = (torch.arange(12.0).reshape(4, 3) + 100 * r).to(dev)
    got: dict[str, Any] = {"all_gather_nograd": vd.all_gather_nograd(x)}
    xg = x.clone().requires_grad_(True)
    y = vd.all_gather_with_grad(xg)
    (y * torch.arange(float(y.numel()), device=dev).reshape(y.shape)).sum().backward()
    got["all_gather_with_grad"], got["all_gather_with_grad.grad"] = y.detach(), xg.grad
    bounds = vd.shard_bounds(4 * w, w)
    got["gather_rows"] = vd.gather_rows(x, bounds)
    need = [torch.tensor(i, device=dev) for i in NEED]  # each rank's wanted rows, every rank passes all
    got["fetch_rows"] = vd.fetch_rows(x, bounds, need)
    for op in ("sum", "max", "min"):
        got[f"all_reduce_({op})"] = vd.all_reduce_(x.clone(), op)
    got["any_over_ranks"] = vd.any_over_ranks([r == 1, False, torch.tensor(r == 0, device=dev)], device=dev)
    for k, v in vd.mean_over_ranks({"a": float(r), "b": torch.tensor(2.0 * r, device=dev)}, device=dev).items():
        got[f"mean_over_ranks[{k}]"] = v
    vd.barrier()
    return {k: (v.detach().cpu(), str(v.device)) for k, v in got.items()}


def gloo_rank(out: Path) -> None:
    """One rank of :func:`section_gloo2`: the collectives with device tensors, then with CPU tensors,
    compared with each other and with the expected values; writes ``out/rankR.json``."""
    import torch
    import torch.distributed as dist

    import vlp.dist as vd

    dist.init_process_group("gloo")
    r = dist.get_rank()
    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    on_dev, on_cpu = _collectives(dev), _collectives(torch.device("cpu"))
    both = torch.cat([torch.arange(12.0).reshape(4, 3), torch.arange(12.0).reshape(4, 3) + 100])
    expected = {
        "all_gather_nograd": both,
        "all_gather_with_grad": both,
        "gather_rows": both,
        "fetch_rows": both[NEED[r]],
        "all_reduce_(sum)": both[:4] + both[4:],
        "all_reduce_(max)": both[4:],
        "all_reduce_(min)": both[:4],
        "any_over_ranks": torch.tensor([True, False, True]),
        "mean_over_ranks[a]": torch.tensor(0.5, dtype=torch.float64),
        "mean_over_ranks[b]": torch.tensor(1.0, dtype=torch.float64),
    }
    checks = {f"{k}: on {dev.type}": v[1].startswith(dev.type) for k, v in on_dev.items()}
    checks |= {f"{k}: {dev.type} tensors = CPU tensors": torch.equal(on_dev[k][0], on_cpu[k][0]) for k in on_dev}
    checks |= {f"{k}: expected value": torch.equal(on_dev[k][0], v.to(on_dev[k][0].dtype)) for k, v in expected.items()}
    rec = {"rank": r, "device": str(dev), "backend": dist.get_backend(), "checks": checks}
    (out / f"rank{r}.json").write_text(json.dumps(rec, indent=2))
    vd.destroy_group()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--gloo-ranks":
        sys.path.insert(0, str(ROOT))
        gloo_rank(Path(sys.argv[2]))
