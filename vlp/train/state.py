"""The training state: what the next training step depends on beyond the weights, in a checkpoint's
``train_state/``, saved without pickle:

- ``task.*``: every tensor of the task outside the checkpointed model (the SRCL helper-feature
  queue, the LTD decoder, lambda and its momentum, ...); the model itself is ``model.safetensors``;
- ``optimizer.*`` (one file: the state is the same on every rank), or ``optimizer_rank{r}.*`` under
  DeepSpeed ZeRO, where each rank holds the optimizer state of its partition;
- ``rng_rank{r}.*``: the ``random``, numpy, torch CPU and CUDA (its current device's) generator states of rank ``r``,
  with what else only rank ``r`` knows: its data-stream position and its part of the open log window.

Step, learning-rate position (a function of the step), alpha schedules (functions of the step) and
the data position are in ``state.json``.

The format (:func:`save_tree` / :func:`load_tree`): a nested structure (dicts, lists, tuples,
numbers, strings, tensors) as ``NAME.json`` (the structure, each tensor replaced by a reference) +
``NAME.safetensors`` (the tensors). Loading never executes code from the file; anything the format
cannot express is refused when saving, naming its path in the structure. Optimizer state dicts, RNG
states of ``random``/numpy/torch and counters all fit. The JSON is strict: a non-finite float is
written as ``{"__float__": "nan"}`` (or ``"inf"``, ``"-inf"``).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

from vlp.errors import CheckpointError
from vlp.weights import load_strict, load_weights, save_tensors

TRAIN_STATE = "train_state"


# ----------------------------------------------------------------------------- the format: JSON + safetensors


_TENSOR, _TUPLE, _ITEMS, _ARRAY = "__tensor__", "__tuple__", "__items__", "__ndarray__"
_FLOAT = "__float__"  # a non-finite float, {"__float__": "nan" | "inf" | "-inf"}: JSON has no NaN


def _encode(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):  # named by its path in the structure (unique)
        tensors[path] = obj.detach().to("cpu", copy=True).contiguous()  # copies: no shared storage in the file
        return {_TENSOR: path}
    if isinstance(obj, np.ndarray):
        tensors[path] = torch.from_numpy(np.ascontiguousarray(obj).copy())
        return {_ARRAY: path}
    if isinstance(obj, float) and not math.isfinite(obj):
        return {_FLOAT: repr(obj)}  # valid JSON, read back exactly
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (np.integer, np.floating)):
        return _encode(obj.item(), path, tensors)
    if isinstance(obj, (list, tuple)):
        items = [_encode(v, f"{path}[{i}]", tensors) for i, v in enumerate(obj)]
        return {_TUPLE: items} if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, f"{path}.{k}", tensors) for k, v in obj.items()}
        for k in obj:
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"training state {path}: key {k!r} of type {type(k).__name__} cannot be saved")
        return {_ITEMS: [[k, _encode(v, f"{path}[{k!r}]", tensors)] for k, v in obj.items()]}
    raise TypeError(f"training state {path}: {type(obj).__name__} cannot be saved as JSON/tensors")


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if _TENSOR in obj:
        return tensors[obj[_TENSOR]]
    if _FLOAT in obj:
        return float(obj[_FLOAT])
    if _ARRAY in obj:
        return tensors[obj[_ARRAY]].numpy()
    if _TUPLE in obj:
        return tuple(_decode(v, tensors) for v in obj[_TUPLE])
    if _ITEMS in obj:
        return {k: _decode(v, tensors) for k, v in obj[_ITEMS]}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def save_tree(stem: Path, obj: Any) -> list[Path]:
    """Write ``stem.json`` + ``stem.safetensors``; returns the two paths."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _encode(obj, stem.name, tensors)
    files = [stem.with_suffix(".json"), stem.with_suffix(".safetensors")]
    files[0].write_text(json.dumps(skeleton))
    save_tensors(tensors, files[1])
    return files


def load_tree(stem: Path) -> Any:
    """Inverse of :func:`save_tree`; a missing or unreadable part is a :class:`CheckpointError`."""
    js, st = stem.with_suffix(".json"), stem.with_suffix(".safetensors")
    for f in (js, st):
        if not f.is_file():
            raise CheckpointError(f"training state {f} is missing")
    try:
        return _decode(json.loads(js.read_text()), load_file(str(st)))
    except (ValueError, KeyError, OSError) as e:
        raise CheckpointError(f"training state {stem}.*: unreadable ({e})") from None


# ----------------------------------------------------------------------------- what is saved


def rng_state() -> dict[str, Any]:
    """This process's generator states: Python, numpy, torch CPU and its current CUDA device's
    (None without CUDA). Only the current device's: a process trains on one device, and a node
    that resumes the run may have fewer visible GPUs than the one that saved it."""
    cuda = torch.cuda.get_rng_state(torch.cuda.current_device()) if torch.cuda.is_available() else None
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the generator states of :func:`rng_state` (Python, numpy, torch CPU; the CUDA one on the
    current device where CUDA is available). An older checkpoint's list of per-device CUDA states gives
    the current device's entry, else the first."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state["cuda"]
    if isinstance(cuda, (list, tuple)):
        # an older vlp saved every visible device's state ([] without CUDA): restore the one of
        # the current device's index if the list has it, else the first (this process's device
        # when each process saw one GPU); the others belong to devices this process never used
        cuda = (
            (cuda[torch.cuda.current_device()] if torch.cuda.current_device() < len(cuda) else cuda[0])
            if cuda
            else None
        )
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda, device=torch.cuda.current_device())


def zero_optimizer(optimizer: Any) -> Optional[Any]:
    """DeepSpeed's ZeRO-1/2 optimizer behind accelerate's wrapper (its state is partitioned), else None."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return inner if hasattr(inner, "single_partition_of_fp32_groups") else None


def model_prefix(task: nn.Module, model: nn.Module) -> Optional[str]:
    """The name of ``model`` inside ``task`` ("" when it is the task), or None when it is not a submodule."""
    return next((name for name, m in task.named_modules() if m is model), None)


def _outside(key: str, prefix: Optional[str]) -> bool:
    return prefix is None or (prefix != "" and not key.startswith(prefix + "."))


def save_train_state(
    directory: Path,
    optimizer: Any,
    task: nn.Module,
    model: nn.Module,
    rank: int,
    stream: Optional[dict] = None,
    window: Optional[dict] = None,
) -> None:
    """Every rank calls this (into the staging folder of the checkpoint being written). ``stream``:
    this rank's data-stream position (a shard loader's ``position()``); ``window``: its part of the
    open log window (:meth:`vlp.train.step_stats.Reporter.window_state`); both kept with its RNG states."""
    directory.mkdir(parents=True, exist_ok=True)
    zero = zero_optimizer(optimizer)
    if rank == 0:
        prefix = model_prefix(task, model)
        rest = {k: v for k, v in task.state_dict().items() if _outside(k, prefix) and v.numel() > 0}
        save_tree(directory / "task", rest)
    if zero is not None:
        save_tree(directory / f"optimizer_rank{rank}", zero.optimizer.state_dict())
    elif rank == 0:
        save_tree(directory / "optimizer", optimizer.state_dict())
    extra = {k: v for k, v in (("stream", stream), ("window", window)) if v is not None}
    save_tree(directory / f"rng_rank{rank}", {**rng_state(), **extra})


def load_train_state(
    ckpt: Path, optimizer: Any, task: nn.Module, model: nn.Module, rank: int, world: int
) -> dict[str, Optional[dict]]:
    """Inverse of :func:`save_train_state` plus the model weights of ``ckpt``, strictly: every
    tensor of the task comes from the checkpoint (zero-size buffers - a disabled queue - excepted).
    Returns this rank's saved ``stream`` position and open log ``window`` (None: not saved)."""
    directory = ckpt / TRAIN_STATE
    load_weights(model, ckpt)
    prefix = model_prefix(task, model)
    own = task.state_dict()
    keep = [k for k, v in own.items() if not _outside(k, prefix) or v.numel() == 0]
    load_strict(task, load_tree(directory / "task"), source=str(directory / "task.safetensors"), allow_missing=keep)
    zero = zero_optimizer(optimizer)
    if zero is not None:
        from deepspeed.checkpoint.constants import BASE_OPTIMIZER_STATE

        # the engine's own state dict, with this rank's saved optimizer state; the fp32 master
        # partition is rebuilt from the (already loaded, fp32) module weights
        sd = zero.state_dict()
        sd[BASE_OPTIMIZER_STATE] = load_tree(directory / f"optimizer_rank{rank}")
        zero.load_state_dict([sd] * world, load_optimizer_states=True, load_from_fp32_weights=False)
    else:
        optimizer.load_state_dict(load_tree(directory / "optimizer"))
    rng = directory / f"rng_rank{rank}"
    if not rng.with_suffix(".json").is_file():
        raise CheckpointError(f"{directory}: no {rng.name}.json for rank {rank}")
    saved = load_tree(rng)
    set_rng_state(saved)
    return {"stream": saved.get("stream"), "window": saved.get("window")}
