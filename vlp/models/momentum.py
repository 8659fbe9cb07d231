"""Momentum (EMA) twins and feature queues: the two pieces of ALBEF state that are not trained."""

from __future__ import annotations

import contextlib
import copy
from typing import Iterator, Optional

import torch
from torch import nn


class MomentumTwin(nn.Module):
    """Frozen fp32 copies of named online modules, updated by one fused foreach EMA.

    ``theta_m <- m * theta_m + (1 - m) * theta`` over every parameter. The copies are made
    together (one ``deepcopy`` of the whole dict) so tied weights stay tied in the twin.
    Run :meth:`update` after ``optimizer.step()``: that is ALBEF's update at the start of the
    next forward, outside any compiled region.
    """

    def __init__(self, online: dict[str, nn.Module], momentum: float = 0.995) -> None:
        super().__init__()
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must be in [0, 1], got {momentum}")
        self.momentum = momentum
        self.twin = copy.deepcopy(nn.ModuleDict(online)).float()
        for p in self.twin.parameters():
            p.requires_grad_(False)
        # Parameter pairs, listed once (``.to()``/``load_state_dict`` keep the Parameter objects).
        # Plain lists: the online modules are not registered a second time.
        self._twin_params = list(self.twin.parameters())
        self._online_params = list(nn.ModuleDict(online).parameters())
        # what autocast would cast at every use (Linear / Conv weights and biases), see `lowered`
        self._castable = [
            p for m in self.twin.modules() if isinstance(m, nn.Linear | nn.Conv2d) for p in m.parameters(recurse=False)
        ]
        self._shadow: list[torch.Tensor] = []
        self._shadow_of: Optional[tuple] = None  # (dtype, versions of the fp32 weights) the shadow copies

    @contextlib.contextmanager
    def lowered(self) -> Iterator[None]:
        """Inside the block, under a bf16 / fp16 autocast, the twin's Linear and Conv parameters are
        copies in that dtype (its fp32 weights come back after the block; the EMA and checkpoints
        see only them). Autocast caches the casts of weights that require grad, not of the frozen
        twin's, so without this every use of a twin weight is one more cast kernel (369 per base
        step). The copies are refreshed with one foreach copy whenever the fp32 weights changed
        (the EMA, a load), which the tensors' version counters tell. Outside autocast: no change."""
        device = self._castable[0].device.type if self._castable else "cpu"
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        if dtype not in (torch.bfloat16, torch.float16):
            yield
            return
        masters = [p.data for p in self._castable]
        key = (dtype, device, [p._version for p in self._castable])
        if key != self._shadow_of:
            if [s.shape for s in self._shadow] != [m.shape for m in masters] or key[:2] != (self._shadow_of or ())[:2]:
                self._shadow = [torch.empty_like(m, dtype=dtype) for m in masters]
            torch._foreach_copy_(self._shadow, masters)
            self._shadow_of = key
        for p, s in zip(self._castable, self._shadow):
            p.data = s
        try:
            yield
        finally:
            for p, m in zip(self._castable, masters):
                p.data = m

    def __getitem__(self, name: str) -> nn.Module:
        return self.twin[name]

    @torch.no_grad()
    def copy_from_online(self) -> None:
        """Set every twin parameter to the online value (after loading online-only weights)."""
        if not self._twin_params:  # a model without momentum twins (e.g. NLVR2 text assignment)
            return
        torch._foreach_copy_(self._twin_params, [p.detach().float() for p in self._online_params])

    @torch.no_grad()
    def update(self, momentum: Optional[float | torch.Tensor] = None, skipped: Optional[torch.Tensor] = None) -> None:
        """One EMA step with ``momentum`` (default: the constructor's; a 0-d device tensor needs
        ``skipped``). ``skipped`` (0-d bool on the device): when true the twins stay as they are -
        decided on the device, no host read."""
        if not self._twin_params:
            return
        m = self.momentum if momentum is None else momentum
        # fp32 online weights enter as they are (no_grad: nothing is recorded), others as fp32 copies
        src = [p if p.dtype == torch.float32 else p.float() for p in self._online_params]
        if skipped is None and not isinstance(m, torch.Tensor):
            torch._foreach_lerp_(self._twin_params, src, 1.0 - m)
            return
        skipped = torch.zeros((), dtype=torch.bool, device=self._twin_params[0].device) if skipped is None else skipped
        # a skipped step blends with weight 0. A 0-d tensor weight would resolve to the Scalar
        # overload and be read back (a device sync), so: twin += w * (online - twin), w on the device,
        # in groups of at most EMA_CHUNK elements (the difference is a temporary copy)
        weight = (1.0 - m) * (~skipped).to(device=self._twin_params[0].device, dtype=torch.float32)
        for lo, hi in self._chunks():
            delta = torch._foreach_sub(src[lo:hi], self._twin_params[lo:hi])
            torch._foreach_mul_(delta, weight)
            torch._foreach_add_(self._twin_params[lo:hi], delta)

    #: elements per group of the sync-free EMA: its temporary is at most 128 MiB of fp32
    EMA_CHUNK = 32 * 2**20

    def _chunks(self) -> list[tuple[int, int]]:
        """``(lo, hi)`` ranges of the twin's parameter list of at most :attr:`EMA_CHUNK` elements each
        (a larger tensor alone)."""
        bounds, lo, size = [], 0, 0
        for i, p in enumerate(self._twin_params):
            if size and size + p.numel() > self.EMA_CHUNK:
                bounds.append((lo, i))
                lo, size = i, 0
            size += p.numel()
        return [*bounds, (lo, len(self._twin_params))]


class FeatureQueue(nn.Module):
    """Ring buffer of L2-normalised features (fp32) plus integer ids, sharing one pointer.

    Buffers: ``{name}`` [size, dim] for each feature stream, ``ids`` [size] (init -100, never a
    real id) and ``ptr`` [1]. Any batch size is accepted: writes wrap around the end.
    ``size=0`` disables the queue (in-batch negatives only).
    """

    def __init__(self, size: int, dims: dict[str, int], seed: int = 0) -> None:
        super().__init__()
        if size < 0:
            raise ValueError(f"queue size must be >= 0, got {size}")
        self.size = size
        self.names = list(dims)
        g = torch.Generator().manual_seed(seed)
        for name, dim in dims.items():
            init = nn.functional.normalize(torch.randn(size, dim, generator=g), dim=1)
            self.register_buffer(name, init)
        self.register_buffer("ids", torch.full((size,), -100, dtype=torch.long))
        self.register_buffer("ptr", torch.zeros(1, dtype=torch.long))
        self._undo: Optional[list[tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]]] = None

    def begin_step(self) -> None:
        """Start recording what this training step overwrites (see :meth:`end_step`)."""
        self._undo = []

    @torch.no_grad()
    def end_step(self, skipped: torch.Tensor | bool) -> None:
        """End the step begun by :meth:`begin_step`: when ``skipped`` (a 0-d bool device tensor, or a
        bool) its writes are undone - on the device (``torch.where``), with no host read."""
        flag = torch.as_tensor(skipped, device=self.ptr.device)
        for ptr, idx, old in reversed(self._undo or []):
            for name, rows in old.items():
                buf = self.get(name)
                buf[idx] = torch.where(flag, rows, buf[idx])
            self.ptr.copy_(torch.where(flag, ptr, self.ptr))
        self._undo = []

    def discard_step(self) -> None:
        """Undo the writes since :meth:`begin_step` (a skipped step: non-finite loss or gradient)."""
        self.end_step(True)

    def get(self, name: str) -> torch.Tensor:
        """Queue contents ``[size, dim]`` (slot order, which does not matter to the losses)."""
        return getattr(self, name)

    @torch.no_grad()
    def enqueue(self, ids: torch.Tensor, **feats: torch.Tensor) -> None:
        """Write ``feats[name]`` [n, dim] and ``ids`` [n] at the pointer, wrapping around."""
        if set(feats) != set(self.names):
            raise ValueError(f"enqueue needs exactly {self.names}, got {sorted(feats)}")
        n = ids.shape[0]
        if self.size == 0:
            return
        if n > self.size:  # only the newest `size` entries can survive
            ids = ids[-self.size :]
            feats = {k: v[-self.size :] for k, v in feats.items()}
            n = self.size
        idx = (self.ptr + torch.arange(n, device=self.ptr.device)) % self.size
        if self._undo is not None:
            self._undo.append((self.ptr.clone(), idx, {k: self.get(k)[idx].clone() for k in [*self.names, "ids"]}))
        for name, v in feats.items():
            self.get(name)[idx] = v.detach().to(self.get(name).dtype)
        self.ids[idx] = ids.to(self.ids.dtype)
        self.ptr.copy_((self.ptr + n) % self.size)
