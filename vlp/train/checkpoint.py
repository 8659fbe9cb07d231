"""The run's checkpoints as training needs them: setting aside and pruning step checkpoints, and
the shared-filesystem check of a multi-node run.

The checkpoint format itself, both sides, lives in the floor (:mod:`vlp.weights`): the writer
(``save_checkpoint``: staged folder, fsync, manifest, atomic rename), re-exported here for the
loop, and the reader (manifest verification, newest valid checkpoint of a run).
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import time
from pathlib import Path

import torch

from vlp import dist as vdist
from vlp.errors import ConfigError
from vlp.weights import publish, save_checkpoint, staging, step_checkpoints, write_parts

__all__ = [
    "save_checkpoint",
    "staging",
    "write_parts",
    "publish",
    "set_aside_checkpoints_after",
    "prune_checkpoints",
    "check_shared_filesystem",
]


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
    """Delete all but the newest ``keep`` step checkpoints (``best`` is never touched). A step
    folder that is a symbolic link is not the run's own: it is neither counted nor followed."""
    own = [p for p in step_checkpoints(run_dir) if not p.is_symlink()]
    old = own[:-keep] if keep > 0 else []
    for p in old:
        shutil.rmtree(p)
    return old


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
        raise ConfigError(
            f"output_dir {run_dir}: {ranks} of {world} processes could not read the file {SHARED_FS_MARKER} "
            f"that rank 0 wrote there: the processes do not share this directory. Multi-process "
            f"checkpoints need a filesystem shared by every node (each rank writes its training state "
            f"into the checkpoint folders): put output_dir on shared storage that every node mounts at "
            f"the same path (see docs/training.md, 'Checkpoints need a shared filesystem')"
        )
