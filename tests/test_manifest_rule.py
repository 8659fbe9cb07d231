"""One rule for every file vlp reads from a folder it did not write in this process (issue 41): listed
in the folder's manifest with its size and SHA-256, or refused by name. Checkpoint folders (resume,
evaluation, conversion output) and helper feature caches; ``save_pretrained`` folders are in
tests/test_api.py. A file no loader reads (a README) is left alone."""

from __future__ import annotations

import hashlib
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


def _list(folder: Path, rel: str, target: Path) -> None:
    """Add ``rel`` to ``folder``'s manifest with ``target``'s real size and SHA-256."""
    mf = json.loads((folder / MANIFEST).read_text())
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    mf["files"][rel] = {"bytes": target.stat().st_size, "sha256": digest}
    (folder / MANIFEST).write_text(json.dumps(mf))


OUTSIDE = ["../../../outside.txt", "ABSOLUTE", "sub/../../../../outside.txt", "link.txt", "linked_dir/outside.txt"]


@pytest.mark.parametrize("entry", OUTSIDE)
def test_a_manifest_entry_outside_its_folder_is_refused_naming_the_manifest_and_the_entry(
    ckpt: Path, entry: str
) -> None:
    """Issue 52: an entry ``../../../../etc/hostname`` with the file's real hash was accepted (vlp
    hashed a file outside the folder). A manifest names files inside its folder: no ``..``, no
    absolute path, no symlink out of it (resolved, then checked), whatever the hash says."""
    outside = ckpt.parents[2] / "outside.txt"  # tmp_path: beside the run directory
    outside.write_text("not the checkpoint's\n")
    (ckpt / "link.txt").symlink_to(outside)
    (ckpt / "linked_dir").symlink_to(ckpt.parents[2], target_is_directory=True)
    rel = str(outside) if entry == "ABSOLUTE" else entry
    _list(ckpt, rel, outside)
    with pytest.raises(CheckpointError) as e:
        verify_checkpoint(ckpt)
    text = str(e.value)
    assert text.startswith(f"checkpoint {ckpt}: {ckpt / MANIFEST} lists {rel!r}, which is outside the folder"), text
    assert "expected a path relative to the folder" in text and "\n" not in text
    with pytest.raises(CheckpointError, match="no valid checkpoint .*outside the folder"):
        find_checkpoint(ckpt.parents[1])


def test_a_weights_file_that_is_a_symlink_out_of_the_folder_is_refused(ckpt: Path) -> None:
    """``model.safetensors`` swapped for a symlink to an identical copy elsewhere: the hash matches,
    but what loads is not the folder's file."""
    copy = ckpt.parents[2] / "elsewhere.safetensors"
    shutil.copyfile(ckpt / "model.safetensors", copy)
    (ckpt / "model.safetensors").unlink()
    (ckpt / "model.safetensors").symlink_to(copy)
    with pytest.raises(CheckpointError, match=r"lists 'model.safetensors', which is outside the folder"):
        verify_checkpoint(ckpt)


def test_a_symlink_that_stays_inside_the_folder_and_a_plain_subfolder_entry_are_accepted(ckpt: Path) -> None:
    (ckpt / "notes").mkdir()
    (ckpt / "notes" / "a.txt").write_text("a\n")
    (ckpt / "b.txt").symlink_to(ckpt / "notes" / "a.txt")
    _list(ckpt, "notes/a.txt", ckpt / "notes" / "a.txt")
    _list(ckpt, "b.txt", ckpt / "notes" / "a.txt")
    verify_checkpoint(ckpt)


def test_a_helper_cache_manifest_entry_outside_the_folder_is_refused(tmp_path: Path) -> None:
    out = write_cache(tmp_path / "cache", ["a", "b"], torch.eye(2), ["x", "y"], torch.eye(2), {"kind": "learned"})
    outside = tmp_path / "outside.txt"
    outside.write_text("x\n")
    _list(out, "../outside.txt", outside)
    with pytest.raises(DataError, match=r"lists '../outside.txt', which is outside the folder"):
        HelperCache.load(out)


def test_a_hub_cache_snapshots_symlinks_into_its_blobs_are_accepted_others_are_not(ckpt: Path, tmp_path: Path) -> None:
    """``huggingface_hub`` lays a snapshot out as symlinks to ``models--ORG--NAME/blobs/``: those are
    the folder's own files; a symlink elsewhere (the repo folder itself, another repo) is not."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snap, blobs = repo / "snapshots" / ("a" * 40), repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in ckpt.iterdir():
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blobs / digest)
        (snap / f.name).symlink_to(Path("..", "..", "blobs", digest))
    verify_checkpoint(snap)
    (repo / "notes.txt").write_text("beside the blobs\n")
    (snap / "notes.txt").symlink_to(Path("..", "..", "notes.txt"))
    _list(snap, "notes.txt", repo / "notes.txt")
    with pytest.raises(CheckpointError, match=r"lists 'notes.txt', which is outside the folder \(a symlink"):
        verify_checkpoint(snap)
