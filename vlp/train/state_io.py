"""Training state on disk without pickle: a nested structure (dicts, lists, tuples, numbers, strings,
tensors) as ``NAME.json`` (the structure, each tensor replaced by a reference) + ``NAME.safetensors``
(the tensors). Loading never executes code from the file; anything the format cannot express is
refused when saving, naming its path in the structure.

Optimizer state dicts, RNG states of ``random``/numpy/torch and counters all fit. The JSON is
strict: a non-finite float is written as ``{"__float__": "nan"}`` (or ``"inf"``, ``"-inf"``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from vlp.errors import CheckpointError
from vlp.weights import save_tensors

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
