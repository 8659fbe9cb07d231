"""The loop's periodic validation keeps the checkpoint with the best metric."""

import json
import shutil

import pytest
import torch
from torch import nn

from vlp.config import TrainConfig
from vlp.train.logging import MetricsLog, read_metrics
from vlp.train.loop import train
from vlp.train.validation import Validation, logged_best


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Linear(2, 1)

    def forward(self, batch, step=0):
        return {"loss": (self.model(batch["x"]) - 1).pow(2).mean()}

    def batch_report(self, batch):
        return len(batch["input_ids"]), batch.get("bad_samples")


def test_best_checkpoint_follows_the_metric(tmp_path):
    scores = iter([3.0, 5.0, 4.0])  # validated at steps 2, 4, 6
    seen = []

    def evaluate(task, step):
        seen.append((step, task.training))
        return {"acc": next(scores)}

    loader = [{"x": torch.ones(4, 2), "input_ids": torch.zeros(4, 1)}] * 3
    cfg = TrainConfig(steps=6, warmup_steps=0, log_every=2, progress=False)
    train(Toy(), loader, cfg, tmp_path, {"task": "toy"}, validation=Validation(evaluate, "acc", every=2))
    assert seen == [(2, False), (4, False), (6, False)]  # eval mode during validation
    rows = [json.loads(line) for line in (tmp_path / "val_metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["acc"], r["best"]) for r in rows] == [(2, 3.0, True), (4, 5.0, True), (6, 4.0, False)]
    state = json.loads((tmp_path / "checkpoints" / "best" / "state.json").read_text())
    assert state["step"] == 4 and state["best"] == {"metric": "acc", "value": 5.0, "step": 4}
    assert (tmp_path / "checkpoints" / "step_0000006" / "model.safetensors").is_file()


VALIDATE_ON_EVERY_RANK = r"""
import json, os, sys
import torch
from torch import nn
from vlp.config import TrainConfig
from vlp.dist import gather_rows, rank, shard_bounds, world_size
from vlp.train.loop import train
from vlp.train.validation import Validation, logged_best

class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Linear(2, 1)
        self.drop = nn.Dropout(0.5)

    def forward(self, batch, step=0):
        return {"loss": (self.drop(self.model(batch["x"])) - 1).pow(2).mean()}

    def batch_report(self, batch):
        return len(batch["input_ids"]), batch.get("bad_samples")

out, seen = sys.argv[1], []
values = {0: [3.0, 5.0, 4.0], 1: [5.0, 3.0, 9.0]}  # rank 1 would choose other best checkpoints

def evaluate(task, step):
    # a sharded evaluation: each rank sums its shard of 0..9, the shards are gathered
    bounds = shard_bounds(10, world_size())
    mine = torch.arange(bounds[rank()], bounds[rank() + 1], dtype=torch.float32)
    total = float(gather_rows(mine, bounds).sum())
    seen.append({"step": step, "training": task.training, "rows": len(mine), "total": total})
    return {"acc": values[rank()][len(seen) - 1]}

torch.manual_seed(0)
loader = [{"x": torch.ones(4, 2), "input_ids": torch.zeros(4, 1)}] * 3
cfg = TrainConfig(steps=6, warmup_steps=0, log_every=2, progress=False)
task = Toy()
train(task, loader, cfg, out, {"task": "toy"}, validation=Validation(evaluate, "acc", every=2))
done = {"seen": seen, "training_after": task.training}
seen = []  # pretraining's zero-shot evaluation (no best checkpoint) into metrics.jsonl
train(task, loader, cfg, os.path.join(out, "zero_shot"), {"task": "toy"}, validation=Validation(evaluate, None, every=4))
with open(os.path.join(out, f"seen{rank()}.json"), "w") as f:
    json.dump({**done, "zero_shot": seen, "training_after_zero_shot": task.training}, f)
"""


@pytest.mark.multiprocess
def test_every_rank_validates_and_rank_0_decides(tmp_path):
    """Two processes: ``evaluate`` runs on both ranks (a sharded evaluation with a gather inside: rank 0
    alone would wait for ever), in eval mode, with the task back in train mode after; the log and the
    best checkpoint follow rank 0's metrics. The same for pretraining's zero-shot evaluation
    (``train.eval_every``: no ``select``), whose records rank 0 alone writes into ``metrics.jsonl``."""
    from tests.helpers import launch

    script = tmp_path / "validate.py"
    script.write_text(VALIDATE_ON_EVERY_RANK)
    run = tmp_path / "run"
    launch([str(script), str(run)], processes=2, timeout=300)
    ranks = [json.loads((run / f"seen{r}.json").read_text()) for r in (0, 1)]
    for got in ranks:
        assert [s["step"] for s in got["seen"]] == [2, 4, 6]
        assert all(not s["training"] and s["total"] == 45.0 for s in got["seen"]) and got["training_after"]
        assert all(s["rows"] == 5 for s in got["seen"])  # each rank evaluated its half
    rows = [json.loads(line) for line in (run / "val_metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["acc"], r["best"]) for r in rows] == [(2, 3.0, True), (4, 5.0, True), (6, 4.0, False)]
    state = json.loads((run / "checkpoints" / "best" / "state.json").read_text())
    assert state["step"] == 4 and state["best"] == {"metric": "acc", "value": 5.0, "step": 4}
    for got in ranks:  # the zero-shot evaluation: steps 4 and 6 (the last), every rank its half
        assert [s["step"] for s in got["zero_shot"]] == [4, 6] and got["training_after_zero_shot"]
        assert all(not s["training"] and s["total"] == 45.0 and s["rows"] == 5 for s in got["zero_shot"])
    rows = read_metrics(run / "zero_shot" / "metrics.jsonl")
    assert [(r["step"], r["eval/acc"]) for r in rows if "eval/acc" in r] == [(4, 3.0), (6, 5.0)]  # rank 0's, once
    assert not (run / "zero_shot" / "val_metrics.jsonl").exists()
    assert not (run / "zero_shot" / "checkpoints" / "best").exists()


def test_a_resumed_run_restores_the_best_so_far_and_logs_each_validation_once(tmp_path):
    """Killed during the validation of step 8 (checkpoints every 4 steps): the resume from step 4
    restores the best so far (5.0 at step 4) from the checkpoint, so the worse validation of step 6
    does not replace ``checkpoints/best``, and drops step 6's record before logging it again."""
    scores, killed = {2: 3.0, 4: 5.0, 6: 4.0, 8: 4.5}, [8]

    def evaluate(task, step):
        if step in killed:
            raise RuntimeError(f"killed at step {step}")
        return {"acc": scores[step]}

    loader = [{"x": torch.ones(4, 2), "input_ids": torch.zeros(4, 1)}] * 3
    validation = Validation(evaluate, "acc", every=2)

    def run(out, resume=None):
        cfg = TrainConfig(steps=8, warmup_steps=0, log_every=2, ckpt_every=4, progress=False, resume=resume)
        torch.manual_seed(0)
        train(Toy(), loader, cfg, out, {"task": "toy"}, validation=validation)

    full, resumed = tmp_path / "full", tmp_path / "resumed"
    with pytest.raises(RuntimeError, match="killed at step 8"):
        run(resumed)
    assert [r["step"] for r in read_metrics(resumed / "val_metrics.jsonl")] == [2, 4, 6]
    edited = tmp_path / "edited"  # the same, its log edited to mark no record best: the checkpoint decides
    shutil.copytree(resumed, edited)
    log = edited / "val_metrics.jsonl"
    log.write_text("".join(json.dumps({**r, "best": False}) + "\n" for r in read_metrics(log)))
    killed.clear()
    run(resumed, "auto")
    run(edited, "auto")
    assert [(r["step"], r["best"]) for r in read_metrics(log)] == [(2, False), (4, False), (6, False), (8, False)]
    run(full)
    rows = read_metrics(resumed / "val_metrics.jsonl")
    assert [(r["step"], r["best"]) for r in rows] == [(2, True), (4, True), (6, False), (8, False)]
    assert (resumed / "val_metrics.jsonl").read_text() == (full / "val_metrics.jsonl").read_text()
    state = json.loads((resumed / "checkpoints" / "best" / "state.json").read_text())
    assert state["step"] == 4 and state["best"] == {"metric": "acc", "value": 5.0, "step": 4}
    assert json.loads((edited / "checkpoints" / "best" / "state.json").read_text())["step"] == 4
    last = json.loads((resumed / "checkpoints" / "step_0000008" / "state.json").read_text())
    assert last["validation"] == {"best": {"metric": "acc", "value": 5.0, "step": 4}}


def test_a_checkpoint_without_the_validation_state_restores_the_logged_best(tmp_path):
    """A checkpoint written before the best was carried in it: the last record marked best up to
    its step."""
    log = MetricsLog(tmp_path / "val_metrics.jsonl")
    for step, acc, best in [(2, 3.0, True), (4, 5.0, True), (6, 4.0, False), (8, 6.0, True)]:
        log.write({"step": step, "acc": acc, "best": best})
    assert logged_best(log.path, "acc", 6) == {"metric": "acc", "value": 5.0, "step": 4}
    assert logged_best(log.path, "acc", 8) == {"metric": "acc", "value": 6.0, "step": 8}
    assert logged_best(log.path, "acc", 1) == {} and logged_best(tmp_path / "none.jsonl", "acc", 4) == {}
