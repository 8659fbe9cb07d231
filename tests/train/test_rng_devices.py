"""The CUDA generator state in a checkpoint is the current device's only (defect 9): a run saved on a
node with 8 visible GPUs resumes on one with fewer. No GPU needed: ``torch.cuda`` is replaced by a
fake with per-device generator states."""

from __future__ import annotations

import pytest
import torch

from vlp.train.state import load_tree, rng_state, save_tree, set_rng_state


class FakeCuda:
    """``n`` visible devices, device ``current`` selected; device i's generator state is a byte
    tensor filled with 10 + i (distinct per device). The all-device calls raise."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.monkeypatch = monkeypatch
        self.states: dict[int, torch.Tensor] = {}
        self.set_calls: list[int] = []
        for name, fn in (
            ("is_available", lambda: True),
            ("device_count", lambda: len(self.states)),
            ("current_device", lambda: self.current),
            ("get_rng_state", self.get_rng_state),
            ("set_rng_state", self.set_rng_state),
            ("get_rng_state_all", self.all_devices),
            ("set_rng_state_all", self.all_devices),
        ):
            monkeypatch.setattr(torch.cuda, name, fn)

    def node(self, n: int, current: int) -> None:
        self.states = {i: torch.full((16,), 10 + i, dtype=torch.uint8) for i in range(n)}
        self.current = current

    def _index(self, device) -> int:
        if device == "cuda" or (isinstance(device, torch.device) and device.index is None):
            return self.current
        i = device.index if isinstance(device, torch.device) else int(device)
        if i not in self.states:  # what torch does for a device that is not visible
            raise RuntimeError(f"CUDA error: invalid device ordinal {i}")
        return i

    def get_rng_state(self, device="cuda") -> torch.Tensor:
        return self.states[self._index(device)].clone()

    def set_rng_state(self, new_state: torch.Tensor, device="cuda") -> None:
        i = self._index(device)
        self.set_calls.append(i)
        self.states[i] = new_state.clone()

    def all_devices(self, *_a, **_k):
        raise AssertionError("the CUDA state of every visible device was saved or restored")


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return FakeCuda(monkeypatch)


def test_a_state_saved_on_8_gpus_restores_on_a_node_with_one(cuda, tmp_path):
    cuda.node(8, current=3)
    cuda.states[3] = torch.arange(16, dtype=torch.uint8)  # device 3's own state, unlike any other
    saved = rng_state()
    assert isinstance(saved["cuda"], torch.Tensor)  # exactly one state: the current device's
    assert torch.equal(saved["cuda"], torch.arange(16, dtype=torch.uint8))
    save_tree(tmp_path / "rng_rank0", saved)

    cuda.node(1, current=0)
    set_rng_state(load_tree(tmp_path / "rng_rank0"))
    assert cuda.set_calls == [0]  # restored once, into the current device
    assert torch.equal(cuda.states[0], torch.arange(16, dtype=torch.uint8))


def test_a_state_restores_into_the_current_device_only(cuda, tmp_path):
    cuda.node(4, current=2)
    save_tree(tmp_path / "rng", rng_state())  # device 2: filled with 12
    cuda.node(4, current=1)
    set_rng_state(load_tree(tmp_path / "rng"))
    assert cuda.set_calls == [1]
    assert [int(s[0]) for s in cuda.states.values()] == [10, 12, 12, 13]


@pytest.mark.parametrize(
    "saved_devices, node_devices, current, restored", [(8, 8, 3, 13), (8, 1, 0, 10), (2, 8, 5, 10)]
)
def test_an_old_checkpoint_with_every_device_state_restores_the_current_one_or_the_first(
    cuda, saved_devices, node_devices, current, restored
):
    cuda.node(node_devices, current=current)
    old = {**rng_state(), "cuda": [torch.full((16,), 10 + i, dtype=torch.uint8) for i in range(saved_devices)]}
    for i in cuda.states:
        cuda.states[i] = torch.zeros(16, dtype=torch.uint8)
    set_rng_state(old)
    assert cuda.set_calls == [current]
    assert int(cuda.states[current][0]) == restored


def test_without_cuda_no_state_is_saved_and_an_old_empty_list_restores(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    state = rng_state()
    assert state["cuda"] is None
    set_rng_state(state)
    set_rng_state({**state, "cuda": []})  # what an older vlp saved without CUDA
