"""The pretraining step's backward sums in a fixed order on the CPU, so `make demo` prints the same
table for the same seed.

The backward of ``x[index]`` is an accumulating ``index_put_``, which ATen parallelises on the CPU
with atomic float adds: where ``index`` repeats a row (ITM's hard negatives draw the same text for
several images), the sum of that row's gradients depends on thread timing. With two threads the
demo's ITC loss differed in the 7th digit between two runs of the same commit from step 4 on, and
its table by up to 0.1 points. ``index_select``'s backward (``index_add_``) adds the rows in index
order. The rule checked here: no accumulating ``index_put`` with a repeated index in a step.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.helpers import token_batch
from vlp.config import LossConfig, ModelConfig, TextConfig, VisionConfig
from vlp.models.albef import ALBEF
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.pretrain import PretrainTask


class RepeatedAccumulation(TorchDispatchMode):
    """Records every accumulating ``index_put`` whose index tensor repeats a value."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self.accumulating = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in (
            torch.ops.aten.index_put,
            torch.ops.aten.index_put_,
            torch.ops.aten._index_put_impl_,
        ):
            accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
            if accumulate:
                self.accumulating += 1
                for idx in args[1]:
                    if idx is not None and idx.dtype != torch.bool and idx.unique().numel() < idx.numel():
                        self.found.append(f"{func} on {tuple(args[0].shape)} with index {idx.tolist()}")
        return func(*args, **kwargs)


def batch(b: int = 8, t: int = 9) -> dict[str, torch.Tensor]:
    """Two captions per image (so hard negatives repeat rows), every caption of full length."""
    return token_batch(torch.arange(b) // 2, t, size=32)


@pytest.mark.parametrize("slots", ["exact", "fixed"])  # loss.mlm_slots: CPU's and CUDA's way
@pytest.mark.parametrize("negatives", ["local", "global"])  # loss.itm_negatives (global: one process)
def test_no_step_accumulates_a_repeated_index(negatives, slots) -> None:
    torch.manual_seed(0)
    vision = VisionConfig(depth=1, img_size=32, patch_size=8)
    text = TextConfig(layers=1, fusion_layers=1, dropout=0.0)
    model = ALBEF(ModelConfig(vision=vision, text=text, queue_size=8, embed_dim=16))
    loss = LossConfig(mlm_probability=0.3, itm_negatives=negatives, itm_hardness=0.0, mlm_slots=slots)  # uniform draws
    task = PretrainTask(model, loss, TokenInfo(30522, 103, (0, 101, 102)), max_len=12)
    task.train()
    repeats = 0
    for seed in range(4):  # with 8 rows and 3 candidates each, some draw repeats a row
        torch.manual_seed(seed)
        mode = RepeatedAccumulation()
        with mode:
            out = task(batch(), step=0)
            out["loss"].backward()
        assert mode.found == [], "\n".join(mode.found)
        repeats += mode.accumulating
    # the check saw the MLM gather's backward (an accumulating index_put with distinct rows)
    assert repeats > 0
