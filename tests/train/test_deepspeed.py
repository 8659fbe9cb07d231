"""DeepSpeed ZeRO-2 through accelerate, on 2 CPU processes (gloo): the same training as DDP, the
momentum twins and queues fp32 under bf16, and save_state / resume.

Runs where DeepSpeed is installed (``pip install -e '.[deepspeed]'``; ``make test`` installs it);
skipped with that reason elsewhere.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed: pip install -e '.[deepspeed]'")

STEPS = 4
ZERO2 = "configs/deepspeed/zero2.json"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launch_pretrain, tiny_model, pairs_file) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("deepspeed")

    def args(name: str, *extra: str) -> list[str]:
        return [
            "--config",
            "configs/pretrain/shapes_tiny.yaml",
            f"output_dir={tmp / name}",
            f"data.train=[{pairs_file}]",
            "data.batch_size=4",
            "data.num_workers=0",
            f"train.steps={STEPS}",
            "train.log_every=1",
            "train.ckpt_every=2",
            "train.warmup_steps=0",
            "train.progress=false",
            "train.grad_clip=1.0",
            "loss.alpha_ramp_steps=2",
            *tiny_model,
            *extra,
        ]

    launch_pretrain(args("ddp"), processes=2)
    launch_pretrain(args("zero2"), processes=2, deepspeed=ZERO2)
    launch_pretrain(args("zero2_bf16", "train.precision=bf16"), processes=2, deepspeed=ZERO2)
    launch_pretrain(args("ddp_bf16", "train.precision=bf16"), processes=2)
    # resume: the ZeRO-2 run as if it had been killed after its step-2 checkpoint
    shutil.copytree(tmp / "zero2", tmp / "resumed")
    shutil.rmtree(tmp / "resumed" / "checkpoints" / "step_0000004")
    launch_pretrain(args("resumed", "train.resume=auto"), processes=2, deepspeed=ZERO2)
    return {name: tmp / name for name in ("ddp", "zero2", "zero2_bf16", "ddp_bf16", "resumed")}


@pytest.mark.multiprocess
def test_zero2_trains_like_ddp(runs: dict[str, Path], runs_io) -> None:
    read, alike = runs_io
    ddp, zero2 = read(runs["ddp"]), read(runs["zero2"])
    assert [r["step"] for r in zero2] == list(range(1, STEPS + 1))
    for a, b in zip(ddp, zero2):
        for key in ("itc", "itm", "mlm", "loss", "temp"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (key, a, b)
    assert zero2[-1]["temp"] != zero2[0]["temp"]  # the 0-d temperature is trained under ZeRO too
    moved = alike(read(runs["ddp"], 2), read(runs["ddp"], STEPS), read(runs["zero2"], STEPS))
    assert moved > 50  # weights, momentum twins and queues: every one as DDP moved it


@pytest.mark.multiprocess
def test_zero2_trains_like_ddp_under_bf16(runs: dict[str, Path], runs_io) -> None:
    """Issue 17, defect 8: DeepSpeed's torch_autocast reduced Linear/Conv gradients in bf16 (DDP in
    fp32); vlp makes it reduce in fp32. After one optimizer step the losses are DDP's (with bf16
    reduction step 2's ITM loss was off by 2.5e-4); later, bf16 activations amplify the float noise
    of two AdamW implementations (fused under DDP, ZeRO's own), so the comparison loosens to 1e-3, and
    the weights' movement differs by a median 2e-3 of itself (8e-3 with bf16 reduction). Step 2 is
    compared to 2e-5: the two optimizers' fp32 noise (~1e-7) flips the bf16 rounding of a few
    weights, which moved its MLM loss by 3e-6 once the K/V projections were fused - ten times below
    the defect's 2.5e-4."""
    read = runs_io[0]
    ddp, zero2 = read(runs["ddp_bf16"]), read(runs["zero2_bf16"])
    for i, (a, b) in enumerate(zip(ddp, zero2)):
        for key in ("itc", "itm", "mlm", "loss", "temp"):
            rel = (1e-6, 2e-5)[i] if i < 2 else 1e-3
            assert b[key] == pytest.approx(a[key], rel=rel), (key, a, b)
    start, x, y = read(runs["ddp_bf16"], 2), read(runs["ddp_bf16"], STEPS), read(runs["zero2_bf16"], STEPS)
    rel = sorted(
        float((x[k].double() - y[k].double()).norm() / (x[k].double() - start[k].double()).norm())
        for k in x
        if x[k].is_floating_point() and not torch.equal(x[k], start[k])
    )
    assert len(rel) > 50 and rel[len(rel) // 2] < 5e-3, rel[len(rel) // 2]


def test_deepspeed_autocast_marks_no_module_for_bf16_reduction():
    from vlp.config import TrainConfig
    from vlp.train.setup import configure_deepspeed

    ds = {"zero_optimization": {"stage": 2}}
    configure_deepspeed(ds, TrainConfig(precision="bf16"), micro_batch=4)
    assert ds["torch_autocast"] == {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}
    assert ds["communication_data_type"] == "fp32"


@pytest.mark.multiprocess
def test_bf16_keeps_momentum_twins_and_queues_fp32(runs: dict[str, Path], runs_io) -> None:
    read = runs_io[0]
    w = read(runs["zero2_bf16"], STEPS)
    twins = [k for k in w if k.startswith("momentum.")]
    assert twins and all(w[k].dtype == torch.float32 for k in twins)
    assert w["queue.image"].dtype == w["queue.text"].dtype == torch.float32
    assert all(v.dtype == torch.float32 for k, v in w.items() if v.is_floating_point())  # parameters stay fp32 too
    fp32, bf16 = read(runs["zero2"]), read(runs["zero2_bf16"])
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in bf16)
    assert bf16[0]["itc"] == pytest.approx(fp32[0]["itc"], rel=2e-2)  # bf16 autocast, not another model
    assert bf16[0]["itc"] != fp32[0]["itc"]  # ... but it did run in bf16


@pytest.mark.multiprocess
def test_save_state_and_resume_under_zero2(runs: dict[str, Path], runs_io) -> None:
    read = runs_io[0]
    state = runs["zero2"] / "checkpoints" / "step_0000002" / "train_state"
    # each rank's optimizer partition and RNG states as JSON + safetensors; no pickle anywhere
    assert sorted(p.name for p in state.iterdir()) == sorted(
        f"{stem}.{ext}"
        for stem in ("task", "optimizer_rank0", "optimizer_rank1", "rng_rank0", "rng_rank1")
        for ext in ("json", "safetensors")
    )
    assert not [p for p in state.parent.rglob("*") if p.suffix in (".pt", ".pkl", ".bin", ".pth")]
    full, resumed = read(runs["zero2"]), read(runs["resumed"])
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))  # steps 3-4 logged once, after 1-2
    for a, b in zip(full[2:], resumed[2:]):
        for key in ("itc", "itm", "mlm", "loss", "temp", "lr", "alpha"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (key, a, b)
    w_full, w_res = read(runs["zero2"], STEPS), read(runs["resumed"], STEPS)
    for key, a in w_full.items():
        assert torch.allclose(a, w_res[key], rtol=1e-4, atol=1e-6), key
