"""What a training step asks of the device, counted at the dispatcher: the CPU proxies of GPU host time.

On a GPU a step is host-bound when the CPU cannot queue kernels as fast as the device runs them:
every aten op that launches a kernel costs 10-13 µs of host time, and every device
synchronisation (a value read back, a data-dependent output shape, a copy from pageable host
memory) makes the host wait for the device to drain its queue. Both can be counted on any device
under a :class:`~torch.utils._python_dispatch.TorchDispatchMode`, which sees every aten op that
reaches the dispatcher - forward, autograd's backward, the optimizer and everything in between:

- **kernel ops**: ops that launch work (views, ``detach``, allocations without a fill and
  metadata queries launch none);
- **casts**: ``_to_copy`` that changes the dtype (autocast's casts), and those of watched tensors
  (e.g. the momentum twin's weights, which autocast does not cache);
- **syncs**: ``_local_scalar_dense`` (``.item()``, ``bool(t)``, ...), ops whose output shape
  depends on values (``nonzero``, boolean indexing, ``masked_select``, ``unique``,
  ``repeat_interleave`` without an output size, ...) and tensors built from host data
  (``torch.tensor(list, device=...)``: a copy from pageable memory) or copied there from the CPU.

Counts are kept per phase (:meth:`DispatchCounter.phase`); module calls are counted through a
global forward hook. ``vlp bench --count-ops`` prints them; ``tests/train/test_dispatch_counts.py``
holds the training step to zero synchronisations.
"""

from __future__ import annotations

import contextlib
import traceback
from collections import Counter
from typing import Any, Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten

#: ops that launch no kernel although they are not views: allocation without a fill, metadata
NO_KERNEL = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "lift_fresh",
        "_local_scalar_dense",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "is_coalesced",
        "record_stream",
        "set_",
        "resize_",
        "_resize_output_",
        "_unsafe_view",
        "_record_function_enter_new",  # the profiler's markers (optimizer.step, zero_grad)
        "_record_function_exit",
    }
)

#: ops whose output shape depends on tensor values: the host waits for the device to know it
VALUE_SHAPED = frozenset(
    {
        "nonzero",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "bincount",
        "histc",
        "equal",
        "is_nonzero",
        "item",
        "_local_scalar_dense",
        "allclose",
    }
)


def _name(func: Any) -> str:
    return func._schema.name.split("::", 1)[-1]


def is_view(func: Any) -> bool:
    """Whether the op returns an alias of an input without writing it (a view: no kernel)."""
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


def _bool_index(args: tuple, kwargs: dict) -> bool:
    """Indexing with a boolean / uint8 mask (``x[mask]``, ``x[mask] = v``): a hidden ``nonzero``."""
    flat, _ = tree_flatten((args[1:], kwargs))
    return any(isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in flat)


def sync_reason(func: Any, args: tuple, kwargs: dict) -> str | None:
    """Why the op makes the host wait for the device (None: it does not)."""
    name = _name(func)
    if name in VALUE_SHAPED:
        return name
    if name in ("index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index") and _bool_index(args, kwargs):
        return f"{name} with a boolean mask"
    if name == "repeat_interleave" and kwargs.get("output_size") is None:
        # .Tensor(repeats): the output length is repeats.sum(); .self_Tensor(self, repeats, dim)
        repeats = args[0] if func._overloadname == "Tensor" else (args[1] if len(args) > 1 else None)
        if isinstance(repeats, torch.Tensor) and repeats.numel() > 1:
            return "repeat_interleave without output_size"
    if name == "lift_fresh":
        return "tensor from host data (torch.tensor)"
    if name in ("_to_copy", "copy_"):
        src = args[1] if name == "copy_" else args[0]
        dst_dev = args[0].device if name == "copy_" else kwargs.get("device")
        if isinstance(src, torch.Tensor) and src.device.type == "cpu" and dst_dev is not None:
            if torch.device(dst_dev).type != "cpu" and not src.is_pinned():
                return "copy from pageable host memory"
    return None


def _caller() -> str:
    """``file:line`` of the innermost frame outside torch and this module (where a sync comes from)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        f = frame.filename.replace("\\", "/")
        if "/torch/" not in f and not f.endswith("dispatch_counts.py") and "/contextlib.py" not in f:
            return f"{f.rsplit('/site-packages/', 1)[-1].rsplit('/vlp/', 1)[-1]}:{frame.lineno}"
    return "?"


class DispatchCounter(TorchDispatchMode):
    """Counts the aten ops that reach the dispatcher while active, by phase (see the module doc).

    ``watch``: tensors whose casts are counted apart (``casts_of_watched``), matched by storage.
    ``ignore``: phases not counted (``data``: the loader's work runs in worker processes, on the host).
    ``pause``: phases during which the mode is lifted altogether, uncounted (a compiled graph refuses
    to run under a dispatch mode, and its fused kernels would not reach the dispatcher anyway).
    Use as a context manager; switch the phase with ``with counter.phase("backward"):``. Each
    synchronisation is reported with the innermost line of code outside torch that caused it.
    """

    def __init__(
        self, watch: Iterable[torch.Tensor] = (), ignore: Iterable[str] = ("data",), pause: Iterable[str] = ()
    ) -> None:
        super().__init__()
        self.pause = frozenset(pause)
        self.ignore = frozenset(ignore) | self.pause
        self.current = "step"
        self.kernel: Counter[str] = Counter()  # phase -> kernel-launching ops
        self.casts: Counter[str] = Counter()
        self.casts_watched: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()
        self.sync_sites: Counter[str] = Counter()  # "phase: reason" -> count
        self.ops: Counter[str] = Counter()  # op name -> count (kernel-launching only)
        self.modules: Counter[str] = Counter()  # phase -> module calls
        self._watch = {t.untyped_storage().data_ptr() for t in watch if t.numel()}
        self._hook: Any = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Attribute the ops of the block to phase ``name``."""
        before, self.current = self.current, name
        try:
            if name in self.pause:
                with _disable_current_modes():
                    yield
            else:
                yield
        finally:
            self.current = before

    def __enter__(self) -> DispatchCounter:
        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._module_call)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        super().__exit__(*exc)

    def _module_call(self, module: torch.nn.Module, args: Any) -> None:
        self.modules[self.current] += 1

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.current in self.ignore:
            return func(*args, **kwargs)
        name = _name(func)
        reason = sync_reason(func, args, kwargs)
        if reason is not None:
            self.syncs[self.current] += 1
            self.sync_sites[f"{self.current}: {reason} at {_caller()}"] += 1
        if name not in NO_KERNEL and not is_view(func):
            self.kernel[self.current] += 1
            self.ops[name] += 1
        if name == "_to_copy" and isinstance(args[0], torch.Tensor):
            dtype = kwargs.get("dtype")
            if dtype is not None and dtype != args[0].dtype:
                self.casts[self.current] += 1
                if args[0].numel() and args[0].untyped_storage().data_ptr() in self._watch:
                    self.casts_watched[self.current] += 1
        return func(*args, **kwargs)

    def summary(self) -> dict[str, Any]:
        """Totals and per-phase counts, as ``vlp bench --count-ops`` writes them."""
        phases = sorted((set(self.kernel) | set(self.syncs) | set(self.casts) | set(self.modules)) - self.ignore)
        return {
            "kernel_ops_per_step": sum(self.kernel.values()),
            "casts_per_step": sum(self.casts.values()),
            "casts_of_watched_per_step": sum(self.casts_watched.values()),
            "syncs_per_step": sum(self.syncs.values()),
            "module_calls_per_forward": self.modules.get("forward", 0),
            "per_phase": {
                p: {
                    "kernel_ops": self.kernel.get(p, 0),
                    "casts": self.casts.get(p, 0),
                    "casts_of_watched": self.casts_watched.get(p, 0),
                    "syncs": self.syncs.get(p, 0),
                    "module_calls": self.modules.get(p, 0),
                }
                for p in phases
            },
            "sync_sites": dict(self.sync_sites.most_common()),
            "top_ops": dict(self.ops.most_common(25)),
        }
