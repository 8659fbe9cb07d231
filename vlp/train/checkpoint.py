"""Checkpoints: ``model.safetensors`` (all weights incl. momentum twins and queues) + ``state.json``,
and ``task_state.safetensors`` for a task's non-model parts (the LTD decoder, lambda and its momentum).

Saved atomically (written to a temporary folder, then renamed), loaded strictly.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vlp.models.loading import CheckpointError, load_strict


TASK_STATE = "task_state.safetensors"


def save_checkpoint(directory: str | Path, model: nn.Module, state: dict[str, Any],
                    task_state: Optional[dict[str, torch.Tensor]] = None) -> Path:
    """Write ``directory/model.safetensors``, ``state.json`` and (if given and non-empty)
    ``task_state.safetensors`` atomically."""
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(weights_to_save(model), str(tmp / "model.safetensors"))
    if task_state:
        save_file({k: v.detach().contiguous() for k, v in task_state.items()}, str(tmp / TASK_STATE))
    (tmp / "state.json").write_text(json.dumps(state, indent=2, default=str))
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return directory


def weights_to_save(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict as CPU copies, one name per tied group (the alphabetically first, as
    safetensors' ``save_model`` keeps). Copies, because an engine may keep parameters as views
    into one flat buffer (DeepSpeed ZeRO), which safetensors refuses to write."""
    state = model.state_dict(keep_vars=True)
    names: dict[int, list[str]] = {}
    for k, v in state.items():
        names.setdefault(id(v), []).append(k)
    return {min(group): state[group[0]].detach().to("cpu", copy=True).contiguous() for group in names.values()}


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or the newest ``checkpoints/step_*`` of a run directory."""
    path = Path(path)
    if (path / "model.safetensors").is_file():
        return path
    ckpts = sorted((path / "checkpoints").glob("step_*")) if (path / "checkpoints").is_dir() else []
    ckpts = [c for c in ckpts if (c / "model.safetensors").is_file()]
    if not ckpts:
        raise CheckpointError(f"{path}: no checkpoint here (expected model.safetensors or checkpoints/step_*/)")
    return ckpts[-1]


def read_state(ckpt: str | Path) -> dict[str, Any]:
    p = Path(ckpt) / "state.json"
    if not p.is_file():
        raise CheckpointError(f"{ckpt}: missing state.json")
    return json.loads(p.read_text())


def tied_groups(module: nn.Module) -> list[list[str]]:
    """Names of parameters sharing one tensor (safetensors saves one name per group)."""
    groups: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [g for g in groups.values() if len(g) > 1]


def load_weights(model: nn.Module, ckpt: str | Path, allow_missing: Iterable[str] = (), allow_unexpected: Iterable[str] = ()) -> None:
    """Strictly load ``ckpt/model.safetensors`` into ``model`` (a tied group needs one saved name)."""
    f = Path(ckpt) / "model.safetensors"
    if not f.is_file():
        raise CheckpointError(f"{ckpt}: missing model.safetensors")
    state = load_file(str(f))
    aliases = [n for g in tied_groups(model) if any(n in state for n in g) for n in g if n not in state]
    load_strict(model, state, source=str(f), allow_missing=[*aliases, *allow_missing], allow_unexpected=allow_unexpected)


def load_task_state(ckpt: str | Path) -> dict[str, torch.Tensor]:
    """The task state saved with a checkpoint (empty if the task had none)."""
    f = Path(ckpt) / TASK_STATE
    return load_file(str(f)) if f.is_file() else {}


def module_states(**modules: Optional[nn.Module]) -> dict[str, torch.Tensor]:
    """Checkpointed state of a task's non-model parts, ``name.key`` -> tensor (``None`` skipped)."""
    return {f"{n}.{k}": v for n, m in modules.items() if m is not None for k, v in m.state_dict().items()}


def load_module_states(state: dict[str, torch.Tensor], **modules: Optional[nn.Module]) -> None:
    """Inverse of :func:`module_states`; strict per module (names the checkpoint keys on mismatch)."""
    for n, m in modules.items():
        if m is not None:
            part = {k[len(n) + 1:]: v for k, v in state.items() if k.startswith(n + ".")}
            load_strict(m, part, source=f"task state '{n}'")
