"""The learned-helper experiment (scripts/experiments/srcl_helpers.py, issue 51): helpers never start
from the student's weights, grades draw nested images per seed, arms differ only where they should, and
its records round-trip."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "experiments"))
from harness import helper_seed, train_once  # noqa: E402

WORLD = dict(seed=0, n_train=64, n_val=8, n_test=8)


def _initial_state(preset: str, data: Path, seed: int) -> dict[str, torch.Tensor]:
    """The weights a run of ``preset`` with ``train.seed=seed`` starts from (the training's own path)."""
    from vlp.config import PretrainConfig, load_config
    from vlp.runs.training.pretrain import build_pretraining

    cfg = load_config(PretrainConfig, preset, [f"data.train=[{data}]", f"train.seed={seed}", "data.num_workers=0"])
    return {k: v.detach().clone() for k, v in build_pretraining(cfg).model.state_dict().items()}


def test_a_helper_and_its_student_share_no_initial_tensor(world):
    """Issue 51: the calibration experiment's learned helper and its student were both built after
    ``set_seed(seed)``, and for a seed all 166 randomly initialised tensors were bit-identical. With
    ``helper_seed``, none of the random tensors (those that differ between two student seeds) of a helper
    equals the student's, nor another grade's helper's. Fails with ``train.seed = seed`` for both."""
    student, other = (_initial_state("configs/pretrain/shapes_tiny.yaml", world["pretrain"], s) for s in (3, 4))
    helpers = [_initial_state("configs/helper/shapes_tiny.yaml", world["pretrain"], helper_seed(3, i)) for i in (0, 1)]
    random = [k for k in student if k in other and not torch.equal(student[k], other[k])]
    assert len(random) > 100  # the towers' initialised weights, not only a few
    for k in random:
        assert not torch.equal(helpers[0][k], student[k]), k
        assert not torch.equal(helpers[1][k], helpers[0][k]), k
    same_seed = _initial_state("configs/helper/shapes_tiny.yaml", world["pretrain"], 3)
    assert all(torch.equal(same_seed[k], student[k]) for k in random)  # the defect: the same seed, the same tensors


def test_helper_seeds_are_never_a_students():
    seeds = {helper_seed(s, i) for s in range(1000) for i in range(4)}
    assert len(seeds) == 4000 and min(seeds) >= 1000
    with pytest.raises(ValueError, match="student seeds"):
        helper_seed(1000)


@pytest.mark.parametrize("overrides", [["train.seed=3"], []])
def test_a_helper_run_without_a_helper_seed_is_refused_before_training(tmp_path, overrides):
    with pytest.raises(ValueError, match="its own seed"):
        train_once(tmp_path / "h", "configs/helper/shapes_tiny.yaml", tmp_path / "none.json", 1, overrides, helper=True)
    assert not (tmp_path / "h").exists()
