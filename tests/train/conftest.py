"""Launching `vlp pretrain` as 1 or N CPU processes (torchrun, gloo), with DDP or DeepSpeed."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable, Sequence

import pytest

from tests.helpers import NO_TASKS, TINY_ALBEF_32, launch


@pytest.fixture(scope="session")
def tiny_model() -> list[str]:
    """Overrides for a model small enough for several multi-process runs per test file."""
    return [*TINY_ALBEF_32, "model.momentum_warmup_steps=0"]


Launch = Callable[..., subprocess.CompletedProcess]


@pytest.fixture(scope="session")
def launch_pretrain() -> Launch:
    """``launch(args, processes=1, deepspeed=None, check=True)``: run ``vlp pretrain ARGS`` on
    ``processes`` CPU processes (:func:`tests.helpers.launch`); ``deepspeed`` names a DeepSpeed JSON config."""

    def launch_it(
        args: Sequence[str], processes: int = 1, deepspeed: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        return launch(["-m", "vlp.cli", "pretrain", *args], processes, deepspeed=deepspeed, check=check)

    return launch_it


@pytest.fixture(scope="session")
def pairs_file(make_world) -> Path:
    """24 tiny images, two single-caption entries each (no per-process random caption choice)."""
    import json

    world = make_world("pairs", seed=0, n_train=24, n_val=0, n_test=0, image_size=32, **NO_TASKS)
    entries = json.loads(world["pretrain"].read_text())
    data = world["root"] / "pairs.json"
    data.write_text(json.dumps([{"image": e["image"], "caption": c} for e in entries for c in e["caption"][:2]]))
    return data


def read_run(run: Path, step: int | None = None):
    """``metrics.jsonl`` records of a run, or the weights of its ``step`` checkpoint."""
    import json

    from safetensors.torch import load_file

    if step is None:
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return load_file(run / "checkpoints" / f"step_{step:07d}" / "model.safetensors")


# A key bias shifts every attention logit of a query by the same amount: its exact gradient is 0,
# so Adam turns float noise into full-size updates. Nothing downstream depends on it.
def _zero_gradient(key: str, n: int) -> slice | None:
    if key.endswith("attention.self.key.bias"):
        return slice(0, n)
    if key.endswith("attn.qkv.bias"):  # timm: [q | k | v]
        return slice(n // 3, 2 * n // 3)
    return None


def assert_trained_alike(start: dict, a: dict, b: dict, tol: float = 1e-3) -> int:
    """Every tensor of ``b`` within ``tol`` of ``a``'s movement from ``start`` (zero-gradient key
    biases excluded); returns how many tensors moved."""
    import torch

    assert a.keys() == b.keys()
    moved = 0
    for key, x in a.items():
        x, y, s = x.double().flatten(), b[key].double().flatten(), start[key].double().flatten()
        skip = _zero_gradient(key, x.numel())
        if skip is not None:
            keep = torch.ones_like(x, dtype=torch.bool)
            keep[skip] = False
            x, y, s = x[keep], y[keep], s[keep]
        change = (x - s).norm()
        assert (x - y).norm() <= tol * change + 1e-6, key
        moved += bool(change > 0)
    return moved


@pytest.fixture(scope="session")
def runs_io():
    """``(read_run, assert_trained_alike)`` for the multi-process test files."""
    return read_run, assert_trained_alike
