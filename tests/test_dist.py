"""Every collective reaches ``torch.distributed`` on the run's device (issue 17, defect 1).

NCCL refuses tensors that are not on the process's GPU, and a CPU machine cannot show that: gloo
takes anything. So the run's device here is ``meta`` - a device that is not the CPU - in a fake
two-rank world whose ``torch.distributed`` records the device of every tensor it is given. A
tensor built on the default device (the CPU) instead of the run's is caught. A second test makes
sure no module outside ``vlp/dist.py`` calls ``torch.distributed`` collectives itself, so that the
first covers them all.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import vlp.dist as vdist
from vlp.config import MultiplierConfig
from vlp.losses.ltd import LagrangeMultiplier
from vlp.train.step_stats import StepStats

ROOT = Path(__file__).parents[1]
META = torch.device("meta")
COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "isend",
    "irecv",
    "send",
    "recv",
    "batch_isend_irecv",
    "P2POp",
    "barrier",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
}


class FakeWorld:
    """Two ranks (this is rank 0): collectives record the devices of their tensors and leave the
    values alone (all_gather copies the input into every slot)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.devices: list[tuple[str, torch.device]] = []
        m = monkeypatch
        m.setattr(dist, "is_available", lambda: True)
        m.setattr(dist, "is_initialized", lambda: True)
        m.setattr(dist, "get_world_size", lambda group=None: 2)
        m.setattr(dist, "get_rank", lambda group=None: 0)
        m.setattr(dist, "all_reduce", self._record("all_reduce"))
        m.setattr(dist, "barrier", lambda *a, **k: self.devices.append(("barrier", META)))

        def all_gather(out, x, group=None, async_op=False):
            self.devices += [("all_gather", t.device) for t in [*out, x]]
            for o in out:
                o.copy_(x)

        m.setattr(dist, "all_gather", all_gather)

        def batch_isend_irecv(ops):
            self.devices += [("p2p", op.tensor.device) for op in ops]
            return []

        class P2POp:
            def __init__(self, op, tensor, peer):
                self.op, self.tensor, self.peer = op, tensor, peer

        m.setattr(dist, "P2POp", P2POp)
        m.setattr(dist, "batch_isend_irecv", batch_isend_irecv)

    def _record(self, name):
        def op(t, *args, **kwargs):
            self.devices.append((name, t.device))

        return op

    def off_device(self) -> list[tuple[str, torch.device]]:
        return [(name, d) for name, d in self.devices if d != META]


@pytest.fixture
def world(monkeypatch) -> FakeWorld:
    return FakeWorld(monkeypatch)


def test_every_collective_of_vlp_dist_stays_on_the_run_device(world: FakeWorld) -> None:
    x = torch.empty(3, 4, device=META)
    assert vdist.all_gather_nograd(x).shape == (6, 4)
    assert vdist.gather_rows(torch.empty(2, 4, device=META), [0, 2, 3]).shape == (3, 4)
    need = [torch.tensor([0, 2]), torch.tensor([1])]
    assert vdist.fetch_rows(torch.empty(2, 4, device=META), [0, 2, 3], need).shape == (2, 4)
    vdist.all_reduce_(torch.empty(2, device=META), "max")
    flags = vdist.any_over_ranks([True, torch.tensor(False)], device=META)
    means = vdist.mean_over_ranks({"loss": 1.5, "itc": torch.tensor(0.5), "mlm": float("nan")}, device=META)
    vdist.barrier()
    assert flags.device == META and flags.dtype == torch.bool and flags.shape == (2,)
    assert sorted(means) == ["itc", "loss", "mlm"] and all(v.device == META for v in means.values())
    kinds = {name for name, _ in world.devices}
    assert {"all_gather", "all_reduce", "p2p", "barrier"} <= kinds
    assert world.off_device() == []


def test_the_lagrange_multiplier_averages_its_gradient_on_the_run_device(world: FakeWorld) -> None:
    lam = LagrangeMultiplier(MultiplierConfig()).to(META)
    lam.lam.grad = torch.empty(1, device=META)
    lam.step(skipped=torch.zeros((), dtype=torch.bool, device=META))
    assert [name for name, _ in world.devices] == ["all_reduce"]
    assert world.off_device() == []


def test_step_statistics_reduce_on_the_run_device(world: FakeWorld, monkeypatch) -> None:
    stats = StepStats(META, max_nonfinite=3, processes=2)
    loss = torch.empty((), device=META)
    skipped = stats.skip(vdist.any_over_ranks([torch.zeros((), dtype=torch.bool, device=META)], device=META)[0])
    stats.add_bad_samples(torch.zeros((), dtype=torch.long, device=META))
    stats.add_step(1, [{"loss": loss, "itc": loss, "alpha": torch.tensor(0.4)}], torch.empty((), device=META), skipped)
    # a meta tensor has no values to read: the one read of the window returns zeros
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: [0.0] * t.numel())
    window = stats.read()
    assert window.skipped == [] and window.bad_samples == 0
    assert world.off_device() == []
    assert [name for name, _ in world.devices] == ["all_reduce", "all_reduce"]  # the skip flag, the window


def _collective_calls(path: Path) -> list[str]:
    """``torch.distributed.X(...)`` / ``dist.X(...)`` calls of a collective X in a source file."""
    tree = ast.parse(path.read_text())
    where = path.relative_to(ROOT) if ROOT in path.parents else path.name
    aliases = {"torch.distributed"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == "torch.distributed" and a.asname}
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "torch"
            and any(a.name == "distributed" for a in node.names)
        ):
            aliases |= {a.asname or "distributed" for a in node.names if a.name == "distributed"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in COLLECTIVES:
            owner = ast.unparse(node.func.value)
            if owner in aliases:
                found.append(f"{where}:{node.lineno}: {owner}.{node.func.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            found += [
                f"{where}:{node.lineno}: from torch.distributed import {a.name}"
                for a in node.names
                if a.name in COLLECTIVES
            ]
    return found


def test_no_collective_outside_vlp_dist() -> None:
    offenders = [
        c for p in sorted((ROOT / "vlp").rglob("*.py")) if p != ROOT / "vlp" / "dist.py" for c in _collective_calls(p)
    ]
    assert offenders == [], "collectives belong in vlp/dist.py (which keeps them on the run's device):\n" + "\n".join(
        offenders
    )


def test_the_scanner_finds_a_direct_collective(tmp_path: Path) -> None:
    bad = tmp_path / "probe.py"
    bad.write_text(
        "import torch\nimport torch.distributed as d\n\ndef f(t):\n    torch.distributed.all_reduce(t)\n"
        "    d.barrier()\n"
    )
    assert sorted(c.split(": ", 1)[1] for c in _collective_calls(bad)) == ["d.barrier", "torch.distributed.all_reduce"]


def test_gathering_with_gradients_says_nothing_on_a_real_group(tmp_path) -> None:
    """Issue 31, item 7: torch's deprecation warning of the differentiable all_gather is not printed
    many times per multi-process run; the gradient still reaches every row."""
    import warnings

    import torch.distributed as tdist

    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        x = torch.arange(6.0).reshape(3, 2).requires_grad_()
        with vdist.collectives_on_one_process(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = vdist.all_gather_with_grad(x)
            y.sum().backward()
        assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]
        assert torch.equal(y.detach(), x.detach()) and torch.equal(x.grad, torch.ones(3, 2))
    finally:
        tdist.destroy_process_group()


#: the prelude of the probes below: ``gloo_threads()``, the names of this process's gloo threads
GLOO_THREADS = """
import os, sys
def gloo_threads():
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    return ",".join(n for n in names if "gloo" in n)
"""

PROBE = (
    GLOO_THREADS
    + """
import torch, torch.distributed as dist
import vlp.dist as vd
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
with vd.collectives_on_one_process():
    x = torch.arange(6.0).reshape(3, 2).requires_grad_()
    vd.all_gather_with_grad(x).sum().backward()
    vd.all_reduce_(x.detach().clone())
    vd.all_gather_nograd(x.detach())
dist.destroy_process_group()
print(gloo_threads())
"""
)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the thread names from /proc (Linux)")
def test_destroying_the_group_after_gathering_with_gradients_stops_its_threads(tmp_path) -> None:
    """A process group outlived ``destroy_process_group`` when vlp gathered with gradients after it
    was made (torch's differentiable all_gather holds the group as a default argument), and its gloo
    threads were torn down at interpreter exit in any order: "terminate called without an active
    exception", exit -6, about once in 20 two-rank runs (the gloo2 section of make gpu-check in CI)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "rendezvous")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", f"gloo threads still running after destroy_process_group: {done.stdout}"


EXIT_PROBE = (
    GLOO_THREADS
    + """
import atexit
atexit.register(lambda: print("at exit:", gloo_threads(), flush=True))  # LIFO: after vlp's own hook
import torch, torch.distributed as dist
import vlp.dist as vd
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
kind = sys.argv[2]
if kind == "default":
    def barrier(group=dist.GroupMember.WORLD, async_op=False): pass
elif kind == "keyword":
    def barrier(*, group=dist.group.WORLD): pass
elif kind == "deepspeed":  # accelerate imports DeepSpeed here, after the group; it binds the group
    from accelerate.utils import extract_model_from_parallel
    extract_model_from_parallel(torch.nn.Linear(1, 1))
if kind == "destroyed":
    def barrier(group=dist.GroupMember.WORLD): pass
    vd.destroy_group()
    print("destroyed:", gloo_threads(), flush=True)
"""
)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the thread names from /proc (Linux)")
@pytest.mark.parametrize("kind", ["default", "keyword", "deepspeed", "destroyed"])
def test_no_library_keeps_the_group_alive_past_its_destruction(kind, tmp_path) -> None:
    """A library imported after the group was made and binding it as a function default (DeepSpeed's
    ``TorchBackend.barrier``, imported by accelerate's ``unwrap_model`` in every multi-process run)
    kept it - and its gloo threads - alive after ``destroy_process_group``; they were torn down at
    interpreter exit in any order: "terminate called without an active exception", exit -6 (rank 1
    of tests/train/test_lambda_ranks.py in CI). Destroying the group, explicitly with
    :func:`vlp.dist.destroy_group` or at exit, now lets go of every such binding."""
    import subprocess
    import sys

    if kind == "deepspeed":
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed: pip install -e '.[deepspeed]'")
    done = subprocess.run(
        [sys.executable, "-c", EXIT_PROBE, str(tmp_path / "rendezvous"), kind],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = dict(line.split(":", 1) for line in done.stdout.strip().splitlines())
    expected = {"destroyed": "", "at exit": ""} if kind == "destroyed" else {"at exit": ""}
    assert {k: v.strip() for k, v in seen.items()} == expected, f"gloo threads outlived the group: {seen}"
