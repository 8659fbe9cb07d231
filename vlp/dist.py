"""Every collective vlp runs, in one place: safe on one process (a no-op without a process group)
and on the run's device.

NCCL only takes tensors on the process's GPU. So what reaches ``torch.distributed`` here is either
a tensor the caller passed (already on the run's device) or one made here with the caller's
``device`` (a required keyword: no collective builds a tensor on the default device). Nothing
else in vlp calls ``torch.distributed`` collectives (``tests/test_collectives.py`` checks both).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import types
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist

_ONE_PROCESS_GROUP = False  # see collectives_on_one_process


def destroy_group() -> None:
    """Destroy the process group (no-op without one) and let go of it for good; also run at
    interpreter exit, for the group a process still holds then.

    ``destroy_process_group`` only drops torch's own references. A library imported after the group
    was made and binding it as a function default (DeepSpeed's ``TorchBackend.barrier``, which
    accelerate's ``unwrap_model`` imports in every run where DeepSpeed is installed) kept the group,
    and its gloo threads, alive until interpreter teardown destroyed them in any order: "terminate
    called without an active exception", exit -6, in a run that had finished. So every function
    default still holding a process group afterwards is reset to ``None`` (DeepSpeed's functions
    and torch's read ``None`` as the default group); nothing can use a destroyed group anyway."""
    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        _release_bound_groups()


def _release_bound_groups() -> None:
    """Reset every function default (positional or keyword-only) that holds a ``ProcessGroup``."""
    gc.collect()
    for fn in gc.get_objects():
        if not isinstance(fn, types.FunctionType):
            continue
        if fn.__defaults__ and any(isinstance(d, dist.ProcessGroup) for d in fn.__defaults__):
            fn.__defaults__ = tuple(None if isinstance(d, dist.ProcessGroup) else d for d in fn.__defaults__)
        if fn.__kwdefaults__ and any(isinstance(d, dist.ProcessGroup) for d in fn.__kwdefaults__.values()):
            fn.__kwdefaults__ = {
                k: None if isinstance(d, dist.ProcessGroup) else d for k, d in fn.__kwdefaults__.items()
            }


atexit.register(destroy_group)  # a finished run exits with its group let go of


class OtherRankDone(Exception):
    """Raised on ranks > 0 once the multi-process part of a job is over (fine-tuning: after every
    rank has evaluated its share of the test splits, rank 0 alone writes the results); ``vlp`` then
    exits with status 0."""


def is_dist() -> bool:
    """A process group of several processes exists (or one of one, inside :func:`collectives_on_one_process`)."""
    return dist.is_available() and dist.is_initialized() and (dist.get_world_size() > 1 or _ONE_PROCESS_GROUP)


@contextlib.contextmanager
def collectives_on_one_process() -> Iterator[None]:
    """Inside the block, a process group of world size 1 runs the real collectives instead of the
    one-process shortcuts (``make gpu-check`` exercises NCCL with one GPU this way)."""
    global _ONE_PROCESS_GROUP
    old, _ONE_PROCESS_GROUP = _ONE_PROCESS_GROUP, True
    try:
        yield
    finally:
        _ONE_PROCESS_GROUP = old


def barrier() -> None:
    """Wait for every rank (no-op on one process)."""
    if is_dist():
        dist.barrier()


def world_size() -> int:
    return dist.get_world_size() if is_dist() else 1


def rank() -> int:
    return dist.get_rank() if is_dist() else 0


def own_rows(b: int) -> slice:
    """This rank's rows of a tensor gathered from ``b`` rows per rank (rank order)."""
    r = rank()
    return slice(r * b, r * b + b)


def launch_rank() -> tuple[int, int]:
    """(rank, world size) of this process: the process group's, or before it exists (the data is
    built before the accelerator) the launcher's ``RANK`` / ``WORLD_SIZE`` (torchrun, accelerate,
    deepspeed)."""
    if is_dist():
        return rank(), world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


@torch.no_grad()
def all_gather_nograd(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` [B, ...] from every rank along dim 0 -> [world*B, ...]; no gradient."""
    if not is_dist():
        return x.detach()
    out = [torch.empty_like(x) for _ in range(world_size())]
    dist.all_gather(out, x.contiguous())
    return torch.cat(out, 0)


def shard_bounds(n: int, world: int) -> list[int]:
    """Contiguous shards of ``n`` rows, sizes differing by at most one: rank r holds rows
    ``b[r]:b[r+1]`` of the returned ``b`` [world + 1]."""
    return [r * n // world for r in range(world + 1)]


def gather_rows(local: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    """Rows of every rank in rank order -> [bounds[-1], ...]; rank r holds ``local`` =
    rows ``bounds[r]:bounds[r+1]``. Shards are padded to the largest so that every rank sends the
    same shape, then trimmed. Identity on one process."""
    counts = [b - a for a, b in zip(bounds, bounds[1:])]
    if len(counts) == 1 and not is_dist():
        return local
    pad = local.new_zeros((max(counts) - len(local), *local.shape[1:]))
    every = all_gather_nograd(torch.cat([local, pad])).reshape(len(counts), max(counts), *local.shape[1:])
    return torch.cat([every[r, :c] for r, c in enumerate(counts)])


def fetch_rows(local: torch.Tensor, bounds: list[int], need: list[torch.Tensor]) -> torch.Tensor:
    """Rows ``need[rank()]`` (global indices) of a tensor whose rows are sharded over the ranks:
    rank q holds rows ``bounds[q]:bounds[q+1]`` (here: ``local``) and sends each other rank the
    rows of its shard that rank needs, point-to-point. Every rank passes the same ``need`` (one
    index tensor per rank), so both ends of a transfer know its shape. -> [len(need[rank()]), ...]"""
    me = rank()
    wanted = need[me]
    out = local.new_empty((len(wanted), *local.shape[1:]))
    ops, arriving = [], []
    for q in range(len(bounds) - 1):
        at = ((wanted >= bounds[q]) & (wanted < bounds[q + 1])).nonzero().flatten()
        if q == me:
            out[at] = local[wanted[at] - bounds[me]]
            continue
        theirs = need[q]
        send = theirs[(theirs >= bounds[me]) & (theirs < bounds[me + 1])] - bounds[me]
        if len(send):
            ops.append(dist.P2POp(dist.isend, local[send].contiguous(), q))
        if len(at):
            arriving.append((at, local.new_empty((len(at), *local.shape[1:]))))
            ops.append(dist.P2POp(dist.irecv, arriving[-1][1], q))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    for at, rows in arriving:
        out[at] = rows
    return out


class _GatherWithGrad(torch.autograd.Function):
    """[n, ...] on each rank -> [world_size * n, ...] (rank order); the backward sums every rank's
    gradient for the rows a rank gave and hands it that block.

    Written here rather than taken from ``torch.distributed.nn.functional``: that module (deprecated
    in torch 2.14) binds the default group as a default argument when it is first imported, so a group
    made before vlp first gathered outlived ``destroy_process_group``, and its gloo threads were torn
    down at exit in any order ("terminate called without an active exception", exit -6). Nothing
    here keeps a reference to the group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return all_gather_nograd(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # noqa: D102
        w, r = dist.get_world_size(), dist.get_rank()
        grad = grad.contiguous()
        if dist.get_backend() == "nccl":
            mine = torch.empty_like(grad.chunk(w, 0)[r])
            dist.reduce_scatter_tensor(mine, grad)
            return mine
        total = grad.clone()  # gloo has no reduce_scatter: reduce it all, keep this rank's block
        dist.all_reduce(total)
        return total.chunk(w, 0)[r].contiguous()


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Like :func:`all_gather_nograd`, but gradients flow back to every rank's ``x`` (in-batch
    negatives from the whole global batch, as CLIP-style dual encoders use). The backward sums
    every rank's gradient for ``x`` into its owner, so use it with a *local* loss (this rank's rows
    against gathered candidates): DDP's gradient mean then gives the global loss's gradient.
    ``x``: [n, ...], the same shape on every rank -> [world_size * n, ...]."""
    if not is_dist():
        return x
    return _GatherWithGrad.apply(x)  # type: ignore[no-any-return]


def all_reduce_(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``t`` reduced over the ranks in place (``op``: sum | max | min), returned; identity on one
    process. ``t`` must be on the run's device."""
    if is_dist():
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        dist.all_reduce(t, op=ops[op])
    return t


def _scalars(values: Sequence[bool | float | torch.Tensor], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Python numbers and 0-d tensors -> one [n] tensor of ``dtype`` on ``device`` (no host read)."""
    return torch.stack(
        [torch.as_tensor(v, device=device).detach().reshape(()).to(device=device, dtype=dtype) for v in values]
    )


def any_over_ranks(flags: Sequence[bool | torch.Tensor], *, device: torch.device) -> torch.Tensor:
    """Each flag (bool or 0-d tensor) OR-ed over the ranks in one all-reduce on ``device`` (the
    run's): a bool tensor [len(flags)], left on the device (reading it is the caller's choice). Every
    rank must call it at the same point."""
    return all_reduce_(_scalars(flags, device, torch.float32), "max") > 0


def mean_over_ranks(values: dict[str, torch.Tensor | float], *, device: torch.device) -> dict[str, torch.Tensor]:
    """Mean of each value over the ranks that measured it (NaN = not measured) -> 0-d fp64 tensors
    on ``device`` (the run's; nothing is read back to the host here). Every rank must call it with
    the same keys. Logged losses are then those of the global batch, not of rank 0's share."""
    keys = sorted(values)
    if not keys:
        return {}
    x = _scalars([values[k] for k in keys], device, torch.float64)
    seen = ~torch.isnan(x)
    t = all_reduce_(torch.cat([torch.where(seen, x, torch.zeros_like(x)), seen.double()]))
    total, n = t[: len(keys)], t[len(keys) :]
    mean = torch.where(n > 0, total / n.clamp_min(1), torch.full_like(total, float("nan")))
    return dict(zip(keys, mean.unbind()))
