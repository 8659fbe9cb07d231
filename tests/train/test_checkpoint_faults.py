"""Checkpoints that fail safe (issue 29, part 4 in part): a malformed or empty manifest counts as
corrupt, a tensor of another kind of dtype is refused by name, a symlinked step folder is neither
resumed from nor followed when pruning, and `train.resume=auto` in a run directory that has no
checkpoint yet starts the run from the beginning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from torch import nn

from tests.train.test_reliability import Toy, cfg, loader, step_dir
from vlp.errors import CheckpointError
from vlp.train.checkpoints import prune_checkpoints
from vlp.train.logging import read_metrics
from vlp.train.loop import train
from vlp.weights import MANIFEST, find_checkpoint, load_strict


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("faults") / "run"
    torch.manual_seed(0)
    train(Toy(), loader(), cfg(ckpt_every=2), run)  # step_2, step_4, step_6
    return run


@pytest.fixture
def run(base: Path, tmp_path: Path) -> Path:
    shutil.copytree(base, tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.parametrize("files", [["model.safetensors"], {}, {"model.safetensors": 7}, None])
def test_a_malformed_or_empty_manifest_counts_as_corrupt(run: Path, files, capsys) -> None:
    newest = step_dir(run, 6)
    manifest = json.loads((newest / MANIFEST).read_text())
    manifest["files"] = files
    (newest / MANIFEST).write_text(json.dumps(manifest))
    capsys.readouterr()
    assert find_checkpoint(run) == step_dir(run, 4)
    err = capsys.readouterr().err
    assert f"warning: checkpoint {newest}: malformed {MANIFEST}" in err and "trying the previous checkpoint" in err


def test_a_tensor_of_another_kind_of_dtype_is_refused_by_name() -> None:
    model = nn.Linear(3, 2)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["weight"] = state["weight"] > 0  # a weight file whose tensor turned into bool
    with pytest.raises(
        CheckpointError, match=r"dtype mismatches: \['weight: checkpoint torch.bool vs model torch.float32'\]"
    ):
        load_strict(model, state, source="w.safetensors")
    load_strict(model, {k: v.half() for k, v in model.state_dict().items()}, source="half")  # float to float: fine


def test_a_symlinked_step_folder_is_not_resumed_from_nor_followed_when_pruning(run: Path, tmp_path: Path, capsys):
    elsewhere = tmp_path / "elsewhere" / "step_0000008"
    shutil.copytree(step_dir(run, 6), elsewhere)
    (run / "checkpoints" / "step_0000008").symlink_to(elsewhere, target_is_directory=True)
    capsys.readouterr()
    assert find_checkpoint(run) == step_dir(run, 6)
    assert "is a symbolic link" in capsys.readouterr().err
    removed = prune_checkpoints(run, keep=1)
    assert [p.name for p in removed] == ["step_0000002", "step_0000004"]
    assert (elsewhere / "model.safetensors").is_file() and (run / "checkpoints" / "step_0000008").is_symlink()


def test_resume_auto_without_any_checkpoint_starts_from_the_beginning(tmp_path: Path, capsys) -> None:
    """A run killed before its first checkpoint left metrics.jsonl and an empty checkpoints/."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 9.0}) + "\n")
    torch.manual_seed(0)
    train(Toy(), loader(), cfg(steps=3, resume="auto"), run)
    assert "no checkpoint in" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3]
    assert find_checkpoint(run) == step_dir(run, 3)
    with pytest.raises(CheckpointError, match="no checkpoint here"):  # an explicit path still has to exist
        train(Toy(), loader(), cfg(steps=3, resume=str(tmp_path / "nothing")), tmp_path / "other")


def test_a_full_disk_stops_the_run_with_one_error_and_no_staging_folder(tmp_path: Path, monkeypatch) -> None:
    """The second checkpoint's weights hit a full disk (the error safetensors raises, os error 28)."""
    import vlp.weights

    real = vlp.weights.save_file

    def filling(*args, **kwargs):
        if "step_0000004" in str(args[1]):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real(*args, **kwargs)

    monkeypatch.setattr(vlp.weights, "save_file", filling)
    run = tmp_path / "run"
    torch.manual_seed(0)
    with pytest.raises(
        CheckpointError, match=r"cannot write .*step_0000004: no space left on the device \(.* free in "
    ):
        train(Toy(), loader(), cfg(ckpt_every=2), run)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_0000002"]  # no step_0000004.tmp
    assert find_checkpoint(run) == step_dir(run, 2)  # the earlier checkpoint is untouched


def test_a_failure_that_is_not_a_full_disk_is_raised_as_it_is(tmp_path: Path, monkeypatch) -> None:
    import vlp.train.checkpoints

    def broken(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(vlp.train.checkpoints, "save_train_state", broken)
    with pytest.raises(PermissionError):
        train(Toy(), loader(), cfg(ckpt_every=2), tmp_path / "run")
    assert list((tmp_path / "run" / "checkpoints").iterdir()) == []
