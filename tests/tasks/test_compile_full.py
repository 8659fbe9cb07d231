"""``train.compile=full``: the pretraining forward as one compiled graph (issue 28)."""

import warnings

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from tests.tasks.test_pretrain import make_batch, tiny
from vlp.config import LossConfig, ModelConfig, TextConfig, TrainConfig, VisionConfig
from vlp.errors import ConfigError
from vlp.models.albef import ALBEF
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.pretrain import PretrainTask
from vlp.train import setup

TOKENS = TokenInfo(30522, 103, (0, 101, 102))


def task(compiled: bool, **loss) -> PretrainTask:
    torch.manual_seed(0)
    model = ALBEF(
        ModelConfig(
            vision=VisionConfig(depth=1),
            text=TextConfig(layers=1, fusion_layers=1, dropout=0.0),
            queue_size=8,
            embed_dim=8,
        )
    )
    t = PretrainTask(
        model,
        LossConfig(alpha_ramp_steps=2, mlm_slots="fixed", **loss),
        TOKENS,
        max_len=6,
        text_padding="max_len",
    )
    if compiled:
        t.compile_full("eager")  # capture without code generation: the numbers must be identical
    return t.train()


def test_compiled_forward_gives_eagers_losses_gradients_and_queues():
    """Draws outside the graph (the same ones), alpha as a tensor (at 0 the graph still runs the
    twin's MLM pass, weighted 0): the same losses, gradients and queue writes as eager mode.
    Without dropout: that extra pass at alpha 0 draws dropout masks eager mode does not draw."""
    torch._dynamo.reset()
    counters.clear()
    runs = []
    for compiled in (False, True):
        t, rows = task(compiled), []
        for step in (0, 1, 2):  # alpha 0, ramping, full
            out = t(make_batch([0, 1, 2, 3]), step=step)
            out["loss"].backward()
            grads = {n: p.grad.clone() for n, p in t.named_parameters() if p.grad is not None}
            t.zero_grad(set_to_none=True)
            rows.append((out, grads, t.model.queue.get("text").clone()))
        runs.append(rows)
    assert counters["stats"]["unique_graphs"] == 1
    for (out0, g0, q0), (out1, g1, q1) in zip(*runs):
        for k in ("itc", "itm", "mlm", "loss", "alpha"):
            torch.testing.assert_close(out1[k], out0[k], rtol=1e-6, atol=1e-6)
        assert g1.keys() == g0.keys() and len(g0) > 50
        for n in g0:
            torch.testing.assert_close(g1[n], g0[n], rtol=1e-5, atol=1e-6)
        assert torch.equal(q1, q0)
    torch._dynamo.reset()


@pytest.mark.parametrize(
    "change, key",
    [
        (dict(text_padding="longest"), "data.text_padding"),
        (dict(mlm_slots="exact"), "loss.mlm_slots=exact"),
    ],
)
def test_what_full_compilation_cannot_take_is_refused_by_name(change, key):
    t = PretrainTask(
        tiny(),
        LossConfig(mlm_slots=change.get("mlm_slots", "auto")),
        TOKENS,
        max_len=6,
        text_padding=change.get("text_padding", "max_len"),
    )
    with pytest.raises(ConfigError, match=key):
        t.compile_full("eager")


def test_compile_settings_and_cuda_graph_fall_back(monkeypatch):
    assert TrainConfig(compile=True).compile == "blocks"  # train.compile=true keeps its meaning
    assert TrainConfig(compile="false").compile == "off"
    with pytest.raises(ConfigError, match="train.compile"):
        TrainConfig(compile="all")
    with pytest.raises(ConfigError, match="train.cuda_graphs"):
        TrainConfig(cuda_graphs=True, compile="blocks")
    cfg = TrainConfig(compile="full", cuda_graphs=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning, match="CUDA graphs need a CUDA device") as seen:
        assert setup.cuda_graph_mode(cfg) is None
    assert len(seen) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert setup.cuda_graph_mode(cfg) == "reduce-overhead"
    from vlp.train.compile_watch import CompileRecord

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not setup.warn_if_cuda_graphs_skipped(cfg, CompileRecord(graphs=2))  # captured: nothing to say
    reason = "skipping cudagraphs due to mutated inputs (1 instances)"
    skipped = CompileRecord(graphs=2, cudagraph_skips=2, skip_reasons=[reason])
    with pytest.warns(UserWarning, match=r"2 graph\(s\) of the step run without CUDA graphs \(not captured: skipping"):
        assert setup.warn_if_cuda_graphs_skipped(cfg, skipped)
    with pytest.warns(UserWarning, match="without logging a reason"):  # counted, reason not seen
        assert setup.warn_if_cuda_graphs_skipped(cfg, CompileRecord(cudagraph_skips=1))
    assert not setup.warn_if_cuda_graphs_skipped(TrainConfig(compile="full"), skipped)  # cuda_graphs off


def test_cuda_graphs_refused_with_accumulation_and_with_a_backend_other_than_inductor():
    """Issue 44: every micro-batch marks a new CUDA-graph step, so the next replay would overwrite the
    outputs the non-finite check and the statistics read after the last one; and a backend other than
    inductor drops ``reduce-overhead`` silently. Both are refused, in one line naming both keys."""
    with pytest.raises(ConfigError) as err:
        TrainConfig(compile="full", cuda_graphs=True, grad_accum_steps=2)
    msg = str(err.value)
    assert "\n" not in msg and "train.cuda_graphs" in msg and "train.grad_accum_steps" in msg
    with pytest.raises(ConfigError) as err:
        TrainConfig(compile="full", cuda_graphs=True, compile_backend="eager")
    msg = str(err.value)
    assert "\n" not in msg and "train.cuda_graphs" in msg and "train.compile_backend" in msg and "'eager'" in msg
    assert TrainConfig(compile="full", cuda_graphs=True, grad_accum_steps=1).compile_backend == "inductor"
    assert TrainConfig(compile="full", compile_backend="eager", grad_accum_steps=2).grad_accum_steps == 2
