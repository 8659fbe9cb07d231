"""What torch.compile did during a block of a run, from dynamo's and inductor's own records: graphs
compiled (each recompile is one more), graph breaks, recompiles with their guard failures, and the
CUDA graphs inductor did not capture, with its reasons.

A CUDA graph that inductor cannot capture (an input mutated outside the graph, a CPU tensor, ...)
is not an error: inductor counts it (``counters["inductor"]["cudagraph_skips"]``), warns its reason
on the ``cudagraphs`` artifact logger of ``torch._inductor.cudagraph_utils``
(``log_cudagraph_skip_and_bump_counter``) and runs that graph without CUDA graphs. A speed
measured then is not a CUDA-graph figure: :func:`cuda_graph_status` says "not captured: REASON"
(``vlp bench``, ``make gpu-check-compile``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

#: the logger inductor warns each CUDA-graph skip on (torch._logging's "cudagraphs" artifact)
CUDAGRAPH_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"

#: what :func:`cuda_graph_status` returns when ``train.cuda_graphs`` ran on a device without CUDA
NO_CUDA = "not captured: CUDA graphs need a CUDA device"


@dataclass
class CompileRecord:
    """torch.compile's work during a :class:`CompileWatch` block (differences of its counters)."""

    graphs: int = 0  # graphs compiled (dynamo's unique_graphs; a recompile adds one)
    graph_breaks: int = 0
    recompiles: int = 0  # guard failures that led to a recompile
    recompile_reasons: list[str] = field(default_factory=list)  # the first few
    cudagraph_skips: int = 0  # graphs inductor ran without CUDA graphs
    skip_reasons: list[str] = field(default_factory=list)  # inductor's logged reasons, each once


def _totals() -> tuple[int, int, list[str], int]:
    """(unique graphs, graph breaks, guard-failure reasons, CUDA-graph skips) so far in this process."""
    from torch._dynamo.utils import counters, guard_failures

    reasons = [str(r) for v in guard_failures.values() for r in v]
    return (
        int(counters["stats"]["unique_graphs"]),
        int(sum(counters["graph_break"].values())),
        reasons,
        int(counters["inductor"]["cudagraph_skips"]),
    )


class CompileWatch(logging.Handler):
    """A context manager: :meth:`record` is what torch.compile did inside the block (or since it
    began, while inside). It keeps the records of the CUDA-graph skip logger while active."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []
        self._start: tuple[int, int, list[str], int] = (0, 0, [], 0)
        self._end: Optional[tuple[int, int, list[str], int]] = None
        self._level: Optional[int] = None

    def emit(self, record: logging.LogRecord) -> None:
        """Keeps one skip record's message."""
        self.messages.append(record.getMessage())

    def __enter__(self) -> CompileWatch:
        self._start, self._end = _totals(), None
        log = logging.getLogger(CUDAGRAPH_LOGGER)
        if not log.isEnabledFor(logging.WARNING):  # torch's log settings may have raised its level
            self._level = log.level
            log.setLevel(logging.WARNING)
        log.addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        log = logging.getLogger(CUDAGRAPH_LOGGER)
        log.removeHandler(self)
        if self._level is not None:
            log.setLevel(self._level)
            self._level = None
        self._end = _totals()

    def record(self) -> CompileRecord:
        """The counters' differences over the block (up to now while inside it) and the skip reasons."""
        graphs, breaks, reasons, skips = self._end or _totals()
        g0, b0, r0, s0 = self._start
        new_reasons = reasons[len(r0) :] if reasons[: len(r0)] == r0 else reasons
        return CompileRecord(
            graphs=graphs - g0,
            graph_breaks=breaks - b0,
            recompiles=len(new_reasons),
            recompile_reasons=[r[:200] for r in new_reasons[:8]],
            cudagraph_skips=skips - s0,
            skip_reasons=list(dict.fromkeys(m.strip() for m in self.messages)),
        )


def cuda_graph_status(cuda_graphs: bool, device_type: str, record: CompileRecord) -> Optional[str]:
    """Whether a run with ``train.cuda_graphs`` replayed CUDA graphs: None when it was off,
    "captured", or "not captured: REASON" (inductor's logged reasons joined by "; ", or why there
    is none) - a run whose speed is not a CUDA-graph figure."""
    if not cuda_graphs:
        return None
    if record.cudagraph_skips or record.skip_reasons:
        reasons = "; ".join(record.skip_reasons) or (
            f"inductor skipped {record.cudagraph_skips} graph(s) without logging a reason"
        )
        return f"not captured: {reasons}"
    if device_type != "cuda":
        return NO_CUDA
    return "captured"
