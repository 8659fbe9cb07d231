"""Two CPU processes (gloo, launched with torchrun) against one process with the same global batch.

The run: ITC with the queue, momentum distillation, the learned temperature and momentum updates,
``loss.itc_bank=global`` (every rank's momentum features in the bank), 4 steps, global batch 8
(one process x 8, or two x 4). ITM and MLM are off here: their negatives and masks are still drawn
per rank (see docs/training.md), so they cannot match a one-process run draw for draw.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vlp.data.synthetic import generate_world

STEPS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp: Path, out: str, processes: int, data: Path) -> Path:
    args = [
        "pretrain", "--config", "configs/pretrain/shapes_tiny.yaml", f"output_dir={tmp / out}",
        f"data.train=[{data}]", f"data.batch_size={8 // processes}", "data.num_workers=0",
        f"train.steps={STEPS}", "train.log_every=1", "train.ckpt_every=1", "train.warmup_steps=0",
        "train.progress=false", "model.vision.depth=1", "model.vision.img_size=32", "model.text.layers=1",
        "model.text.fusion_layers=1", "model.queue_size=16", "model.momentum_warmup_steps=0",
        "loss.itm=0", "loss.mlm=0", "loss.itc_bank=global", "loss.alpha_ramp_steps=2",
    ]
    if processes == 1:
        cmd = [sys.executable, "-m", "vlp.cli", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
               f"--master_port={_free_port()}", "-m", "vlp.cli", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[2])
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / out


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step_{step:07d}" / "model.safetensors")


# A key bias shifts every attention logit of a query by the same amount: its exact gradient is 0,
# so Adam turns float noise into full-size updates. Nothing downstream depends on it.
def _zero_gradient(key: str, n: int) -> slice | None:
    if key.endswith("attention.self.key.bias"):
        return slice(0, n)
    if key.endswith("attn.qkv.bias"):  # timm: [q | k | v]
        return slice(n // 3, 2 * n // 3)
    return None


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("dist")
    world = generate_world(tmp / "world", seed=0, n_train=24, n_val=0, n_test=0, image_size=32, progress=False,
                           vqa_per_image=0, nlvr_per_image=0)
    # one caption per entry: ALBEF picks one of several captions at random, per process
    entries = json.loads(world["pretrain"].read_text())
    data = tmp / "world" / "pairs.json"
    data.write_text(json.dumps([{"image": e["image"], "caption": c} for e in entries for c in e["caption"][:2]]))
    return _run(tmp, "one", 1, data), _run(tmp, "two", 2, data)


def test_two_processes_log_the_losses_of_one_process(runs: tuple[Path, Path]) -> None:
    one, two = ([json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()] for r in runs)
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, STEPS + 1))
    for a, b in zip(one, two):
        assert b["itc"] == pytest.approx(a["itc"], rel=1e-6, abs=1e-6), (a, b)
        assert b["temp"] == pytest.approx(a["temp"], rel=1e-6)
    assert one[-1]["itc"] != pytest.approx(one[0]["itc"], rel=1e-3)  # it trained


def test_two_processes_update_weights_momentum_and_queues_like_one(runs: tuple[Path, Path]) -> None:
    one, two = runs
    start, end_one, end_two = _weights(one, 1), _weights(one, STEPS), _weights(two, STEPS)
    assert end_one.keys() == end_two.keys()
    compared = moved = 0
    for key, a in end_one.items():
        a, b, s = a.double().flatten(), end_two[key].double().flatten(), start[key].double().flatten()
        skip = _zero_gradient(key, a.numel())
        if skip is not None:
            keep = torch.ones_like(a, dtype=torch.bool)
            keep[skip] = False
            a, b, s = a[keep], b[keep], s[keep]
        change = (a - s).norm()
        assert (a - b).norm() <= 1e-3 * change + 1e-6, key
        compared += 1
        moved += bool(change > 0)
    assert compared == len(end_one)
    assert moved > 50  # weights, momentum twins and the queues all moved between steps 1 and 4
    assert torch.equal(end_one["queue.ids"], end_two["queue.ids"])
    assert torch.allclose(end_one["queue.text"], end_two["queue.text"], atol=1e-6)
