"""Checkpoint surgery in one place: strict loads with explicit allowances, key renames, sources."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Iterable, Mapping

import torch
from torch import nn


class CheckpointError(RuntimeError):
    """Weights that do not fit: names the file and the offending keys."""


def _matches(key: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


def load_strict(
    module: nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    source: str,
    allow_missing: Iterable[str] = (),
    allow_unexpected: Iterable[str] = (),
) -> None:
    """Load ``state`` into ``module``; fail unless every missing/unexpected key is allowed.

    ``allow_*`` are fnmatch patterns (``fusion.layer.*.crossattention.*``). Shape mismatches
    always fail. Never a silent ``strict=False``.
    """
    allow_missing, allow_unexpected = list(allow_missing), list(allow_unexpected)
    own = module.state_dict()
    missing = [k for k in own if k not in state and not _matches(k, allow_missing)]
    unexpected = [k for k in state if k not in own and not _matches(k, allow_unexpected)]
    shape = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in state
        if k in own and tuple(state[k].shape) != tuple(own[k].shape)
    ]
    if missing or unexpected or shape:
        parts = [f"cannot load {source} into {type(module).__name__}:"]
        if missing:
            parts.append(f"  missing keys ({len(missing)}): {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(f"  unexpected keys ({len(unexpected)}): {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
        if shape:
            parts.append(f"  shape mismatches: {shape[:8]}")
        raise CheckpointError("\n".join(parts))
    module.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)


def rename(state: Mapping[str, torch.Tensor], rules: Iterable[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Apply regex ``(pattern, replacement)`` rules in order to every key; drop keys mapped to ''."""
    rules = [(re.compile(p), r) for p, r in rules]
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        for p, r in rules:
            k = p.sub(r, k)
        if k:
            out[k] = v
    return out


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read weights from a .safetensors file (or a directory holding ``model.safetensors``).

    ``.bin``/``.pth`` files are read with ``torch.load(weights_only=True)``: no arbitrary unpickling.
    """
    path = Path(path)
    if path.is_dir():
        for name in ("model.safetensors", "pytorch_model.bin"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise CheckpointError(f"{path}: no model.safetensors or pytorch_model.bin in this directory")
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    import pickle

    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only refuses anything but tensors and plain containers
        found = re.search(r"GLOBAL (\S+)", str(e))
        what = f"it references {found.group(1)}" if found else "it holds objects other than tensors"
        raise CheckpointError(f"{path}: refused: loading it would need arbitrary unpickling ({what}), which can run "
                              "code from the file. vlp reads .pth/.bin files only as tensors and plain containers "
                              "(torch.load weights_only=True); convert a file you trust to safetensors") from None
    except (RuntimeError, EOFError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable PyTorch weights file ({str(e).splitlines()[0][:300]})") from None
    if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        obj = obj["model"]
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a state dict, got {type(obj).__name__}")
    return obj
