"""Issue 41, item 7b: a small .pth cannot make its reader allocate what its tensors claim
(vlp.weights.read_state_dict / check_tensor_sizes): a stride-0 or overlapping view, or storages
larger than the file, are refused by name; ordinary views load."""

from __future__ import annotations

import resource
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from tests.albef_fakes import albef_state, stride0_bomb
from vlp.cli import main
from vlp.errors import CheckpointError
from vlp.weights import read_state_dict


def _max_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_a_stride0_view_is_refused_by_key_shape_and_bytes(tmp_path: Path) -> None:
    path = tmp_path / "bomb.pth"
    state = {"temp": torch.tensor(0.07), "image_queue": torch.zeros(16, 8)}
    stride0_bomb(state)
    torch.save({"model": state, "epoch": 3}, path)
    assert path.stat().st_size < 4096  # 640 GB claimed by a file of under 4 KB
    before = _max_rss_kib()
    with pytest.raises(CheckpointError) as e:
        read_state_dict(path)
    assert str(e.value) == (
        f"{path}: refused: tensor 'model.image_queue' of shape (16, 10000000000) (stride (0, 0)) claims "
        "640000000000 bytes, but its storage holds 4: a view with stride 0 or overlapping strides, which a "
        "copy would inflate"
    )
    assert _max_rss_kib() - before < 100_000  # KiB: nothing of that size was allocated


def test_overlapping_strides_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "overlap.pth"
    base = torch.arange(100, dtype=torch.float32)
    torch.save({"w": base.as_strided((91, 10), (1, 1))}, path)  # 910 elements over 100
    with pytest.raises(CheckpointError, match=r"tensor 'w' of shape \(91, 10\) \(stride \(1, 1\)\) claims 3640 bytes"):
        read_state_dict(path)


def test_views_that_fit_their_storage_load(tmp_path: Path) -> None:
    """BERT's position_ids (expand of a size-1 dimension), slices and tied weights sharing one
    storage, a transposed and an empty tensor, in a wrapper with non-tensor entries."""
    big = torch.randn(6, 4)
    sd = {
        "position_ids": torch.arange(512).expand((1, -1)),
        "head": big[:2],
        "tail": big[4:],
        "tied": big,
        "tied_again": big,
        "transposed": torch.randn(3, 5).t(),
        "empty": torch.zeros(0, 7),
    }
    path = tmp_path / "views.pth"
    torch.save({"model": sd, "epoch": 1, "config": {"lr": 1e-4, "layers": [1, 2]}}, path)
    back = read_state_dict(path)
    assert list(back) == list(sd) and all(torch.equal(back[k], sd[k]) for k in sd)


def test_storages_larger_than_the_file_are_refused(tmp_path: Path, monkeypatch) -> None:
    """torch's own reader checks each record's size against what data.pkl claims (below); this bound
    holds whatever the reader: the storages a file's tensors hold cannot exceed the file."""
    path = tmp_path / "small.pth"
    torch.save({"w": torch.ones(2)}, path)
    monkeypatch.setattr(torch, "load", lambda *a, **k: {"a": torch.ones(4), "b": torch.zeros(10**5)})
    with pytest.raises(
        CheckpointError, match=r"tensor 'b' of shape \(100000,\) brings its storages to 400016 bytes, more"
    ):
        read_state_dict(path)


def test_a_storage_claim_beyond_its_record_is_refused_without_allocating(tmp_path: Path) -> None:
    """A torch.save zip whose data.pkl claims a 4 GB storage for a 4-byte record."""
    good, bad = tmp_path / "good.pth", tmp_path / "claim.pth"
    torch.save({"w": torch.ones(1)}, good)
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name.endswith("data.pkl"):  # the storage's numel (BININT1 1 after 'cpu') -> 10**9 (BININT)
                assert data.count(b"cpuq\x06K\x01") == 1, data
                data = data.replace(b"cpuq\x06K\x01", b"cpuq\x06J" + struct.pack("<i", 10**9))
            dst.writestr(name, data)
    before = _max_rss_kib()
    with pytest.raises(CheckpointError, match=rf"^{bad}: not a readable PyTorch weights file \(RuntimeError: .*size"):
        read_state_dict(bad)
    assert _max_rss_kib() - before < 100_000


def test_cli_convert_albef_refuses_the_stride0_bomb_in_one_line(tmp_path: Path, capsys) -> None:
    """The attack: a .pth with a stride-0 image_queue of 16 x 10**10 made `vlp convert albef` try to
    allocate 640 GB (a RuntimeError traceback)."""
    state = albef_state("pretrain")
    stride0_bomb(state)
    src, out = tmp_path / "ALBEF.pth", tmp_path / "out"
    torch.save({"model": state}, src)
    assert main(["convert", "albef", str(src), str(out), "--kind", "pretrain"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"vlp: error: {src}: refused: tensor 'model.image_queue' of shape")
    assert "640000000000 bytes" in err and not out.exists()


def test_a_sparse_tensor_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sparse.pth"
    torch.save({"model": {"s": torch.eye(3).to_sparse()}}, path)
    with pytest.raises(CheckpointError, match=r"tensor 'model\.s' is torch\.sparse_coo, expected a dense \(strided\)"):
        read_state_dict(path)
