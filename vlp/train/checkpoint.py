"""Checkpoints: ``model.safetensors`` (all weights incl. momentum twins and queues) + ``state.json``,
and ``task_state.safetensors`` for a task's non-model parts (the LTD decoder, lambda and its momentum).

Written into ``NAME.tmp/``, every file flushed to disk, a ``manifest.json`` with each file's size
and SHA-256 written last, then renamed to ``NAME``: a folder under its final name is complete.
Reading verifies the manifest; a run directory's newest *valid* checkpoint is used, falling back
past corrupted or truncated ones (each reported by name).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vlp import dist as vdist
from vlp.config import ConfigError
from vlp.models.loading import CheckpointError, load_strict


TASK_STATE = "task_state.safetensors"
MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"step_\d+")  # checkpoints/step_0001000 (not the .tmp staging folders)


def save_checkpoint(directory: str | Path, model: nn.Module, state: dict[str, Any],
                    task_state: Optional[dict[str, torch.Tensor]] = None) -> Path:
    """Write ``directory/model.safetensors``, ``state.json`` and (if given and non-empty)
    ``task_state.safetensors`` atomically, with a manifest."""
    directory = Path(directory)
    tmp = staging(directory)
    write_parts(tmp, model, state, task_state)
    return publish(tmp, directory)


def staging(directory: Path) -> Path:
    """A fresh, empty ``directory.tmp/`` to write a checkpoint into."""
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def write_parts(tmp: Path, model: nn.Module, state: dict[str, Any],
                task_state: Optional[dict[str, torch.Tensor]] = None) -> None:
    """The main process's files of a checkpoint, into the staging folder."""
    save_file(weights_to_save(model), str(tmp / "model.safetensors"))
    if task_state:
        save_file({k: v.detach().contiguous() for k, v in task_state.items()}, str(tmp / TASK_STATE))
    (tmp / "state.json").write_text(json.dumps(state, indent=2, default=str))


def _sha256(path: Path) -> str:
    """SHA-256 of a file, computed once per file version: a checkpoint read by several steps of one
    job (find, then load) is hashed once; a rewritten file (new size, mtime or inode) again."""
    st = path.stat()
    return _sha256_of(str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


@functools.lru_cache(maxsize=256)
def _sha256_of(path: str, _size: int, _mtime_ns: int, _inode: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, directory: Path) -> Path:
    """Flush every file of ``tmp``, write its manifest, and rename it to ``directory`` (replacing
    an older folder of that name only after the new one is complete)."""
    files = sorted(p for p in tmp.rglob("*") if p.is_file() and p.name != MANIFEST)
    manifest = {"format": 1, "files": {}}
    for p in files:
        _fsync(p)
        manifest["files"][p.relative_to(tmp).as_posix()] = {"bytes": p.stat().st_size, "sha256": _sha256(p)}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _fsync(tmp / MANIFEST)
    old = directory.with_name(directory.name + ".old")
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(directory, old)
    os.replace(tmp, directory)
    _fsync(directory.parent)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def verify_checkpoint(ckpt: Path, require: Iterable[str] = ()) -> None:
    """Check every file of ``ckpt``'s manifest (present, same size, same SHA-256) and that the
    ``require``d relative paths exist; raises :class:`CheckpointError` naming the first problem.
    A folder without a manifest (an older vlp, or copied by hand) is only checked for files."""
    for rel in ("model.safetensors", *require):
        if not (ckpt / rel).exists():
            raise CheckpointError(f"checkpoint {ckpt}: missing {rel}")
    mf = ckpt / MANIFEST
    if not mf.is_file():
        return
    try:
        files = json.loads(mf.read_text())["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {ckpt}: unreadable {MANIFEST} ({e})") from None
    for rel, meta in files.items():
        p = ckpt / rel
        if not p.is_file():
            raise CheckpointError(f"checkpoint {ckpt}: {rel} is missing")
        if p.stat().st_size != meta["bytes"]:
            raise CheckpointError(f"checkpoint {ckpt}: {rel} is {p.stat().st_size} bytes, the manifest says "
                                  f"{meta['bytes']} (truncated)")
        if _sha256(p) != meta["sha256"]:
            raise CheckpointError(f"checkpoint {ckpt}: {rel} does not match its SHA-256 in {MANIFEST} (corrupted)")


def step_checkpoints(run_dir: Path) -> list[Path]:
    """``run_dir/checkpoints/step_N`` folders, oldest first."""
    root = run_dir / "checkpoints"
    return sorted(p for p in root.iterdir() if p.is_dir() and STEP_DIR.fullmatch(p.name)) if root.is_dir() else []


SUPERSEDED = "superseded"


def set_aside_checkpoints_after(run_dir: Path, step: int) -> list[Path]:
    """Move the step checkpoints after ``step`` to ``checkpoints/superseded/`` (a resumed run redoes
    those steps; they are kept, not deleted, and no longer count for resume or ``keep_last``)."""
    later = [p for p in step_checkpoints(run_dir) if int(p.name.split("_")[1]) > step]
    if not later:
        return []
    aside = run_dir / "checkpoints" / SUPERSEDED
    aside.mkdir(exist_ok=True)
    moved = []
    for p in later:
        target = aside / p.name
        shutil.rmtree(target, ignore_errors=True)
        os.replace(p, target)
        moved.append(target)
    return moved


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` step checkpoints (``best`` is never touched)."""
    old = step_checkpoints(run_dir)[:-keep] if keep > 0 else []
    for p in old:
        shutil.rmtree(p)
    return old


def weights_to_save(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict as CPU copies, one name per tied group (the alphabetically first, as
    safetensors' ``save_model`` keeps). Copies, because an engine may keep parameters as views
    into one flat buffer (DeepSpeed ZeRO), which safetensors refuses to write."""
    state = model.state_dict(keep_vars=True)
    names: dict[int, list[str]] = {}
    for k, v in state.items():
        names.setdefault(id(v), []).append(k)
    return {min(group): state[group[0]].detach().to("cpu", copy=True).contiguous() for group in names.values()}


def find_checkpoint(path: str | Path, require: Iterable[str] = ()) -> Path:
    """A checkpoint folder (verified), or the newest valid ``checkpoints/step_*`` of a run directory:
    a corrupted or truncated one is reported on stderr and the previous one is tried."""
    path = Path(path)
    if (path / "model.safetensors").is_file() or (path / MANIFEST).is_file():
        verify_checkpoint(path, require)
        return path
    candidates = step_checkpoints(path)
    if not candidates:
        raise CheckpointError(f"{path}: no checkpoint here (expected model.safetensors or checkpoints/step_*/)")
    problems = []
    for ckpt in reversed(candidates):
        try:
            verify_checkpoint(ckpt, require)
        except CheckpointError as e:
            problems.append(str(e))
            print(f"warning: {e}; trying the previous checkpoint", file=sys.stderr)
            continue
        return ckpt
    raise CheckpointError(f"{path}: no valid checkpoint ({'; '.join(problems)})")


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


SHARED_FS_MARKER = ".vlp-shared-fs-check"


def _read_token(marker: Path, patience_s: float) -> int:
    """The token in ``marker``; 0 if it cannot be read within ``patience_s`` (a network filesystem
    may show a file created on another node a moment later)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return int(marker.read_text().strip())
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return 0
            time.sleep(0.25)


def check_shared_filesystem(run_dir: str | Path, device: torch.device, patience_s: float = 5.0) -> None:
    """With several processes, make sure every rank sees the run directory rank 0 sees: each rank
    writes its own training-state files into the checkpoint folders rank 0 publishes, so they must
    share one filesystem. Rank 0 writes ``run_dir/.vlp-shared-fs-check`` holding a random token
    (sent to the others by an all-reduce on ``device``, the run's); every rank reads it back (a stale
    marker of an earlier run holds another token); rank 0 removes it. If any rank could not read it,
    every rank raises :class:`ConfigError` naming the directory and those ranks. No-op on one process.
    Every rank must call it at the same point."""
    if not vdist.is_dist():
        return
    run_dir = Path(run_dir)
    marker, me, world = run_dir / SHARED_FS_MARKER, vdist.rank(), vdist.world_size()
    token = torch.zeros(1, dtype=torch.int64, device=device)
    if me == 0:
        value = secrets.randbits(62) + 1  # not from the seeded generators: the run's draws stay as they were
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            tmp = marker.with_name(marker.name + ".tmp")
            tmp.write_text(str(value))
            os.replace(tmp, marker)
        except OSError as e:  # then no rank reads it (rank 0 included): reported below with the others
            print(f"warning: could not write {marker}: {e}", file=sys.stderr)
        token.fill_(value)
    vdist.all_reduce_(token, "max")
    vdist.barrier()
    missing = _read_token(marker, patience_s) != int(token.item())
    which = vdist.any_over_ranks([missing and r == me for r in range(world)], device=device).tolist()
    vdist.barrier()  # every rank has read it before it goes
    if me == 0:
        marker.unlink(missing_ok=True)
    blind = [r for r, b in enumerate(which) if b]
    if blind:
        ranks = f"rank {blind[0]}" if len(blind) == 1 else f"ranks {', '.join(map(str, blind))}"
        raise ConfigError(f"output_dir {run_dir}: {ranks} of {world} processes could not read the file {SHARED_FS_MARKER} "
                          f"that rank 0 wrote there: the processes do not share this directory. Multi-process "
                          f"checkpoints need a filesystem shared by every node (each rank writes its training state "
                          f"into the checkpoint folders): put output_dir on shared storage that every node mounts at "
                          f"the same path (see docs/training.md, 'Checkpoints need a shared filesystem')")
