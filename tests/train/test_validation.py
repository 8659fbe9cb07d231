"""The loop's periodic validation keeps the checkpoint with the best metric."""

import json

import torch
from torch import nn

from vlp.config import TrainConfig
from vlp.train.loop import Validation, train


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Linear(2, 1)

    def forward(self, batch, step=0):
        return {"loss": (self.model(batch["x"]) - 1).pow(2).mean()}


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
