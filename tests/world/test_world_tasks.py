"""Tests for the VQA and NLVR2 files of the shapes world (vlp.world.writer.write_task_files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.world.conftest import OTHER_KEYS, TASK_KEYS, WORLD, _load
from vlp.world.writer import generate_world


@pytest.fixture(scope="module")
def world(task_world: dict[str, Path]) -> dict[str, Path]:
    return task_world


def test_task_files_deterministic_and_independent(world: dict[str, Path], tmp_path: Path) -> None:
    again = generate_world(tmp_path / "again", seed=2, **WORLD)
    for key in TASK_KEYS:
        assert again[key].name == world[key].name and again[key].read_bytes() == world[key].read_bytes(), key
    other = generate_world(tmp_path / "other", seed=3, **WORLD)
    assert other["vqa_train"].read_bytes() != world["vqa_train"].read_bytes()
    assert other["nlvr_train"].read_bytes() != world["nlvr_train"].read_bytes()
    # the earlier files do not depend on the task parameters (task RNGs are separate)
    none = generate_world(tmp_path / "none", seed=2, **WORLD, vqa_per_image=0, nlvr_per_image=0)
    for key in OTHER_KEYS:
        assert none[key].read_bytes() == world[key].read_bytes(), key
    assert _load(none["vqa_train"]) == [] and _load(none["nlvr_dev"]) == [] and _load(none["answer_list"]) == []
    one = generate_world(tmp_path / "one", seed=2, **WORLD, vqa_per_image=1, nlvr_per_image=1)
    assert len(_load(one["vqa_val"])) == 30 and len(_load(one["nlvr_test"])) == 60


def test_tiny_world_writes_every_task_file(tmp_path: Path) -> None:
    paths = generate_world(tmp_path, seed=0, n_train=0, n_val=1, n_test=2, image_size=16, progress=False)
    assert _load(paths["vqa_train"]) == [] and _load(paths["nlvr_train"]) == []
    assert len(_load(paths["vqa_val"])) == 3 and len(_load(paths["nlvr_dev"])) == 2
    assert len(_load(paths["nlvr_test"])) == 4
    assert _load(paths["answer_list"])  # the val answers
    # VE needs a description present in one image and absent from another: none for 1 val image
    assert _load(paths["ve_dev"]) == [] and len(_load(paths["ve_test"])) == 6
