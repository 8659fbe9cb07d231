"""A fine-tuning run with validation, stopped after its best validation and resumed with
``--resume auto``, keeps the uninterrupted run's best checkpoint and validation log.

``vlp finetune ve`` on a tiny shapes world, in this process; the validation's metric is scripted per
step (``Validator.evaluate`` patched): best at step 4, worse at steps 6 and 8. The run is killed during
the validation of step 8, after step 6's (checkpoints every 4 steps), so the resume starts at step 4
with a record of step 6 to drop and a validation (step 6) worse than the best before the stop.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import FT, QUICK, TINY_ALBEF, splits
from vlp.cli import main
from vlp.train.validation import Validator
from vlp.world.task_files.ve import write_ve_splits

WORLD = dict(seed=5, n_train=16, n_val=4, n_test=4)
PRETRAIN = [*TINY_ALBEF, "model.embed_dim=32", *QUICK, "train.steps=2"]
#: the validation's accuracy after each validated step: the best at step 4, worse after it
SCRIPTED = {2: 50.0, 4: 75.0, 6: 25.0, 8: 50.0}
STEPS = [o.replace("train.steps=4", "train.steps=8") for o in FT]


def scripted(killed_at: int | None = None):
    """A ``Validator.evaluate`` returning :data:`SCRIPTED`'s accuracy; raises at step ``killed_at``."""

    def evaluate(self: Validator, step: int) -> dict[str, float]:
        if step == killed_at:
            raise RuntimeError(f"killed during the validation of step {step}")
        return {"acc": SCRIPTED[step], "n": 4.0}

    return evaluate


def finetune(out: Path, pretrained: Path, world: dict[str, Path]) -> list[str]:
    """The ``vlp finetune ve`` command into ``out``: 8 steps, validation every 2, checkpoints every 4."""
    ve = write_ve_splits(world["root"], per_image=1)
    cfg = ["--config", "configs/finetune/shapes_ve.yaml", f"pretrained={pretrained}", f"output_dir={out}"]
    return ["finetune", "ve", *cfg, *STEPS, *splits(ve, "ve", "dev"), "train.ckpt_every=4"]


def best_state(run: Path) -> dict[str, Any]:
    return json.loads((run / "checkpoints" / "best" / "state.json").read_text())


def test_a_resumed_finetune_keeps_the_best_checkpoint_and_logs_each_validation_once(
    world, pretrained, tmp_path, monkeypatch
) -> None:
    full, out = tmp_path / "full", tmp_path / "resumed"
    monkeypatch.setattr(Validator, "evaluate", scripted())
    assert main(finetune(full, pretrained, world)) == 0
    rows = [json.loads(line) for line in (full / "val_metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["acc"], r["best"]) for r in rows] == [
        (2, 50.0, True),
        (4, 75.0, True),
        (6, 25.0, False),
        (8, 50.0, False),
    ]

    monkeypatch.setattr(Validator, "evaluate", scripted(killed_at=8))
    with pytest.raises(RuntimeError, match="killed during the validation of step 8"):
        main(finetune(out, pretrained, world))
    assert [json.loads(line)["step"] for line in (out / "val_metrics.jsonl").read_text().splitlines()] == [2, 4, 6]
    assert not (out / "checkpoints" / "step_0000008").exists() and best_state(out)["step"] == 4
    monkeypatch.setattr(Validator, "evaluate", scripted())
    assert main(["finetune", "ve", "--config", str(out / "config.yaml"), "--resume", "auto"]) == 0

    # the best checkpoint is still step 4's (the first validation after the resume, step 6's, is worse)
    assert best_state(out)["step"] == 4 and best_state(out)["best"] == best_state(full)["best"]
    assert best_state(out)["best"] == {"metric": "acc", "value": 75.0, "step": 4}
    a, b = (load_file(r / "checkpoints" / "best" / "model.safetensors") for r in (full, out))
    assert a.keys() == b.keys() and all(torch.equal(v, b[k]) for k, v in a.items())
    # every validation once, as the uninterrupted run logged it
    assert (out / "val_metrics.jsonl").read_text() == (full / "val_metrics.jsonl").read_text()
    assert json.loads((out / "results.json").read_text())["best"].endswith("best")
