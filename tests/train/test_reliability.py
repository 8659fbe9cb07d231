"""Reliability of training runs: verified checkpoints (manifest, fallback past corrupted ones,
atomic publication, pruning), training state without pickle, refusal of malicious .pth files,
skipped non-finite steps, the bad-sample budget and up-front config checks.

In-process ``train()`` on a toy task (a linear model plus a feature queue outside it), CPU only."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F

from vlp.config import FinetuneConfig, FinetuneDataConfig, TrainConfig, VQAConfig
from vlp.errors import CheckpointError, ConfigError, DataError
from vlp.models.momentum import FeatureQueue
from vlp.runs.training.job import check_queue
from vlp.train.checkpoints import prune_checkpoints
from vlp.train.logging import read_metrics
from vlp.train.loop import BAD_SHARE_AFTER, NonFiniteError, train
from vlp.train.state import TRAIN_STATE, load_tree, rng_state, save_tree, set_rng_state
from vlp.train.validation import Validation
from vlp.weights import MANIFEST, find_checkpoint, read_state, read_state_dict, step_checkpoints

BATCH = 8


# ----------------------------------------------------------------------------- toy task


class InfGrad(torch.autograd.Function):
    """Identity whose gradient is infinite (a finite loss with an overflowing backward)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("inf")


class Toy(nn.Module):
    """Linear regression plus a feature queue outside the checkpointed model (train_state/task.*).
    ``nan_at`` / ``inf_grad_at``: 1-based step numbers with a NaN loss / an infinite gradient.
    ``seen[n]``: weights and queue at the forward of step ``n``, i.e. after step ``n - 1``."""

    def __init__(self, nan_at=(), inf_grad_at=()):
        super().__init__()
        self.model = nn.Linear(4, 1)
        self.queue = FeatureQueue(16, {"feat": 4}, seed=7)  # seed 0 would equal the data
        self.nan_at, self.inf_grad_at = set(nan_at), set(inf_grad_at)
        self.hook_steps: list[int] = []
        self.seen: dict[int, dict[str, torch.Tensor]] = {}

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.state_dict().items()}

    def forward(self, batch, step=0):
        n = step + 1
        self.seen[n] = self.snapshot()
        x = batch["x"]
        self.queue.enqueue(torch.arange(len(x)) + BATCH * step, feat=F.normalize(x, dim=1))
        w = InfGrad.apply(self.model.weight) if n in self.inf_grad_at else self.model.weight
        loss = ((F.linear(x, w, self.model.bias).squeeze(1) - batch["y"]) ** 2).mean()
        if n in self.nan_at:
            loss = loss * float("nan")
        return {"loss": loss}

    def batch_report(self, batch):
        return len(batch["input_ids"]), batch.get("bad_samples")

    def after_optimizer_step(self, step, skipped=None):
        if skipped is None or not bool(skipped):  # the test reads the flag; the loop never does
            self.hook_steps.append(step)


def loader(bad=None):
    """4 batches of 8; ``bad[i]``: the ``bad_samples`` count of batch ``i``."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4 * BATCH, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    batches = [
        {"x": x[i : i + BATCH], "y": y[i : i + BATCH], "input_ids": x[i : i + BATCH]}
        for i in range(0, 4 * BATCH, BATCH)
    ]
    if bad is not None:
        for b, n in zip(batches, bad):
            b["bad_samples"] = n
    return batches


def cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"steps": 6, "lr": 0.05, "warmup_steps": 0, "log_every": 1, "progress": False, **kw})


def step_dir(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:07d}"


def flip_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> tuple[int, int]:
    """Cut ``path`` to half its size; returns (new size, old size)."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return len(data) // 2, len(data)


ALL_FILES = {
    "model.safetensors",
    "state.json",
    *(f"{TRAIN_STATE}/{stem}.{ext}" for stem in ("task", "optimizer", "rng_rank0") for ext in ("json", "safetensors")),
}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """An uninterrupted 6-step run checkpointed every 2 steps (step_2, step_4, step_6 = the end)
    and its final task state. Tests copy the run directory before changing it."""
    run = tmp_path_factory.mktemp("base") / "run"
    torch.manual_seed(0)
    task = Toy()
    train(task, loader(), cfg(ckpt_every=2, save_state=True), run)
    assert task.hook_steps == [1, 2, 3, 4, 5, 6]
    return run, task.snapshot()


@pytest.fixture
def run_copy(base_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(base_run[0], run)
    return run


# ----------------------------------------------------------------------------- 1. checkpoint integrity


def test_every_checkpoint_has_a_manifest_of_sizes_and_sha256(base_run):
    run = base_run[0]
    assert [p.name for p in step_checkpoints(run)] == ["step_0000002", "step_0000004", "step_0000006"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_0000002", "step_0000004", "step_0000006"]
    for ckpt in step_checkpoints(run):
        manifest = json.loads((ckpt / MANIFEST).read_text())
        assert manifest["format"] == 1
        on_disk = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()} - {MANIFEST}
        assert set(manifest["files"]) == on_disk == ALL_FILES
        for rel, meta in manifest["files"].items():
            data = (ckpt / rel).read_bytes()
            assert meta == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, (ckpt, rel)
        assert read_state(ckpt)["step"] == int(ckpt.name[len("step_") :])
        assert find_checkpoint(ckpt) == ckpt


def test_a_corrupted_newest_checkpoint_is_reported_and_the_previous_one_used(run_copy, capsys):
    newest = step_dir(run_copy, 6)
    weights = newest / "model.safetensors"
    before = {k: v.clone() for k, v in load_file(str(weights)).items()}
    flip_byte(weights, weights.stat().st_size - 10)  # inside the tensor data, not the header
    # safetensors alone would not notice: the file still loads, with a different weight
    after = load_file(str(weights))
    assert before.keys() == after.keys() and not all(torch.equal(before[k], after[k]) for k in before)
    capsys.readouterr()

    assert find_checkpoint(run_copy) == step_dir(run_copy, 4)
    err = capsys.readouterr().err
    assert err == (
        f"warning: checkpoint {newest}: model.safetensors does not match its SHA-256 in manifest.json "
        "(changed since it was saved, or corrupted); trying the previous checkpoint\n"
    )
    with pytest.raises(CheckpointError) as e:
        find_checkpoint(newest)
    assert (
        str(e.value) == f"checkpoint {newest}: model.safetensors does not match its SHA-256 in manifest.json "
        "(changed since it was saved, or corrupted)"
    )


def test_a_truncated_train_state_falls_back_and_resume_continues_exactly(base_run, run_copy, capsys):
    _, final = base_run
    newest = step_dir(run_copy, 6)
    new, old = truncate(newest / TRAIN_STATE / "optimizer.safetensors")
    capsys.readouterr()
    assert find_checkpoint(run_copy) == step_dir(run_copy, 4)
    problem = (
        f"checkpoint {newest}: {TRAIN_STATE}/optimizer.safetensors is {new} bytes, the manifest says {old} (truncated)"
    )
    assert capsys.readouterr().err == f"warning: {problem}; trying the previous checkpoint\n"
    with pytest.raises(CheckpointError) as e:
        find_checkpoint(newest)
    assert str(e.value) == problem

    rows = read_metrics(run_copy / "metrics.jsonl")
    torch.manual_seed(123)  # another fresh model: everything must come from step_4
    resumed = Toy()
    train(resumed, loader(), cfg(ckpt_every=2, resume="auto"), run_copy)
    out = capsys.readouterr()
    assert f"resumed from {step_dir(run_copy, 4)} at step 4 of 6\n" in out.out
    aside = run_copy / "checkpoints" / "superseded"
    assert f"moved 1 checkpoint(s) of the steps run again (or corrupted) to {aside}: step_0000006" in out.out
    assert (aside / "step_0000006" / TRAIN_STATE / "optimizer.safetensors").stat().st_size == new  # kept, not deleted
    assert out.err.count("warning:") == 1 and problem in out.err
    assert resumed.hook_steps == [5, 6]
    end = resumed.snapshot()
    assert end.keys() == final.keys()
    for k in final:  # weights and the queue outside the model: bit for bit the uninterrupted run's
        assert torch.equal(end[k], final[k]), k
    again = read_metrics(run_copy / "metrics.jsonl")
    assert [r["step"] for r in again] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in again] == [r["loss"] for r in rows]
    assert find_checkpoint(run_copy) == newest  # rewritten, valid again
    assert capsys.readouterr().err == ""


def test_a_leftover_staging_folder_is_ignored(run_copy, capsys):
    """A SIGKILL while writing leaves ``step_N.tmp/`` (no manifest, partial files); a crash while
    replacing a folder leaves ``step_N.old/``: neither is a checkpoint."""
    for name in ("step_0000099.tmp", "step_0000098.old"):
        half = run_copy / "checkpoints" / name
        half.mkdir()
        data = (step_dir(run_copy, 6) / "model.safetensors").read_bytes()
        (half / "model.safetensors").write_bytes(data[: len(data) // 2])
    capsys.readouterr()
    assert [p.name for p in step_checkpoints(run_copy)] == ["step_0000002", "step_0000004", "step_0000006"]
    assert find_checkpoint(run_copy) == step_dir(run_copy, 6)
    assert capsys.readouterr().err == ""
    assert prune_checkpoints(run_copy, 1) == [step_dir(run_copy, 2), step_dir(run_copy, 4)]
    assert sorted(p.name for p in (run_copy / "checkpoints").iterdir()) == [
        "step_0000006",
        "step_0000098.old",
        "step_0000099.tmp",
    ]


def test_no_valid_checkpoint_lists_each_problem(run_copy, capsys):
    c2, c4, c6 = (step_dir(run_copy, s) for s in (2, 4, 6))
    weights = c6 / "model.safetensors"
    flip_byte(weights, weights.stat().st_size - 10)
    new, old = truncate(c4 / "state.json")
    (c2 / TRAIN_STATE / "optimizer.json").unlink()
    capsys.readouterr()
    problems = [
        f"checkpoint {c6}: model.safetensors does not match its SHA-256 in manifest.json "
        "(changed since it was saved, or corrupted)",
        f"checkpoint {c4}: state.json is {new} bytes, the manifest says {old} (truncated)",
        f"checkpoint {c2}: {TRAIN_STATE}/optimizer.json is missing",
    ]
    with pytest.raises(CheckpointError) as e:
        find_checkpoint(run_copy)
    assert str(e.value) == f"{run_copy}: no valid checkpoint ({'; '.join(problems)})"
    assert capsys.readouterr().err == "".join(f"warning: {p}; trying the previous checkpoint\n" for p in problems)


def test_keep_last_leaves_the_newest_step_checkpoints_and_best(tmp_path, capsys):
    val = Validation(evaluate=lambda task, step: {"score": float(-step)}, select="score", every=2)  # best: step 2
    train(Toy(), loader(), cfg(ckpt_every=1, keep_last=2), tmp_path, validation=val)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best", "step_0000005", "step_0000006"]
    best = find_checkpoint(tmp_path / "checkpoints" / "best")
    assert read_state(best)["step"] == 2 and read_state(best)["best"] == {"metric": "score", "value": -2.0, "step": 2}
    assert find_checkpoint(tmp_path) == step_dir(tmp_path, 6)
    assert "validation at step 6: score -6.00 (best -2.00 at step 2)" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 2. no pickle


def test_checkpoints_hold_only_json_and_safetensors(base_run):
    files = [p for p in (base_run[0] / "checkpoints").rglob("*") if p.is_file()]
    assert len(files) == 3 * (len(ALL_FILES) + 1)
    for p in files:
        assert p.suffix in (".json", ".safetensors"), p
        if p.suffix == ".json":
            json.loads(p.read_text())
        else:
            load_file(str(p))


def assert_same(a, b, where="root"):
    """Equal values of equal types, all the way down (tensors: dtype, shape and bits)."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert type(k) is type(next(kk for kk in b if kk == k)), (where, k)
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


def test_optimizer_state_round_trips_exactly(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    opt = torch.optim.AdamW(
        [
            {"params": net[0].parameters()},
            {"params": net[1].parameters(), "lr": 0.01, "weight_decay": 0.0, "betas": (0.8, 0.95)},
        ],
        lr=0.1,
    )
    for _ in range(3):
        net(torch.randn(5, 3)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1, 2, 3] and sd["param_groups"][1]["betas"] == (0.8, 0.95)
    assert any(v is None for g in sd["param_groups"] for v in g.values())  # e.g. foreach / fused
    files = save_tree(tmp_path / "optimizer", sd)
    assert files == [tmp_path / "optimizer.json", tmp_path / "optimizer.safetensors"]
    back = load_tree(tmp_path / "optimizer")
    assert_same(sd, back)
    assert torch.equal(back["state"][0]["step"], torch.tensor(3.0))

    # loaded into a fresh optimizer, the next step is the original's, bit for bit
    twin = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    twin.load_state_dict(net.state_dict())
    opt2 = torch.optim.AdamW([{"params": twin[0].parameters()}, {"params": twin[1].parameters()}], lr=0.5)
    opt2.load_state_dict(back)
    x = torch.randn(5, 3)
    for m, o in ((net, opt), (twin, opt2)):
        m(x).square().mean().backward()
        o.step()
    for p, q in zip(net.parameters(), twin.parameters()):
        assert torch.equal(p, q)


def test_structures_round_trip_with_their_types(tmp_path):
    tree = {
        "ints": {1: "a", "1": "b", -3: (None, True, 2.5)},
        "dunder": {"__tensor__": "t0", "__tuple__": [1]},
        "empty": ((), [], {}),
        "special": [float("nan"), float("inf"), -float("inf")],
        "nested": [(torch.arange(3), {"x": torch.zeros(0, 2)}), np.arange(4, dtype=np.uint32)],
        "np": np.float64(0.25),
        "bf16": torch.ones(2, dtype=torch.bfloat16),
        "scalar": torch.tensor(7),
    }
    save_tree(tmp_path / "t", tree)
    json.loads((tmp_path / "t.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    back = load_tree(tmp_path / "t")
    assert back["np"] == 0.25 and type(back["np"]) is float  # numpy scalars come back as Python numbers
    tree["np"] = 0.25
    assert_same(tree, back)


def test_rng_states_round_trip_so_the_next_draws_are_equal(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.random(), np.random.rand(), torch.rand(1)  # somewhere inside the streams
    save_tree(tmp_path / "rng", rng_state())

    def draws():
        return (
            random.random(),
            random.gauss(0, 1),
            np.random.rand(3).tolist(),
            torch.rand(3).tolist(),
            torch.randint(0, 1000, (4,)).tolist(),
        )

    first = draws()
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    assert draws() != first
    set_rng_state(load_tree(tmp_path / "rng"))
    assert draws() == first


def test_unsupported_objects_are_refused_naming_their_path(tmp_path):
    with pytest.raises(TypeError) as e:
        save_tree(tmp_path / "state", {"a": [1, {"b": (2, object())}]})
    assert str(e.value) == "training state state.a[1].b[1]: object cannot be saved as JSON/tensors"
    with pytest.raises(TypeError) as e:
        save_tree(tmp_path / "state", {"opt": {3: {"s": {1, 2}}}})
    assert str(e.value) == "training state state.opt[3].s: set cannot be saved as JSON/tensors"
    with pytest.raises(TypeError) as e:
        save_tree(tmp_path / "state", {"x": {(1, 2): 3}})
    assert str(e.value) == "training state state.x: key (1, 2) of type tuple cannot be saved"
    with pytest.raises(TypeError, match=r"^training state state: key True of type bool cannot be saved$"):
        save_tree(tmp_path / "state", {True: 1})
    assert list(tmp_path.iterdir()) == []  # nothing written


# ----------------------------------------------------------------------------- 3. malicious pickle


class Evil:
    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return os.system, (f"touch {self.target}",)


def test_a_pth_that_needs_arbitrary_unpickling_is_refused(tmp_path):
    pwned = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    torch.save({"weight": torch.ones(2), "payload": Evil(pwned)}, path)
    with pytest.raises(CheckpointError) as e:
        read_state_dict(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: refused: loading it would need arbitrary unpickling (it references ")
    assert "system" in msg and "safetensors" in msg
    assert not pwned.exists()


@pytest.mark.parametrize(
    "payload, raised",  # data.pkl streams that made torch's unpickler raise past the old except clause
    [
        (b"\x80\x02.", "IndexError"),
        (b"\x80\x02}q\x00h\x05.", "KeyError"),
        (b"\x80\x02X\x02\x00\x00\x00\xff\xfeq\x00.", "Unicode"),
        (b"\x80\x02garbage\x00\x01", "pickle opcode 103 ('g')"),  # not "objects other than tensors"
    ],
)
def test_a_malformed_data_pkl_is_one_checkpoint_error_not_a_traceback(tmp_path, payload, raised):
    """Issue 41, item 8: a .pth zip whose data.pkl is malformed."""
    import zipfile

    good, bad = tmp_path / "good.pth", tmp_path / "bad.pth"
    torch.save({"weight": torch.ones(2)}, good)
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for name in src.namelist():
            dst.writestr(name, payload if name.endswith("data.pkl") else src.read(name))
    with pytest.raises(CheckpointError) as e:
        read_state_dict(bad)
    assert str(e.value).startswith(f"{bad}: not a readable PyTorch weights file (") and raised in str(e.value)
    from vlp.cli import main  # vlp convert albef reads it the same way: one line, exit status 2

    assert main(["convert", "albef", str(bad), str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_a_plain_tensor_pth_loads(tmp_path):
    sd = {"layer.weight": torch.randn(3, 2), "layer.bias": torch.arange(3, dtype=torch.int64)}
    torch.save(sd, tmp_path / "plain.pth")
    torch.save({"model": sd, "epoch": 3}, tmp_path / "wrapped.pth")  # ALBEF's {"model": ...} checkpoints
    for name in ("plain.pth", "wrapped.pth"):
        back = read_state_dict(tmp_path / name)
        assert list(back) == list(sd) and all(torch.equal(back[k], sd[k]) for k in sd)


# ----------------------------------------------------------------------------- 4. non-finite steps


@pytest.mark.parametrize("kind", ["nan_loss", "inf_grad"])
def test_a_non_finite_step_is_skipped(kind, tmp_path, capsys):
    torch.manual_seed(0)
    task = Toy(**{"nan_at" if kind == "nan_loss" else "inf_grad_at": {3}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(task, loader(), cfg(steps=5, log_every=2), tmp_path)
    # the report reads the losses without torch's "Converting a tensor with requires_grad=True" warning
    assert [str(w.message) for w in caught if "requires_grad" in str(w.message)] == []
    # step 3 left no trace: weights and queue after it are those before it; other steps moved them
    assert all(torch.equal(task.seen[4][k], task.seen[3][k]) for k in task.seen[3])
    assert not torch.equal(task.seen[3]["model.weight"], task.seen[2]["model.weight"])
    assert not torch.equal(task.seen[5]["model.weight"], task.seen[4]["model.weight"])
    assert not torch.equal(task.seen[3]["queue.feat"], task.seen[2]["queue.feat"])
    assert task.hook_steps == [1, 2, 4, 5]
    opt = load_tree(step_dir(tmp_path, 5) / TRAIN_STATE / "optimizer")
    assert torch.equal(opt["state"][0]["step"], torch.tensor(4.0))  # 5 steps, 4 optimizer steps
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [2, 4, 5]
    assert [r.get("skipped_steps") for r in rows] == [None, 1, None]
    assert all(math.isfinite(r["loss"]) for r in rows)
    err = capsys.readouterr().err
    reported = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(reported) == 1
    assert reported[0].startswith("warning: step 3: non-finite loss or gradient (loss [")
    assert reported[0].endswith("); step skipped (1 in a row; the run stops at 5)")
    if kind == "nan_loss":
        assert "(loss [nan], gradient norm nan)" in reported[0]
    else:
        assert "gradient norm inf)" in reported[0] and "loss [nan]" not in reported[0]


def test_consecutive_non_finite_steps_stop_the_run_with_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    task = Toy(nan_at={3, 4, 5, 6})
    with pytest.raises(NonFiniteError) as e:
        train(task, loader(), cfg(steps=6, max_nonfinite_steps=2), tmp_path)
    ckpt = step_dir(tmp_path, 4)
    assert str(e.value) == (
        "step 4: non-finite loss or gradient (loss [nan], gradient norm nan); step skipped, 2 in a row "
        f"(train.max_nonfinite_steps); checkpoint {ckpt} holds the last good state (lower train.lr, set "
        "train.grad_clip or train.precision=fp32, naming them in train.resume_allow_changes; resume: run the "
        "same command with --resume auto (or train.resume=auto))"
    )
    assert max(task.seen) == 4 and task.hook_steps == [1, 2]
    assert [p.name for p in step_checkpoints(tmp_path)] == ["step_0000004"]
    assert find_checkpoint(tmp_path, require=[f"{TRAIN_STATE}/rng_rank0.json"]) == ckpt
    saved = load_file(str(ckpt / "model.safetensors"))
    after_step_2 = task.seen[3]
    assert torch.equal(saved["weight"], after_step_2["model.weight"]) and torch.equal(
        saved["bias"], after_step_2["model.bias"]
    )
    state = load_tree(ckpt / TRAIN_STATE / "task")
    assert all(torch.equal(state[k], after_step_2[k]) for k in ("queue.feat", "queue.ids", "queue.ptr"))
    assert torch.equal(load_tree(ckpt / TRAIN_STATE / "optimizer")["state"][0]["step"], torch.tensor(2.0))
    assert read_state(ckpt)["step"] == 4


def test_feature_queue_discard_step_restores_the_snapshot_exactly():
    q = FeatureQueue(5, {"img": 3, "txt": 2}, seed=1)

    def feats(n, base):
        return {"img": torch.randn(n, 3), "txt": torch.randn(n, 2)}, torch.arange(base, base + n)

    f, ids = feats(2, 0)
    q.enqueue(ids, **f)
    snap = {k: v.clone() for k, v in q.state_dict().items()}
    assert snap["ptr"].tolist() == [2]
    q.begin_step()
    f, ids = feats(3, 10)
    q.enqueue(ids, **f)  # slots 2, 3, 4
    f, ids = feats(4, 20)
    q.enqueue(ids, **f)  # slots 0, 1, 2, 3: wraps around, overwrites 2 and 3 again
    assert q.ptr.tolist() == [4] and q.ids.tolist() == [20, 21, 22, 23, 12]
    q.discard_step()
    for k, v in q.state_dict().items():
        assert torch.equal(v, snap[k]), k
    assert q.ids.tolist() == [0, 1, -100, -100, -100]

    # without begin_step nothing is recorded: discard_step undoes nothing
    fresh = FeatureQueue(5, {"img": 3, "txt": 2}, seed=1)
    f, ids = feats(3, 30)
    fresh.enqueue(ids, **f)
    written = {k: v.clone() for k, v in fresh.state_dict().items()}
    fresh.discard_step()
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, written[k]), k
    assert fresh.ptr.tolist() == [3]


# ----------------------------------------------------------------------------- 5. bad samples


def test_bad_samples_are_summed_per_window_and_judged_only_from_bad_share_after(tmp_path):
    assert 8 * BATCH < BAD_SHARE_AFTER  # 12 of 64 bad (19%) is above the limit but too few samples to judge
    train(Toy(), loader(bad=[0, 1, 2, 3]), cfg(steps=8, log_every=3), tmp_path, max_bad_fraction=0.1)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["bad_samples"]) for r in rows] == [(3, 0 + 1 + 2), (6, 3 + 0 + 1), (8, 2 + 3)]


def test_a_few_bad_samples_do_not_stop_the_run(tmp_path):
    train(Toy(), loader(bad=[1, 0, 0, 0]), cfg(steps=20, log_every=5), tmp_path, max_bad_fraction=0.1)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["bad_samples"]) for r in rows] == [(5, 2), (10, 1), (15, 1), (20, 1)]
    assert find_checkpoint(tmp_path) == step_dir(tmp_path, 20)


def test_too_many_bad_samples_stop_the_run_after_a_checkpoint(tmp_path):
    task = Toy()
    with pytest.raises(DataError) as e:
        train(task, loader(bad=[4, 4, 4, 4]), cfg(steps=20), tmp_path, max_bad_fraction=0.1)
    stop = -(-BAD_SHARE_AFTER // BATCH)  # the first log point with >= BAD_SHARE_AFTER samples: 13
    seen = stop * BATCH
    assert str(e.value) == (
        f"{seen // 2} of the {seen} samples loaded so far were bad (50.0%), more than "
        "data.max_bad_fraction=0.1; `vlp data check` lists them; the run stopped after step "
        f"{stop} of 20; checkpoint {step_dir(tmp_path, stop)}. Resume: run the same command with --resume auto "
        "(or train.resume=auto)"
    )
    assert max(task.seen) == stop
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, stop + 1)) and all(r["bad_samples"] == 4 for r in rows)
    assert [p.name for p in step_checkpoints(tmp_path)] == [f"step_{stop:07d}"]
    assert find_checkpoint(tmp_path, require=[f"{TRAIN_STATE}/rng_rank0.json"]) == step_dir(tmp_path, stop)
    assert read_state(step_dir(tmp_path, stop))["step"] == stop


def test_a_resume_carries_the_samples_seen_and_the_bad_ones(tmp_path):
    """The bad-sample share is judged over the whole run: a resume starts from the checkpoint's
    counts (state.json ``samples``), it neither resets them nor counts them again."""
    assert 12 * BATCH < BAD_SHARE_AFTER <= 13 * BATCH
    train(Toy(), loader(bad=[4, 4, 4, 4]), cfg(steps=12, ckpt_every=6), tmp_path, max_bad_fraction=0.1)
    assert read_state(step_dir(tmp_path, 12))["samples"] == {"seen": 12 * BATCH, "bad": 12 * 4}
    assert read_state(step_dir(tmp_path, 6))["samples"] == {"seen": 6 * BATCH, "bad": 6 * 4}
    with pytest.raises(DataError, match=r"^52 of the 104 samples loaded so far were bad \(50.0%\)"):
        train(Toy(), loader(bad=[4, 4, 4, 4]), cfg(steps=20, resume="auto"), tmp_path, max_bad_fraction=0.1)
    assert read_state(step_dir(tmp_path, 13))["samples"] == {"seen": 13 * BATCH, "bad": 13 * 4}


# ----------------------------------------------------------------------------- 6. config checks


def test_check_queue_counts_every_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    check_queue(16, 8)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError) as e:
        check_queue(16, 8)
    assert str(e.value) == (
        "config keys 'model.queue_size'/'data.batch_size': a queue of 16 is smaller than the global batch "
        "(8 x 4 processes = 32) it receives each step; raise model.queue_size (ALBEF: 65536) or set it to 0 "
        "(in-batch negatives only)"
    )
    check_queue(32, 8)  # exactly the global batch
    check_queue(0, 64)  # queue disabled
    with pytest.raises(ConfigError, match=r"^config keys 'model.queue_size'/'data.eval_batch_size': a queue of 31 "):
        check_queue(31, 8, key="data.eval_batch_size")
    monkeypatch.delenv("WORLD_SIZE")
    check_queue(0, 64)
    with pytest.raises(ConfigError, match=r"\(64 x 1 processes = 64\)"):
        check_queue(16, 64)


def test_vqa_k_test_above_the_answer_list_is_refused_before_any_work(tmp_path):
    from vlp.runs.training.finetune import run_finetune_vqa

    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps(["yes", "no", "2"]))
    out = tmp_path / "out"
    cfg_ = FinetuneConfig(
        task="vqa",
        output_dir=str(out),
        pretrained=str(tmp_path / "no_such_checkpoint"),
        data=FinetuneDataConfig(train=[str(tmp_path / "no_such_questions.json")], answer_list=str(answers)),
        vqa=VQAConfig(k_test=4),
    )
    with pytest.raises(ConfigError) as e:
        run_finetune_vqa(cfg_)
    assert str(e.value) == (
        f"config key 'vqa.k_test': 4 candidates per question, but the answer list {answers} has 3; set vqa.k_test <= 3"
    )
    assert not out.exists()
