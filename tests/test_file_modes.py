"""Written files follow the umask (issue 31, item 5): safetensors' ``save_file`` creates its files
0600, which colleagues on a shared cluster cannot read; checkpoints, training state, feature files
and atomically written JSON get ``0o666 & ~umask`` like every other file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from vlp.data.json_entries import write_json_atomic
from vlp.features.store import write_features
from vlp.train.state import save_tree
from vlp.weights import save_checkpoint


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def modes(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_mode & 0o777 for p in folder.rglob("*") if p.is_file()}


def test_safetensors_alone_writes_0600(tmp_path: Path, umask: int) -> None:
    save_file({"a": torch.zeros(2)}, str(tmp_path / "x.safetensors"))
    assert modes(tmp_path) == {"x.safetensors": 0o600}  # why vlp sets the mode itself


def test_every_file_vlp_writes_follows_the_umask(tmp_path: Path, umask: int) -> None:
    ckpt = save_checkpoint(tmp_path / "ckpt", nn.Linear(2, 2), {"step": 1}, {"lam": torch.ones(1)})
    (tmp_path / "state").mkdir()
    save_tree(tmp_path / "state" / "optimizer", {"lr": 0.1, "m": torch.zeros(3)})
    write_features(tmp_path / "features.safetensors", {"image": torch.zeros(2, 2)}, {"model": "x"})
    write_json_atomic(tmp_path / "index.json", {"a": 1})
    found = modes(tmp_path)
    assert {"ckpt/model.safetensors", "ckpt/task_state.safetensors", "state/optimizer.safetensors"} <= set(found)
    assert ckpt.is_dir() and set(found.values()) == {0o666 & ~umask}, found
