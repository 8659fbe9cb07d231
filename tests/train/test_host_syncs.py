"""Between two log steps the training loop reads nothing back from the device (issue 17).

On a GPU every read (``.item()``, ``float(t)``, ``bool(t)``, ``.tolist()``, ``.cpu()``) makes the host
wait for the device, so it cannot queue the next step's kernels ahead. Here the full pretraining
step of a tiny ALBEF (ITC with queue and distillation, ITM, MLM, momentum EMA, the non-finite check,
AdamW) runs on pre-collated batches while every such read is counted: the steps between two log
steps make none."""

from __future__ import annotations

import torch

from vlp.config import LossConfig, ModelConfig, TextConfig, TrainConfig, VisionConfig
from vlp.models.albef import ALBEF
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.pretrain import PretrainTask
from vlp.train.loop import train

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


class Counting(PretrainTask):
    """Records, at each forward, how many device reads happened since the start."""

    reads = [0]

    def forward(self, batch, step=0):
        self.at_forward = getattr(self, "at_forward", {})
        self.at_forward[step + 1] = self.reads[0]
        return super().forward(batch, step)


def batches(n=4, b=4, t=7):
    g = torch.Generator().manual_seed(0)
    out = []
    for k in range(n):
        ids = torch.randint(1000, 2000, (b, t), generator=g)
        ids[:, 0], ids[:, -1] = 101, 102
        out.append(
            dict(
                images=torch.randn(b, 3, 64, 64, generator=g),
                input_ids=ids,
                attention_mask=torch.ones(b, t, dtype=torch.long),
                image_ids=torch.arange(b) + b * k,
                bad_samples=torch.tensor(0),
            )
        )
    return out


def test_no_device_reads_between_log_steps(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = ALBEF(
        ModelConfig(vision=VisionConfig(depth=1), text=TextConfig(layers=1, fusion_layers=1), queue_size=8, embed_dim=8)
    )
    task = Counting(model, LossConfig(alpha_ramp_steps=1, mlm_probability=0.5), TokenInfo(30522, 103, (0, 101, 102)))
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **k):
            Counting.reads[0] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    cfg = TrainConfig(steps=8, lr=1e-4, warmup_steps=0, log_every=4, progress=False, save_state=False)
    train(task, batches(), cfg, tmp_path)
    monkeypatch.undo()
    reads = task.at_forward
    # steps 2, 3, 4 follow non-log steps 1, 2, 3; step 5 follows log step 4; 6, 7, 8 non-log again
    between = {s: reads[s + 1] - reads[s] for s in (1, 2, 3, 5, 6, 7)}
    assert between == {s: 0 for s in between}, between
    assert reads[5] - reads[4] > 0  # the log step reads its window (the counter does count)
