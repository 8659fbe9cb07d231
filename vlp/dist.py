"""Collectives that are safe on one process (every function is a no-op without a process group)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


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


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Like :func:`all_gather_nograd`, but gradients flow back to every rank's ``x`` (in-batch
    negatives from the whole global batch, as CLIP-style dual encoders use). The backward sums
    every rank's gradient for ``x`` into its owner, so use it with a *local* loss (this rank's rows
    against gathered candidates): DDP's gradient mean then gives the global loss's gradient."""
    if not is_dist():
        return x
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x.contiguous()), 0)


def mean_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Mean of each value over the ranks that measured it (NaN = not measured); every rank must
    call it with the same keys. Identity on one process. Logged losses are then those of the
    global batch, not of rank 0's share."""
    if not is_dist():
        return dict(values)
    keys = sorted(values)
    x = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    seen = ~torch.isnan(x)
    t = torch.cat([torch.where(seen, x, torch.zeros_like(x)), seen.double()])
    dist.all_reduce(t)
    total, n = t[: len(keys)], t[len(keys):]
    return {k: (float(s) / float(c) if c else float("nan")) for k, s, c in zip(keys, total, n)}
