"""One rule for every file vlp reads from a folder it did not write in this process (issue 41): listed
in the folder's manifest with its size and SHA-256, or refused by name. Checkpoint folders (resume,
evaluation, conversion output) and helper feature caches; ``save_pretrained`` folders are in
tests/test_api.py. A file no loader reads (a README) is left alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from vlp.errors import CheckpointError, DataError
from vlp.features.helper_cache import HelperCache, write_cache
from vlp.weights import MANIFEST, TASK_STATE, find_checkpoint, save_checkpoint, verify_checkpoint


@pytest.fixture()
def ckpt(tmp_path: Path) -> Path:
    """A checkpoint folder without task state or preprocessor.json, in a run directory."""
    return save_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000002", nn.Linear(2, 2), {"step": 2})


@pytest.mark.parametrize("stray", ["preprocessor.json", TASK_STATE, "train_state/rng_rank0.json"])
def test_a_file_a_checkpoint_loader_reads_but_the_manifest_does_not_list_is_refused(ckpt: Path, stray: str) -> None:
    """A ``preprocessor.json`` dropped into a checkpoint changes evaluation preprocessing, a
    ``task_state.safetensors`` a task's state: each is refused by name, like a changed file."""
    (ckpt / "README.md").write_text("notes\n")  # read by nothing: allowed
    verify_checkpoint(ckpt)
    (ckpt / stray).parent.mkdir(exist_ok=True)
    (ckpt / stray).write_text("{}")
    with pytest.raises(CheckpointError, match=rf"{ckpt}: {stray} is not in {MANIFEST}, and the checkpoint loader"):
        verify_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match=rf"no valid checkpoint .*{stray} is not in {MANIFEST}"):
        find_checkpoint(ckpt.parents[1])  # the run directory: its only checkpoint refused, by name


def test_a_checkpoint_without_a_manifest_is_refused_by_name(ckpt: Path) -> None:
    """Deleting the manifest is not a way around the rule: nothing in such a folder can be checked,
    so a resume (falling back to an earlier checkpoint if there is one) and a load refuse it."""
    earlier = save_checkpoint(ckpt.parent / "step_0000001", nn.Linear(2, 2), {"step": 1})
    (ckpt / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=rf"checkpoint {ckpt}: no {MANIFEST}, so vlp cannot tell"):
        verify_checkpoint(ckpt)
    assert find_checkpoint(ckpt.parents[1]) == earlier


def test_a_helper_cache_is_verified_against_its_manifest(tmp_path: Path) -> None:
    """``vlp cache-helper-features`` output gets a manifest; a changed ``index.json`` (another
    caption text for a row) or ``features.safetensors`` is refused by name, as is an unlisted file
    the reader would read; so is a cache without a manifest (its files cannot be checked)."""
    out = write_cache(tmp_path / "cache", ["a", "b"], torch.eye(2), ["x", "y"], torch.eye(2), {"kind": "learned"})
    files = json.loads((out / MANIFEST).read_text())["files"]
    assert set(files) == {"features.safetensors", "index.json"}
    assert HelperCache.load(out).lookup("a", "y")[1].tolist() == [0.0, 1.0]
    changed = shutil.copytree(out, tmp_path / "changed")
    index = (changed / "index.json").read_text()
    (changed / "index.json").write_text(index.replace('"texts": ["x", "y"]', '"texts": ["y", "x"]'))
    with pytest.raises(DataError, match=r"changed.*index.json does not match its SHA-256 in manifest.json"):
        HelperCache.load(changed)
    old = shutil.copytree(out, tmp_path / "old")
    (old / MANIFEST).unlink()
    with pytest.raises(DataError, match=rf"{old}: no {MANIFEST}, .*; build the cache again with `vlp cache-helper"):
        HelperCache.load(old)
