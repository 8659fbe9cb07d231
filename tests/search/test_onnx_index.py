"""``vlp index DIR --onnx EXPORT`` (vlp.search.onnx_embedder): the image tower of a ``vlp export onnx``
folder under onnxruntime builds the index the checkpoint builds (rows within 1e-4, the same paths),
``vlp search`` on it queries the export's text tower and ranks as on the PyTorch index, a killed run
resumes and refuses another encoder, and the errors of --checkpoint / --onnx / --rerank-itm are one
line each. One export of the search tests' tiny run (E = 16, 32 px) for the module."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.search.conftest import GOOD, INDEX_OPTIONS, index_argv, kill_after
from vlp import VLPModel
from vlp.cli import main
from vlp.manifests import file_sha256
from vlp.search import OnnxEmbedder, Searcher, open_index

pytest.importorskip("onnx", reason="vlp export onnx needs the onnx package (the export extra)")
pytest.importorskip("onnxruntime", reason="vlp index --onnx needs onnxruntime (the export extra)")

TOL = 1e-4
QUERIES = ["a red circle left of a blue square", "two green triangles", "one small yellow diamond at the top"]
CPU = ["--device", "cpu"]


def onnx_argv(photos: Path, export: Path, out: Path, *more: str) -> list[str]:
    """``vlp index PHOTOS --onnx EXPORT --out OUT`` with the search tests' options and ``more``."""
    return ["index", str(photos), "--onnx", str(export), "--out", str(out), *INDEX_OPTIONS, *more]


@pytest.fixture(scope="module")
def export(run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``vlp export onnx RUN --out DIR`` of the tiny run: DIR."""
    out = tmp_path_factory.mktemp("export") / "onnx"
    assert main(["export", "onnx", str(run), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def onnx_index(photos: Path, export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``vlp index`` of the photos with the export: the index folder."""
    out = tmp_path_factory.mktemp("onnx-index") / "idx"
    assert main(onnx_argv(photos, export, out)) == 0
    return out


def _one_error(capsys: pytest.CaptureFixture[str], *parts: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vlp: error: "), err
    assert all(p in err[0] for p in parts), err
    return err[0]


def test_the_rows_are_the_checkpoints_within_1e4_with_the_same_paths(
    onnx_index: Path, index: Path, export: Path, run: Path
) -> None:
    got, want = open_index(onnx_index), open_index(index)
    assert got.paths == want.paths == GOOD
    assert np.abs(np.asarray(got.features) - np.asarray(want.features)).max() < TOL
    assert got.meta["skipped"] == want.meta["skipped"] and got.meta["files"] == want.meta["files"]
    assert got.meta["checkpoint"] is None  # no PyTorch checkpoint queries it by default
    assert got.meta["embedder"] == {
        "embedder": "onnx",
        "checkpoint": None,
        "export": str(export.resolve()),
        "image_encoder_sha256": file_sha256(export / "image_encoder.onnx"),
        "exported_from": str((run / "checkpoints" / "step_0000002").resolve()),
        "step": 2,
        "kind": "pretrain",
        "architecture": "ALBEF",
        "embed_dim": 16,
        "image_size": 32,
        "device": "cpu",
        "providers": ["CPUExecutionProvider"],
    }
    assert got.meta["options"] == {"batch_size": 2, "chunk_size": 3, "device": "cpu"}


def _same_ranking(got: list[dict], want: list[dict]) -> None:
    """The same hits, scores within :data:`TOL`, and the same order wherever ``want``'s scores of two
    hits differ by more than :data:`TOL`."""
    assert sorted(h["row"] for h in got) == sorted(h["row"] for h in want)
    score = {h["row"]: h["itc"] for h in want}
    rank = {h["row"]: h["rank"] for h in got}
    for h in got:
        assert abs(h["itc"] - score[h["row"]]) < TOL
    for a in want:
        for b in want:
            if score[a["row"]] > score[b["row"]] + TOL:
                assert rank[a["row"]] < rank[b["row"]], (a, b)


def test_search_ranks_an_onnx_index_as_the_pytorch_one(
    onnx_index: Path, index: Path, photos: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for args in ([q] for q in QUERIES):
        printed = []
        for folder in (onnx_index, index):
            assert main(["search", str(folder), *args, "--top", "50", "--json", *CPU]) == 0
            printed.append(json.loads(capsys.readouterr().out))
        assert len(printed[0]) == len(GOOD)
        _same_ranking(*printed)
    for image in (GOOD[0], GOOD[3]):
        printed = []
        for folder in (onnx_index, index):
            assert main(["search", str(folder), "--image", str(photos / image), "--top", "3", "--json", *CPU]) == 0
            printed.append(json.loads(capsys.readouterr().out))
        assert printed[0][0]["row"] == GOOD.index(image) and abs(printed[0][0]["itc"] - 1) < TOL
        _same_ranking(printed[0], printed[1])


def test_text_queries_use_the_exports_text_tower_unless_a_checkpoint_is_given(
    onnx_index: Path, export: Path, run: Path
) -> None:
    searcher = Searcher.open(onnx_index, device="cpu")
    assert isinstance(searcher.embedder, OnnxEmbedder) and searcher.embedder.folder == export.resolve()
    assert searcher.note is None
    want = VLPModel.from_pretrained(run, device="cpu").encode_text(QUERIES)
    assert np.abs(searcher.embedder.encode_text(QUERIES).numpy() - want.numpy()).max() < TOL
    with_checkpoint = Searcher.open(onnx_index, checkpoint=str(run), device="cpu")
    assert isinstance(with_checkpoint.text_model, VLPModel)
    hits = [h.to_json() for h in with_checkpoint.text(QUERIES[0], top=50)]
    _same_ranking(hits, [h.to_json() for h in searcher.text(QUERIES[0], top=50)])


def test_rerank_itm_needs_a_checkpoint(onnx_index: Path, run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", str(onnx_index), QUERIES[0], "--rerank-itm", "3", *CPU]) == 2
    line = _one_error(capsys, "--rerank-itm needs the ITM head of a PyTorch ALBEF checkpoint", "give --checkpoint RUN")
    assert f"exported from {(run / 'checkpoints' / 'step_0000002').resolve()}" in line
    assert (
        main(["search", str(onnx_index), QUERIES[0], "--rerank-itm", "3", "--checkpoint", str(run), "--json", *CPU])
        == 0
    )
    hits = json.loads(capsys.readouterr().out)
    assert [h["itm"] is not None for h in hits] == [True] * 3 + [False] * (len(hits) - 3)


def test_a_killed_run_resumes_to_the_uninterrupted_index_and_refuses_another_encoder(
    onnx_index: Path, export: Path, run: Path, photos: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    out = tmp_path / "idx"
    with monkeypatch.context() as m:
        kill_after(m, OnnxEmbedder, 2)  # chunk 0 saved, killed in chunk 1
        with pytest.raises(KeyboardInterrupt):
            main(onnx_argv(photos, export, out))
    assert not out.exists() and Path(f"{out}.partial", "chunks", "000000.npy").is_file()
    capsys.readouterr()
    assert main(index_argv(photos, run, out)) == 2
    _one_error(capsys, "the image encoder (--checkpoint or --onnx) was 'onnx', now 'vlp-model'")
    assert main(onnx_argv(photos, export, out)) == 0
    assert "resumed after 3 files)" in capsys.readouterr().out
    for name in ("features.npy", "paths.json", "meta.json"):
        assert (out / name).read_bytes() == (onnx_index / name).read_bytes(), name


def test_checkpoint_and_onnx_one_of_them(photos: Path, run: Path, export: Path, tmp_path: Path, capsys) -> None:
    assert main(["index", str(photos), "--out", str(tmp_path / "a"), *INDEX_OPTIONS]) == 2
    _one_error(capsys, "give --checkpoint RUN or --onnx EXPORT: the image tower that embeds the images")
    assert main(index_argv(photos, run, tmp_path / "b", "--onnx", str(export))) == 2
    _one_error(capsys, "give --checkpoint RUN or --onnx EXPORT", "not both")
    assert main(onnx_argv(photos, run, tmp_path / "c")) == 2
    _one_error(capsys, "not a vlp ONNX export (no export.json")
    assert not any(tmp_path.iterdir())


def test_without_onnxruntime_the_extra_is_named(
    photos: Path, export: Path, onnx_index: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    assert main(onnx_argv(photos, export, tmp_path / "idx")) == 2
    _one_error(capsys, "running an ONNX export needs the onnxruntime package: pip install 'vlp[export]'")
    assert main(["search", str(onnx_index), QUERIES[0], *CPU]) == 2
    _one_error(capsys, "pip install 'vlp[export]'")


def test_an_export_whose_image_graph_changed_since_searches_with_a_note(
    onnx_index: Path, export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "idx"
    shutil.copytree(onnx_index, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["embedder"]["image_encoder_sha256"] = "0" * 64  # as if the export were rewritten (--overwrite) since
    (copy / "meta.json").write_text(json.dumps(meta))
    assert main(["search", str(copy), QUERIES[0], *CPU]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"vlp search: note: the index {copy} was built with other weights ({export.resolve()}); its images were "
        f"embedded by another image tower than the ONNX export {export.resolve()}'s"
    ]


def test_the_device_defaults_to_what_onnxruntime_has_and_other_devices_are_one_line(
    photos: Path, export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import onnxruntime

    has_cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert OnnxEmbedder.load(export).device == ("cuda" if has_cuda else "cpu")
    assert main(onnx_argv(photos, export, tmp_path / "idx", "--device", "cuda:1")) == 2
    _one_error(capsys, "device 'cuda:1': expected 'cpu' or 'cuda'")


def test_a_resumed_build_names_another_export_or_image_graph(photos: Path, tmp_path: Path) -> None:
    from vlp.errors import ConfigError
    from vlp.search import scan_folder
    from vlp.search.partial import Partial, build_identity

    embedder = {"embedder": "onnx", "checkpoint": None, "export": "/e1", "image_encoder_sha256": "ab", "device": "cpu"}
    identity = build_identity(scan_folder(photos), embedder, batch_size=2, chunk_size=3)
    Partial.open(tmp_path / "idx", identity)
    for change, named in (
        ({"export": "/e2"}, "the ONNX export was '/e1', now '/e2'"),
        ({"image_encoder_sha256": "cd"}, "the export's image_encoder.onnx was 'ab', now 'cd'"),
        ({"providers": ["CUDAExecutionProvider"]}, "onnxruntime's providers was None, now ['CUDAExecutionProvider']"),
    ):
        with pytest.raises(ConfigError, match="holds an interrupted `vlp index` of other settings") as e:
            Partial.open(tmp_path / "idx", {**identity, "embedder": {**embedder, **change}})
        assert named in str(e.value)


def test_serve_searches_an_onnx_index_and_says_why_it_draws_no_heat_map(onnx_index: Path, run: Path) -> None:
    """``vlp serve`` on an index of ``--onnx`` without ``--checkpoint``: the export answers the text
    and "more like this" searches as ``vlp search`` does; the heat map (and the ITM re-rank) need
    the PyTorch model, and the page says so in one line (it raised AttributeError at start)."""
    from vlp.search import Searcher
    from vlp.serve import SearchApp
    from vlp.serve.app import ApiError

    app = SearchApp.open(onnx_index, device="cpu")
    info = app.info()
    assert info["heatmap"] is False and "--checkpoint" in info["heatmap_note"] and "ONNX" in info["heatmap_note"]
    assert info["kind"] == "pretrain"
    want = Searcher.open(onnx_index, device="cpu")
    got = app.search({"q": "a red circle", "top": "3"})["hits"]
    assert [h["row"] for h in got] == [h.row for h in want.text("a red circle", top=3)]
    assert app.similar({"row": "1", "top": "2"})["hits"][0]["row"] == 1
    with pytest.raises(ApiError, match="--checkpoint"):
        app.heatmap({"row": "0", "q": "a red circle"})
    with pytest.raises(ApiError, match="--checkpoint"):
        app.search({"q": "a red circle", "rerank": "2"})
    with_model = SearchApp.open(onnx_index, checkpoint=str(run), device="cpu")
    assert with_model.info()["heatmap"] is True
