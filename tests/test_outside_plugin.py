"""An outside package extends the ``vlp`` command (issue 53): a package outside the repository, found
through its ``vlp.plugins`` entry point or ``VLP_PLUGINS``, registers a contrastive loss and a task, and
``vlp pretrain`` trains with that loss, ``vlp finetune`` and ``vlp evaluate`` run that task, each a fresh
``python -m vlp`` process; no file under vlp/ names either.

The package is written here from the suite's two outside examples (tests/losses/toy_cosine_hinge.py,
tests/toy_task.py), copied as they are into ``toy_vlp_plugin``: they import public vlp names only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers import FT, QUICK, SHAPES_TINY, TINY_ALBEF
from tests.test_kind_registry import write_toy_file

ROOT = Path(__file__).resolve().parents[1]
WORLD = dict(seed=5, n_train=16, n_val=4, n_test=4)
LOSS = "cosine_hinge"
TASK = "toy-match"

INIT = f'''"""An outside package for vlp: a cosine-hinge contrastive loss and a binary image-text task."""

from vlp.losses import LOSSES

from toy_vlp_plugin.loss import CosineHinge
from toy_vlp_plugin.task import register as register_task


def register() -> None:
    """The ``vlp.plugins`` entry point (and what importing the package by ``VLP_PLUGINS`` does)."""
    if {LOSS!r} not in LOSSES:
        LOSSES.register({LOSS!r}, CosineHinge)
        register_task()


register()
'''


def write_plugin(site: Path, entry_point: bool) -> Path:
    """``site/toy_vlp_plugin`` (and with ``entry_point`` its installed metadata naming
    ``toy_vlp_plugin:register`` in the group ``vlp.plugins``); returns ``site``."""
    pkg = site / "toy_vlp_plugin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(INIT)
    (pkg / "loss.py").write_text((ROOT / "tests" / "losses" / "toy_cosine_hinge.py").read_text())
    (pkg / "task.py").write_text((ROOT / "tests" / "toy_task.py").read_text())
    if entry_point:
        info = site / "toy_vlp_plugin-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-vlp-plugin\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text("[vlp.plugins]\ntoy = toy_vlp_plugin:register\n")
    return site


def vlp(args: list[str], site: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m vlp ARGS`` in a fresh process with ``site`` on its path (not the tests' folder)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("VLP_PLUGINS", "PYTHONPATH")}
    environ |= {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, "-m", "vlp", *args], cwd=cwd, env=environ, capture_output=True, text=True)


def test_an_outside_packages_loss_and_task_run_through_the_vlp_command(world, tmp_path):
    by_entry_point = write_plugin(tmp_path / "site_ep", entry_point=True)
    by_variable = write_plugin(tmp_path / "site_env", entry_point=False)
    pre, run, ev = tmp_path / "pre", tmp_path / "run", tmp_path / "ev"

    # without the plugin the loss is unknown: one line naming it and the registered ones
    bare = vlp(["pretrain", "--config", SHAPES_TINY, f"loss.contrastive.name={LOSS}"], tmp_path, ROOT)
    assert bare.returncode == 2 and f"unknown contrastive loss '{LOSS}'; known: ['infonce'" in bare.stderr

    args = ["pretrain", "--config", SHAPES_TINY, f"output_dir={pre}", f"data.train=[{world['pretrain']}]"]
    args += [*TINY_ALBEF, *QUICK, "train.steps=2", "model.queue_size=16", "loss.distill=false"]
    done = vlp([*args, f"loss.contrastive.name={LOSS}", "loss.contrastive.params.margin=0.3"], by_entry_point, ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    log = [json.loads(line) for line in (pre / "metrics.jsonl").read_text().splitlines()]
    itc = [r["itc"] for r in log if "itc" in r]
    assert log[-1]["step"] == 2 and itc and all(0 < x < float("inf") for x in itc)  # the hinge, finite
    saved = yaml.safe_load((pre / "config.yaml").read_text())
    assert saved["loss"]["contrastive"] == {"name": LOSS, "tau": None, "params": {"margin": 0.3}}

    data = write_toy_file(world, tmp_path / "toy.json")
    config = tmp_path / "toy.yaml"
    config.write_text(f"task: {TASK}\ndata:\n  max_len: 32\n")
    env = {"VLP_PLUGINS": "toy_vlp_plugin"}
    args = ["finetune", TASK, "--config", str(config), f"output_dir={run}", f"pretrained={pre}", *FT]
    done = vlp([*args, f"data.train=[{data}]", f"data.val={data}"], by_variable, ROOT, **env)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((run / "results.json").read_text())
    assert results["task"] == TASK and results["val"]["n"] == len(json.loads(data.read_text()))

    done = vlp(
        ["evaluate", TASK, "--checkpoint", str(run), "--data", str(data), "--out", str(ev)], by_variable, ROOT, **env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((ev / "metrics.json").read_text())
    assert metrics["n"] == results["val"]["n"] and 0.0 <= metrics["acc"] <= 100.0
    assert f"{metrics['acc']:.2f}" in done.stdout


def test_the_plugins_task_is_offered_by_the_help_only_with_the_plugin(tmp_path):
    site = write_plugin(tmp_path / "site", entry_point=False)
    with_it = vlp(["finetune", "--help"], site, ROOT, VLP_PLUGINS="toy_vlp_plugin")
    without = vlp(["finetune", "--help"], site, ROOT)
    assert with_it.returncode == without.returncode == 0
    assert TASK in with_it.stdout and TASK not in without.stdout
    gone = vlp(["finetune", "--help"], site, ROOT, VLP_PLUGINS="toy_vlp_plugin,toy_vlp_plugin_gone")
    assert gone.returncode == 2 and gone.stderr.strip().splitlines() == [
        "vlp: error: plugin 'toy_vlp_plugin_gone' (named in VLP_PLUGINS='toy_vlp_plugin,toy_vlp_plugin_gone'): "
        "not found on sys.path"
    ]
