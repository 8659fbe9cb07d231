"""``train.compile=full``'s post-step graph (issue 28, part 3): clipping, the non-finite check,
AdamW, the EMA, the queues' keep-or-undo and the statistics as one graph, with the eager step's
numbers."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from tests.train.test_dispatch_counts import batches
from vlp.config import LossConfig, ModelConfig, TextConfig, TrainConfig, VisionConfig
from vlp.models.albef import ALBEF
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.pretrain import PretrainTask
from vlp.train.post_step import PostStep, adamw_, compiled_post_step
from vlp.train.setup import make_accelerator, prepare_training
from vlp.train.step import stateful_modules, train_step
from vlp.train.step_stats import StepStats


def tensors(seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(5, 3, generator=g), torch.randn(4, generator=g), torch.randn(2, 2, 2, generator=g)]
    grads = [[torch.randn(p.shape, generator=g) for p in params] for _ in range(4)]
    return params, grads


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_adamw_matches_torchs_fused_adamw(weight_decay):
    """Four steps with a changing learning rate: the same weights and state as torch's fused AdamW."""
    params, grads = tensors()
    ref = [p.clone().requires_grad_(True) for p in params]
    opt = torch.optim.AdamW(ref, lr=1e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=weight_decay, fused=True)
    mine = [p.clone() for p in params]
    m, v = [torch.zeros_like(p) for p in mine], [torch.zeros_like(p) for p in mine]
    steps = [torch.zeros(()) for _ in mine]
    keep = torch.tensor(True)
    for k, gs in enumerate(grads):
        lr = 1e-3 * (k + 1)
        for p, g in zip(ref, gs):
            p.grad = g.clone()
        opt.param_groups[0]["lr"] = lr
        opt.step()
        adamw_(mine, gs, m, v, steps, torch.tensor(lr), keep, (0.9, 0.98), 1e-6, weight_decay)
    for p, q, a, b in zip(ref, mine, m, v):
        torch.testing.assert_close(q, p.detach(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(a, opt.state[p]["exp_avg"], rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(b, opt.state[p]["exp_avg_sq"], rtol=1e-6, atol=1e-10)
    assert [float(s) for s in steps] == [4.0] * 3


@pytest.mark.parametrize("first", [True, False])
def test_a_skipped_adamw_step_leaves_every_tensor_bit_for_bit(first):
    """Non-finite gradients and ``keep`` false: weights, moments and step counts unchanged, also
    at the very first step (step count 0: no 0 / 0 in the bias correction)."""
    params, grads = tensors(1)
    m, v = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    steps = [torch.zeros(()) for _ in params]
    if not first:
        adamw_(params, grads[0], m, v, steps, torch.tensor(1e-2), torch.tensor(True), weight_decay=0.1)
    before = [t.clone() for t in itertools.chain(params, m, v, steps)]
    bad = [g.clone() for g in grads[1]]
    bad[0][0, 0], bad[1][2] = float("nan"), float("inf")
    adamw_(params, bad, m, v, steps, torch.tensor(1e-2), torch.tensor(False), weight_decay=0.1)
    for a, b in zip(itertools.chain(params, m, v, steps), before):
        assert torch.equal(a, b)


def pretraining(compile_full: bool, clip: float = 1.0):
    """The tiny ALBEF pretraining task prepared for training (fixed text length and MLM slots, so
    ``train.compile=full`` can take it), and its train config."""
    torch.manual_seed(0)
    vision = VisionConfig(depth=1, img_size=32, patch_size=8)
    text = TextConfig(layers=1, fusion_layers=1, dropout=0.0)
    model = ALBEF(ModelConfig(vision=vision, text=text, queue_size=8, embed_dim=8, momentum_warmup_steps=3))
    task = PretrainTask(
        model,
        LossConfig(alpha_ramp_steps=2, mlm_probability=0.5, mlm_slots="fixed"),
        TokenInfo(30522, 103, (0, 101, 102)),
        max_len=7,
        text_padding="max_len",
    )
    cfg = TrainConfig(
        steps=6,
        lr=1e-3,
        warmup_steps=3,
        weight_decay=0.02,
        grad_clip=clip,
        progress=False,
        compile="full" if compile_full else "off",
        compile_backend="eager",
    )
    acc = make_accelerator(cfg)
    return acc, prepare_training(acc, task, [], cfg), cfg


def poison(step: int):
    """Batches whose third step has a non-finite image (a non-finite loss and gradient)."""
    for k, b in enumerate(batches(5)):
        if k == step:
            b["images"][0, 0, 0, 0] = float("nan")
        yield b


def live(prep) -> list[torch.Tensor]:
    """Every tensor a step may change: the task's state (weights, twins, queues) and AdamW's state."""
    opt = prep.optimizer.optimizer
    state = [opt.state[p][k] for p in prep.params for k in ("exp_avg", "exp_avg_sq", "step") if opt.state[p]]
    return [t.detach() for t in [*prep.inner.state_dict(keep_vars=True).values(), *state]]


def snapshot(prep) -> list[torch.Tensor]:
    return [t.clone() for t in live(prep)]


def load(into, source) -> None:
    """``source``'s state into ``into`` (in place: the compiled graph keeps its inputs)."""
    for a, b in zip(live(into), live(source)):
        a.copy_(b.to(a.device))


@pytest.mark.parametrize("clip", [1.0, 0.0])
def test_the_post_step_graph_gives_the_eager_steps_numbers(clip):
    """Five steps through the lr warm-up and the momentum ramp, the third non-finite, eager and
    compiled in lockstep: after each step the weights, AdamW state, momentum twins, queues and the
    step's record agree (to rounding), and the compiled one then continues from the eager one's
    state (over several steps AdamW would turn the rounding of near-zero gradients, of the size of
    its eps, into visible differences). The skipped step leaves every tensor bit for bit; the graph
    is compiled once."""
    torch._dynamo.reset()
    counters.clear()
    runs = []
    for compiled in (False, True):
        acc, prep, cfg = pretraining(False, clip)  # an eager forward: only the post-step differs
        undo = stateful_modules(prep.inner)
        post = PostStep(prep.optimizer, prep.inner, prep.params, undo, cfg, acc.device, "eager") if compiled else None
        runs.append((acc, prep, cfg, undo, post, StepStats(acc.device, max_nonfinite=3), poison(2)))
    graphs = []
    for step in range(5):
        before = snapshot(runs[1][1]) if step == 2 else None
        results = []
        for acc, prep, cfg, undo, post, stats, data in runs:
            args = (acc, prep.task, prep.inner, prep.optimizer, prep.params, data, step, cfg, stats)
            results.append(train_step(*args, undo=undo, post=post))
            assert all(p.grad is None for p in prep.inner.parameters())
        graphs.append(counters["stats"]["unique_graphs"])
        assert [bool(r.skipped) for r in results] == [step == 2] * 2
        eager, mine = snapshot(runs[0][1]), snapshot(runs[1][1])
        assert len(eager) == len(mine) > 100
        for a, b in zip(mine, eager):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        if before is not None:  # the skipped step changed nothing
            assert all(torch.equal(a, b) for a, b in zip(mine, before))
        load(runs[1][1], runs[0][1])
    assert graphs == [1] * 5  # the post-step, compiled once
    (s0, s1) = (runs[0][5].records, runs[1][5].records)
    assert [(s, m) for s, m, _ in s1] == [(s, m) for s, m, _ in s0] == [(k, True) for k in range(1, 6)]
    for (_, _, a), (_, _, b) in zip(s1, s0):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert s1[2][2][0] == 1 and s1[3][2][0] == 0  # [skipped, in_a_row, ...]
    torch._dynamo.reset()


def test_compile_full_under_deepspeed_or_another_optimizer_keeps_the_eager_post_step():
    acc, prep, cfg = pretraining(True)
    undo = stateful_modules(prep.inner)
    assert isinstance(compiled_post_step(acc, prep.optimizer, prep.inner, prep.params, undo, cfg), PostStep)
    sgd = torch.optim.SGD(prep.params, lr=0.1)
    assert compiled_post_step(acc, sgd, prep.inner, prep.params, undo, cfg) is None
    cfg.compile = "blocks"
    assert compiled_post_step(acc, prep.optimizer, prep.inner, prep.params, undo, cfg) is None


def test_a_compiled_run_checkpoints_and_resumes_eagerly(tmp_path):
    """``vlp pretrain``'s loop under ``train.compile=full`` (forward and post-step graphs): it logs
    and checkpoints as usual, and its checkpoint resumes without compilation, AdamW's state being
    torch's: the resumed steps' losses equal the compiled run's (to AdamW's rounding)."""
    import shutil

    from vlp.train.logging import read_metrics
    from vlp.train.loop import train

    data = list(batches(4))
    common = dict(steps=4, lr=1e-3, warmup_steps=2, log_every=1, ckpt_every=2, progress=False, grad_clip=1.0)
    torch._dynamo.reset()
    counters.clear()
    _, prep, _ = pretraining(False)  # a fresh tiny task (prepare_training's wrapping is not reused)
    train(prep.inner, data, TrainConfig(**common, compile="full", compile_backend="eager"), tmp_path / "full")
    assert counters["stats"]["unique_graphs"] == 2  # the forward and the post-step
    rows = read_metrics(tmp_path / "full" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["loss"] == r["loss"] for r in rows)
    run = tmp_path / "resumed"
    shutil.copytree(tmp_path / "full", run)
    shutil.rmtree(run / "checkpoints" / "step_0000004")
    _, fresh, _ = pretraining(False)
    train(fresh.inner, data, TrainConfig(**common, resume="auto"), run)
    again = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in again] == [1, 2, 3, 4]
    assert [r["loss"] for r in again] == pytest.approx([r["loss"] for r in rows], rel=1e-4)
    torch._dynamo.reset()


def _agree(rank: int, port: int, out: str) -> None:
    """One rank of :func:`test_the_compiled_skip_decision_is_agreed_over_the_ranks`."""
    import json
    import os

    import torch.distributed as dist

    from vlp.dist import any_over_ranks, destroy_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        check = torch.compile(
            lambda x: any_over_ranks([~torch.isfinite(x).all()], device=torch.device("cpu"))[0],
            backend="eager",
            fullgraph=True,
        )
        seen = [bool(check(torch.tensor([v]))) for v in (1.0, float("nan") if rank == 1 else 2.0, 3.0)]
        with open(f"{out}.{rank}", "w") as f:
            json.dump({"seen": seen, "graphs": counters["stats"]["unique_graphs"]}, f)
    finally:
        destroy_group()


@pytest.mark.multiprocess
def test_the_compiled_skip_decision_is_agreed_over_the_ranks(tmp_path):
    """The post-step graph's all-reduce of the non-finite flag (dynamo traces it as a collective):
    one rank's NaN skips the step on both, in one graph."""
    import json

    import torch.multiprocessing as mp

    from tests.helpers import free_port

    mp.spawn(_agree, args=(free_port(), str(tmp_path / "rank")), nprocs=2)
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank.{rank}").read_text())
        assert got == {"seen": [False, True, False], "graphs": 1}
