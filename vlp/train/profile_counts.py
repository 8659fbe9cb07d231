"""Kernel launches and host synchronisations per training step, counted by ``torch.profiler`` from
the CUDA runtime calls it records (the GPU counterpart of :mod:`vlp.train.dispatch_counts`, which
counts aten ops at the dispatcher on any device).

A CUDA-graph replay is one ``cudaGraphLaunch`` however many kernels the graph holds; a host sync is
a call that waits for the device (``cudaDeviceSynchronize``, ``cudaStreamSynchronize``,
``cudaEventSynchronize``, a synchronous ``cudaMemcpy``). Without CUDA there are no runtime calls:
every count is 0 and only the profiled aten ops (nested calls included) show that the steps ran.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

#: runtime calls that queue a kernel (a graph launch counted apart)
KERNEL_LAUNCHES = frozenset(
    {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel"}
)
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
#: asynchronous copies and fills: queued like kernels
COPIES = frozenset({"cudaMemcpyAsync", "cudaMemsetAsync", "cuMemcpyAsync", "cuMemsetD8Async", "cuMemsetD32Async"})
#: calls after which the host has waited for the device
SYNCS = frozenset(
    {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cuStreamSynchronize"}
)


def runtime_counts(totals: dict[str, int], steps: int) -> dict[str, Any]:
    """Per-step counts from the profiler's call totals (name -> calls over ``steps`` steps): kernel
    launches, graph launches, asynchronous copies and fills, host syncs, aten ops; and the totals
    of the runtime calls counted (name -> calls). Returns the dict."""

    def per_step(names: frozenset[str]) -> float:
        return sum(n for k, n in totals.items() if k in names) / steps

    counted = KERNEL_LAUNCHES | GRAPH_LAUNCHES | COPIES | SYNCS
    return {
        "steps": steps,
        "kernel_launches_per_step": per_step(KERNEL_LAUNCHES),
        "graph_launches_per_step": per_step(GRAPH_LAUNCHES),
        "copies_per_step": per_step(COPIES),
        "syncs_per_step": per_step(SYNCS),
        "aten_ops_per_step": sum(n for k, n in totals.items() if k.startswith("aten::")) / steps,
        "runtime_calls": {k: n for k, n in sorted(totals.items()) if k in counted},
    }


def profile_steps(run_step: Callable[[], Any], steps: int, device: torch.device) -> dict[str, Any]:
    """Run ``run_step()`` ``steps`` times under ``torch.profiler`` (CPU, and CUDA on a CUDA device),
    the device synchronised before and after; returns :func:`runtime_counts` of the calls recorded."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            run_step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    totals = {e.key: e.count for e in prof.key_averages()}
    if device.type == "cuda":  # the closing synchronisation above is the profiler's, not the step's
        for name in ("cudaDeviceSynchronize",):
            if totals.get(name):
                totals[name] -= 1
    return runtime_counts(totals, steps)
