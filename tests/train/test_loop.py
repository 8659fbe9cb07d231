"""The generic loop on a toy task: schedule, EMA hook, clipping, bf16 autocast, logs, checkpoints."""

import pytest
import torch
from torch import nn

from vlp.config import TrainConfig
from vlp.errors import CheckpointError
from vlp.train.logging import read_metrics
from vlp.train.loop import train
from vlp.train.optim import lr_at
from vlp.weights import find_checkpoint, read_state


class ToyTask(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Linear(4, 1)
        self.hook_steps, self.autocast = [], []

    def forward(self, batch, step=0):
        self.autocast.append(torch.is_autocast_enabled("cpu"))
        pred = self.model(batch["x"]).squeeze(1)
        return {"loss": ((pred.float() - batch["y"]) ** 2).mean()}

    def batch_report(self, batch):
        return len(batch["input_ids"]), batch.get("bad_samples")

    def after_optimizer_step(self, step, skipped=None):
        if skipped is None or not bool(skipped):  # the test reads the flag; the loop never does
            self.hook_steps.append(step)


def loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    return [{"x": x[i : i + 8], "y": y[i : i + 8], "input_ids": x[i : i + 8]} for i in range(0, 32, 8)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_loop_schedule_hooks_logs_and_checkpoints(tmp_path, precision):
    cfg = TrainConfig(
        steps=12,
        lr=0.05,
        min_lr=0.001,
        warmup_steps=3,
        warmup_lr=0.0,
        log_every=4,
        ckpt_every=5,
        precision=precision,
        progress=False,
        grad_clip=10.0,
    )
    task = ToyTask()
    last = train(task, loader(), cfg, tmp_path, state={"task": "toy"})
    assert task.hook_steps == list(range(1, 13))
    assert all(a == (precision == "bf16") for a in task.autocast)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [4, 8, 12]
    assert [r["lr"] for r in rows] == pytest.approx([lr_at(s - 1, cfg) for s in (4, 8, 12)])
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert last == rows[-1]
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["step_0000005", "step_0000010", "step_0000012"]
    assert read_state(find_checkpoint(tmp_path)) == {
        "task": "toy",
        "step": 12,
        "world_size": 1,
        "samples": {"seen": 12 * 8, "bad": 0},  # the run's samples, as of its last log step
        "data_position": {"batches": 12},
    }


def test_gradient_accumulation_equals_the_big_batch_for_a_per_sample_loss(tmp_path):
    small = loader()  # 4 batches of 8
    big = [{k: torch.cat([a[k], b[k]]) for k in a} for a, b in zip(small[::2], small[1::2])]  # 2 batches of 16
    common = dict(steps=2, lr=0.05, warmup_steps=0, log_every=1, progress=False, weight_decay=0.0)
    one, two = ToyTask(), ToyTask()
    two.load_state_dict(one.state_dict())
    grads = {"big": [], "accum": []}  # .grad after each accumulation into it
    for name, task in (("big", one), ("accum", two)):
        task.model.weight.register_post_accumulate_grad_hook(lambda p, n=name: grads[n].append(p.grad.clone()))
    train(one, big, TrainConfig(**common), tmp_path / "big")
    train(two, small, TrainConfig(**common, grad_accum_steps=2), tmp_path / "accum")
    # the gradient the optimizer sees (after the 2nd micro-batch) is the big batch's, not twice it
    assert len(grads["accum"]) == 4
    for g_big, g_acc in zip(grads["big"], grads["accum"][1::2]):
        assert torch.allclose(g_acc, g_big, atol=1e-6)
    assert len(two.autocast) == 4 and len(one.autocast) == 2  # forwards: 2 micro-batches per step
    assert one.hook_steps == two.hook_steps == [1, 2]  # one optimizer step (and EMA update) per step
    for p, q in zip(one.parameters(), two.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    a, b = read_metrics(tmp_path / "big" / "metrics.jsonl"), read_metrics(tmp_path / "accum" / "metrics.jsonl")
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=1e-6)
    assert b[0]["pairs_per_s"] > 0 and [r["step"] for r in b] == [1, 2]


def test_resume_from_a_checkpoint_continues_exactly(tmp_path):
    """``train.resume``: optimizer, task state (zero-size buffers included: a disabled queue, which
    safetensors cannot store) and the data position come back; the resumed steps equal the
    uninterrupted run's."""
    import shutil

    common = dict(steps=6, lr=0.05, warmup_steps=0, log_every=1, ckpt_every=3, progress=False)

    class QueueLess(ToyTask):
        def __init__(self):
            super().__init__()
            self.register_buffer("queue", torch.zeros(0, 3))  # model.queue_size=0

    torch.manual_seed(0)
    full = QueueLess()
    train(full, loader(), TrainConfig(**common), tmp_path / "full")
    rows = read_metrics(tmp_path / "full" / "metrics.jsonl")

    run = tmp_path / "resumed"  # the run as if killed after its step-3 checkpoint
    shutil.copytree(tmp_path / "full", run)
    shutil.rmtree(run / "checkpoints" / "step_0000006")
    torch.manual_seed(123)  # another fresh model: everything must come from the checkpoint
    resumed = QueueLess()
    train(resumed, loader(), TrainConfig(**common, resume="auto"), run)
    again = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in again] == list(range(1, 7))
    assert [r["loss"] for r in again] == pytest.approx([r["loss"] for r in rows], rel=1e-6)
    assert resumed.hook_steps == [4, 5, 6]
    assert torch.allclose(resumed.model.weight, full.model.weight, atol=1e-7)


def test_resume_needs_the_train_state(tmp_path):
    train(ToyTask(), loader(), TrainConfig(steps=2, warmup_steps=0, progress=False, save_state=False), tmp_path)
    with pytest.raises(
        CheckpointError, match=r"no valid checkpoint .*step_0000002: missing train_state/rng_rank0\.json"
    ):
        train(ToyTask(), loader(), TrainConfig(steps=4, warmup_steps=0, progress=False, resume="auto"), tmp_path)
