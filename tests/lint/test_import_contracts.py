"""The layering of docs/architecture.md is enforced: `lint-imports` (the contracts in pyproject.toml)
passes on vlp as it is and fails on a copy with one forbidden import or one cycle added."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_copy(tmp_path: Path, edits: dict[str, str]) -> subprocess.CompletedProcess:
    """``lint-imports`` on a copy of vlp/ (and pyproject.toml) with ``edits``: file -> line appended."""
    shutil.copytree(ROOT / "vlp", tmp_path / "vlp", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for rel, line in edits.items():
        with open(tmp_path / rel, "a") as f:
            f.write(f"\n{line}\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))  # the copy, before the editable install
    return subprocess.run([str(LINT_IMPORTS)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module", autouse=True)
def needs_lint_imports():
    if not LINT_IMPORTS.is_file():
        pytest.fail(f"{LINT_IMPORTS} missing: install the dev extra (make setup)")


def test_vlp_keeps_every_contract(tmp_path):
    res = lint_copy(tmp_path, {})
    assert res.returncode == 0, res.stdout[-3000:]
    assert "6 kept, 0 broken" in res.stdout


def test_data_importing_training_code_breaks_the_layers(tmp_path):
    res = lint_copy(tmp_path, {"vlp/data/answers.py": "from vlp.train import optim  # noqa"})
    assert res.returncode == 1
    assert "Layers: a module imports only from its own layer or below BROKEN" in res.stdout
    assert "Training code is imported by no model, data, evaluation or inference-API code BROKEN" in res.stdout
    assert "vlp.data.answers -> vlp.train.optim" in res.stdout


def test_a_cycle_between_two_modules_of_a_package_is_found(tmp_path):
    # vlp.losses.mlm imports vlp.losses.distill; the reverse import closes a cycle inside one layer
    res = lint_copy(tmp_path, {"vlp/losses/distill.py": "from vlp.losses import mlm  # noqa"})
    assert res.returncode == 1
    assert "No import cycle between the modules of any package of vlp BROKEN" in res.stdout


def test_data_importing_the_world_or_the_lab_breaks_the_contracts(tmp_path):
    res = lint_copy(tmp_path, {"vlp/data/answers.py": "from vlp.world import scene  # noqa"})
    assert res.returncode == 1
    assert "Data never imports model, task, evaluation, world, feature or lab code BROKEN" in res.stdout
    assert "vlp.data.answers -> vlp.world.scene" in res.stdout
    res = lint_copy(tmp_path / "lab", {"vlp/runs/bench/demo.py": "from vlp.lab import probes  # noqa"})
    assert res.returncode == 1
    assert "The lab is imported by nothing but the command line BROKEN" in res.stdout
