"""``vlp index`` (vlp.search.build, .partial, .index_format, .photo_folder): the rows are
``encode_image`` of every readable file in sorted order, bad files are skipped and named, the
features are memory-mapped, a killed run resumes to the same index bit for bit and refuses other
settings, and bad input is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.search.conftest import BAD, GOOD, index_argv, kill_after, tiny_run
from vlp import VLPModel
from vlp.cli import main
from vlp.errors import DataError
from vlp.search import FORMAT, ModelEmbedder, open_index


def test_the_rows_are_encode_image_of_every_readable_file(index: Path, run: Path, photos: Path) -> None:
    opened = open_index(index)
    assert opened.paths == GOOD  # sorted relative paths, nested folders, any case of extension
    expected = VLPModel.from_pretrained(run, device="cpu").encode_image([str(photos / p) for p in GOOD])
    np.testing.assert_allclose(opened.features, expected.numpy(), atol=1e-5, rtol=0)
    meta = opened.meta
    assert (meta["format"], meta["count"], meta["embed_dim"], meta["files"], meta["ignored"]) == (FORMAT, 7, 16, 9, 1)
    assert meta["root"] == str(photos) and meta["checkpoint"] == str(run / "checkpoints" / "step_0000002")
    assert meta["embedder"]["step"] == 2 and meta["embedder"]["architecture"] == "ALBEF"
    assert meta["options"] == {"batch_size": 2, "chunk_size": 3, "device": "cpu"}
    skipped = {s["path"]: s["reason"] for s in meta["skipped"]}
    assert sorted(skipped) == BAD
    assert "truncated or corrupt" in skipped["a/b/cut.png"]
    assert "not an image file Pillow can identify" in skipped["d/fake.png"]
    assert not Path(f"{index}.partial").exists()


def test_the_features_are_memory_mapped(index: Path) -> None:
    features = open_index(index).features
    assert isinstance(features, np.memmap) and features.mode == "r" and not features.flags.writeable
    assert features.dtype == np.float32 and np.allclose(np.linalg.norm(features, axis=1), 1, atol=1e-5)


def test_the_report_names_each_bad_file_and_sums_up(
    run: Path, photos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(index_argv(photos, run, tmp_path / "idx")) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("skipped a/b/cut.png: cannot read image ") and "truncated" in lines[0]
    assert lines[1].startswith("skipped d/fake.png: cannot read image ")
    assert lines[2] == (
        f"indexed 7 images of {photos} into {tmp_path / 'idx'} (2 bad images skipped; "
        "1 file without an image extension ignored)"
    )


def test_a_killed_run_resumes_to_the_uninterrupted_index_bit_for_bit(
    index: Path, run: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    out = tmp_path / "idx"
    with monkeypatch.context() as m:
        kill_after(m, ModelEmbedder, 2)  # chunk 0 (files 0-2: batches [0, 1], [2]) saved, killed in chunk 1
        with pytest.raises(KeyboardInterrupt):
            main(index_argv(photos, run, out))
    assert not out.exists() and sorted(p.name for p in Path(f"{out}.partial", "chunks").iterdir()) == [
        "000000.json",
        "000000.npy",
    ]
    with pytest.raises(DataError, match=r"no such index folder \(.*\.partial holds an unfinished vlp index"):
        open_index(out)
    capsys.readouterr()
    assert main(index_argv(photos, run, out)) == 0
    assert "resumed after 3 files)" in capsys.readouterr().out
    for name in ("features.npy", "paths.json", "meta.json"):
        assert (out / name).read_bytes() == (index / name).read_bytes(), name
    assert not Path(f"{out}.partial").exists()


def test_resuming_refuses_another_folder_checkpoint_or_option(
    run: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    own = tmp_path / "photos"
    shutil.copytree(photos, own)
    out = tmp_path / "idx"
    with monkeypatch.context() as m:
        kill_after(m, ModelEmbedder, 2)
        with pytest.raises(KeyboardInterrupt):
            main(index_argv(own, run, out))
    capsys.readouterr()
    other = tiny_run(tmp_path / "other", seed=1)
    for argv, what in (
        (index_argv(own, run, out, "--batch-size", "4"), "--batch-size was 2, now 4"),
        (index_argv(own, other, out), "the checkpoint was "),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and what in err[0], err
        assert f"remove {out}.partial to start afresh" in err[0]
    (own / "new.png").write_bytes((photos / GOOD[0]).read_bytes())
    assert main(index_argv(own, run, out)) == 2
    assert "the folder's image files was 9, now 10" in capsys.readouterr().err
    (own / "new.png").unlink()
    assert main(index_argv(own, run, out)) == 0  # the same settings again: it continues


def _one_error(capsys: pytest.CaptureFixture[str], *parts: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vlp: error: "), err
    assert all(p in err[0] for p in parts), err


def test_bad_input_is_one_line(run: Path, photos: Path, index: Path, tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "sub" / "readme.md").write_text("no photos here")
    assert main(index_argv(empty, run, tmp_path / "i1")) == 2
    _one_error(capsys, f"{empty}: no image files under it", "1 other files")
    assert main(index_argv(tmp_path / "nowhere", run, tmp_path / "i2")) == 2
    _one_error(capsys, "nowhere: no such folder")
    assert main(index_argv(photos, run, index)) == 2
    _one_error(capsys, f"{index} already exists: remove it, or choose another --out")
    assert main(index_argv(photos, tmp_path / "no-run", tmp_path / "i3")) == 2
    _one_error(capsys, "no-run")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in BAD:
        shutil.copy(photos / name, broken / Path(name).name)
    assert main(index_argv(broken, run, tmp_path / "i4")) == 2
    _one_error(capsys, f"{broken}: none of its 2 image files could be read: cut.png: cannot read image")
    assert main(index_argv(photos, run, tmp_path / "i5", "--batch-size", "0")) == 2
    _one_error(capsys, "--batch-size 0")


def test_an_index_of_another_format_or_a_newer_version_is_refused(index: Path, tmp_path: Path) -> None:
    for change, match in (
        ({"format": "something-else"}, "not a vlp image index \\(format 'something-else'"),
        ({"format_version": 99}, "index format version 99 is newer than this vlp reads \\(1\\); upgrade vlp"),
        ({"count": 3}, "float32 \\[7, 16\\], but meta.json says float32 \\[3, 16\\]"),
    ):
        copy = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        shutil.copytree(index, copy)
        meta = json.loads((copy / "meta.json").read_text())
        (copy / "meta.json").write_text(json.dumps({**meta, **change}))
        with pytest.raises(DataError, match=match):
            open_index(copy)
    (copy / "meta.json").unlink()
    with pytest.raises(DataError, match="not a vlp image index \\(no meta.json"):
        open_index(copy)


class MeanColour:
    """A toy :class:`~vlp.search.ImageEmbedder`: the mean colour of 8 px images, normalised (E = 3)."""

    def __init__(self) -> None:
        from vlp.checkpoint import Preprocessor

        self.preprocessor = Preprocessor(image_size=8, mean=[0.0, 0.0, 0.0], std=[1.0, 1.0, 1.0], max_len=8)

    def embed_images(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(pixels.mean(dim=(2, 3)), dim=-1)

    def meta(self) -> dict:
        return {"embedder": "mean-colour", "checkpoint": None, "embed_dim": 3}


def test_any_image_embedder_plugs_in_and_loader_processes_change_nothing(photos: Path, tmp_path: Path) -> None:
    from vlp.api.inputs import image_tensor
    from vlp.search import build_index, search_image

    toy = MeanColour()
    report = build_index(photos, toy, tmp_path / "idx", batch_size=4, show_progress=False)
    assert (report.count, report.files, len(report.skipped), report.ignored) == (7, 9, 2, 1)
    opened = open_index(tmp_path / "idx")
    transform = toy.preprocessor.image_transform()
    pixels = torch.stack([image_tensor(str(photos / p), transform, 16, p) for p in GOOD])
    np.testing.assert_allclose(opened.features, toy.embed_images(pixels).numpy(), atol=1e-6, rtol=0)
    assert opened.meta["embedder"] == toy.meta() and opened.meta["checkpoint"] is None
    assert search_image(opened, toy, photos / GOOD[3], top=1)[0].row == 3
    build_index(photos, toy, tmp_path / "idx2", batch_size=4, workers=1, show_progress=False)  # a loader process
    for name in ("features.npy", "paths.json", "meta.json"):
        assert (tmp_path / "idx2" / name).read_bytes() == (tmp_path / "idx" / name).read_bytes(), name


def test_a_resumed_build_names_whatever_differs(photos: Path, tmp_path: Path) -> None:
    from vlp.errors import ConfigError
    from vlp.search import scan_folder
    from vlp.search.partial import Partial, build_identity

    embedder = {"checkpoint": "/runs/a/step_2", "weights_sha256": "ab", "device": "cpu", "embed_dim": 16}
    identity = build_identity(scan_folder(photos), embedder, batch_size=2, chunk_size=3)
    Partial.open(tmp_path / "idx", identity)
    assert Partial.open(tmp_path / "idx", identity).done() == 0  # the same build: it continues
    for change, named in (
        ({"embedder": {**embedder, "device": "cuda:0"}}, "--device was 'cpu', now 'cuda:0'"),
        ({"embedder": {**embedder, "weights_sha256": "cd"}}, "the checkpoint's weights was 'ab', now 'cd'"),
        ({"options": {"batch_size": 2, "chunk_size": 8}}, "--chunk-size was 3, now 8"),
        ({"root": "/elsewhere"}, f"the folder was '{photos}', now '/elsewhere'"),
        ({"digest": "0" * 64}, "the folder's image files changed since (one added, removed or rewritten)"),
    ):
        with pytest.raises(ConfigError, match="holds an interrupted `vlp index` of other settings") as e:
            Partial.open(tmp_path / "idx", {**identity, **change})
        assert named in str(e.value)


def test_symlinked_folders_are_not_followed_and_other_files_are_counted(photos: Path, tmp_path: Path) -> None:
    from vlp.search import scan_folder

    own = tmp_path / "own"
    shutil.copytree(photos / "d", own / "d")
    (own / "linked").symlink_to(photos / "a", target_is_directory=True)
    (own / "readme.md").write_text("notes")
    found = scan_folder(own)
    assert found.files == ["d/3.png", "d/4.jpeg", "d/fake.png"] and found.ignored == 1
    assert found.root == own.absolute()
