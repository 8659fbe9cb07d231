"""The training step at the dispatcher (issue 28): the counter sees what makes a GPU wait, and a whole
pretraining step (forward, backward, clipping, the non-finite check, AdamW, EMA, queues, statistics)
makes no device synchronisation.

``tests/train/test_host_syncs.py`` patches Python ``Tensor`` methods, so it misses what happens below
them: boolean indexing (a hidden ``nonzero``), ``_foreach_lerp_`` resolving a 0-d tensor to a Python
scalar, ``torch.tensor(list, device=...)``. :class:`~vlp.train.dispatch_counts.DispatchCounter`
counts at the dispatcher, where every one of them shows."""

from __future__ import annotations

import pytest
import torch

from vlp.config import LossConfig, ModelConfig, TextConfig, TrainConfig, VisionConfig
from vlp.models.albef import ALBEF
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.pretrain import PretrainTask
from vlp.train.dispatch_counts import DispatchCounter
from vlp.train.setup import make_accelerator, prepare_training
from vlp.train.step import train_step
from vlp.train.step_stats import StepStats

TOKENS = TokenInfo(30522, 103, (0, 101, 102))


def counted(fn):
    with DispatchCounter() as c:
        fn()
    return c


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x[x > 0],  # boolean indexing
        lambda x: x.sum().item(),
        lambda x: bool(x.sum() > 0),
        lambda x: torch.nonzero(x),
        lambda x: x.masked_select(x > 0),
        lambda x: torch.tensor([1, 2], device=x.device),
        lambda x: torch.repeat_interleave(x[:2].long().abs() + 1),
        lambda x: torch._foreach_lerp_([x.clone()], [x], torch.tensor(0.5)),  # Scalar overload: .item()
        lambda x: x.unique(),
    ],
    ids=[
        "bool-index",
        "item",
        "bool",
        "nonzero",
        "masked_select",
        "tensor-from-list",
        "repeat_interleave",
        "lerp",
        "unique",
    ],
)
def test_the_counter_sees_each_kind_of_sync(fn):
    x = torch.randn(6)
    assert counted(lambda: fn(x)).summary()["syncs_per_step"] >= 1


def test_the_counter_passes_sync_free_work_and_counts_kernels_not_views():
    x, w = torch.randn(4, 6), torch.randn(6, 6)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.randn(2))])

    def work():
        y = (x @ w).t()[:3].unsqueeze(0)  # mm; transpose, slice, unsqueeze are views
        torch.where(x > 0, x, torch.zeros_like(x)).sum()  # gt, zeros_like, where, sum
        x.to(torch.bfloat16)  # a cast
        torch.full((), 0.5)  # a fill, not host data
        torch.empty(3)  # an allocation launches nothing
        opt.zero_grad(set_to_none=True)  # nor do the profiler's record_function markers
        return y

    s = counted(work).summary()
    assert s["syncs_per_step"] == 0
    assert s["casts_per_step"] == 1
    assert s["top_ops"] == dict.fromkeys(["mm", "gt", "zeros_like", "where", "sum", "_to_copy", "full"], 1)


def test_casts_of_watched_tensors_are_counted_apart():
    w, v = torch.randn(3, 3), torch.randn(3, 3)
    with DispatchCounter(watch=[w]) as c:
        w.to(torch.bfloat16), v.to(torch.bfloat16), w.to(torch.float32)  # the last is no cast
    s = c.summary()
    assert (s["casts_per_step"], s["casts_of_watched_per_step"]) == (2, 1)


def batches(n=3, b=4, t=7):
    g = torch.Generator().manual_seed(0)
    for k in range(n):
        ids = torch.randint(1000, 2000, (b, t), generator=g)
        ids[:, 0], ids[:, -1] = 101, 102
        yield dict(
            images=torch.randn(b, 3, 32, 32, generator=g),
            input_ids=ids,
            attention_mask=torch.ones(b, t, dtype=torch.long),
            image_ids=torch.arange(b) + b * k,
            bad_samples=torch.tensor(0),
        )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_whole_pretraining_step_makes_no_device_sync(precision):
    """ITC with queue and distillation, ITM with hard negatives, MLM with distillation, clipping,
    fused AdamW, the EMA, the queues' keep-or-undo, the step statistics."""
    torch.manual_seed(0)
    vision = VisionConfig(depth=1, img_size=32, patch_size=8)
    model = ALBEF(ModelConfig(vision=vision, text=TextConfig(layers=1, fusion_layers=1), queue_size=8, embed_dim=8))
    task = PretrainTask(
        model,
        LossConfig(alpha_ramp_steps=4, mlm_probability=0.5, mlm_slots="fixed"),
        TokenInfo(30522, 103, (0, 101, 102)),
    )
    cfg = TrainConfig(steps=4, lr=1e-4, warmup_steps=2, grad_clip=1.0, precision=precision, progress=False)
    acc = make_accelerator(cfg)
    prep = prepare_training(acc, task, [], cfg)
    stats = StepStats(acc.device, cfg.max_nonfinite_steps)
    data = batches()
    args = (acc, prep.task, prep.inner, prep.optimizer, prep.params, data)
    train_step(*args, 0, cfg, stats)  # the first step creates the optimizer state
    counter = DispatchCounter(watch=model.momentum.parameters())
    with counter:
        train_step(*args, 1, cfg, stats, phase=counter.phase)
    s = counter.summary()
    assert s["kernel_ops_per_step"] > 200 and s["module_calls_per_forward"] > 20  # it did count the step
    assert set(s["per_phase"]) >= {"forward", "backward", "optimizer", "statistics"}
    assert s["syncs_per_step"] == 0, s["sync_sites"]
    assert s["casts_of_watched_per_step"] == 0


def test_exact_mlm_slots_cost_one_sync_and_auto_is_exact_off_cuda():
    """``loss.mlm_slots=exact`` (what ``auto`` picks on a CPU, where a sync costs nothing and the
    head's extra slots do) gathers the masked tokens with one ``nonzero``."""
    from vlp.tasks.objectives import draw_masks

    ids = torch.randint(1000, 2000, (4, 9))
    mask = torch.ones_like(ids)
    TOKENS.special_ids_on(ids.device)  # copied to the device once, at the first step
    labels = {}
    for slots, syncs in (("exact", 1), ("auto", 1), ("fixed", 0)):
        with DispatchCounter() as c:
            draw = draw_masks(ids, mask, TOKENS, 0.3, torch.Generator().manual_seed(0), slots=slots)
        assert c.summary()["syncs_per_step"] == syncs, slots
        labels[slots] = draw.labels
    assert labels["fixed"].numel() == 36  # capacity min(36, 0.3 * 36 + 8 sigma + 8)
    assert torch.equal(labels["fixed"][labels["fixed"] != -100], labels["exact"])  # same tokens, same order
