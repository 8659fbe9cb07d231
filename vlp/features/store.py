"""Precomputed feature files, written once and read by the data path (SRCL helper cache, LTD targets).

One safetensors file holds the tensors and a string header (``format`` plus JSON-encoded fields);
it is written atomically and an existing file is never overwritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from vlp.errors import DataError
from vlp.weights import save_tensors


def write_features(path: str | Path, tensors: dict[str, torch.Tensor], header: dict[str, Any]) -> Path:
    """Write ``tensors`` and ``header`` (JSON-serialisable values) to ``path`` atomically."""
    path = Path(path)
    if path.exists():
        raise DataError(f"{path} already exists; choose another --out or remove it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_tensors({k: v.contiguous() for k, v in tensors.items()}, tmp, {k: json.dumps(v) for k, v in header.items()})
    os.replace(tmp, path)
    return path


def read_features(
    path: str | Path, fmt: str, names: tuple[str, ...], hint: str
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors ``names`` and the header of a file written by :func:`write_features` in format ``fmt``.
    Any problem raises one :class:`DataError` naming the file; ``hint`` says how to (re)build it."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found ({hint})")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = {k: json.loads(v) for k, v in (f.metadata() or {}).items()}
            if header.get("format") != fmt:
                raise DataError(f"{path}: header 'format' is {header.get('format')!r}, expected {fmt!r} ({hint})")
            missing = [n for n in names if n not in f.keys()]
            if missing:
                raise DataError(f"{path}: missing tensors {missing} ({hint})")
            return {n: f.get_tensor(n) for n in names}, header
    except DataError:
        raise
    except Exception as e:  # truncated file, not safetensors, bad JSON in the header
        raise DataError(f"{path}: not a readable {fmt} file: {e} ({hint})") from None
