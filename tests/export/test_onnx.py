"""``vlp export onnx`` and :class:`vlp.export.OnnxEncoders` (issue 55, part 4): the exported towers
give ``encode_image`` / ``encode_text``'s features within 1e-4 under onnxruntime at batch 1 and 3
(dynamic axes), for padded texts of several lengths; the graphs' names and shapes, ``export.json``,
the tokenizer files, the refusals, and the snippets of docs/api.md ("Export to ONNX") run as written.

One export of a tiny untrained ALBEF for the module, made through the command line into a folder
that already holds a file of the user's (refused, then ``--overwrite``)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vlp
from tests.helpers import ROOT, TINY_ALBEF, dual_checkpoint, untrained_checkpoint
from vlp.api import VLPModel, tokenize
from vlp.cli import main
from vlp.errors import CheckpointError, ConfigError
from vlp.export import OnnxEncoders
from vlp.export import onnx as onnx_export
from vlp.export.onnx import check_export
from vlp.manifests import file_sha256

onnx = pytest.importorskip("onnx")  # the export extra (not installed by make test-oldest)
ort = pytest.importorskip("onnxruntime")

TOL = 1e-4
TEXTS = ["A red circle.", "two blue squares left of a large green triangle at the top right", "x", "one shape"]
USER_FILE = "notes.txt"


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``vlp ARGV`` in this process: its exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return untrained_checkpoint(tmp_path_factory.mktemp("onnx") / "ckpt", TINY_ALBEF)


@pytest.fixture(scope="module")
def model(ckpt: Path) -> VLPModel:
    return VLPModel.from_pretrained(ckpt, device="cpu")


@pytest.fixture(scope="module")
def export(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``vlp export onnx CKPT --out DIR`` into a DIR holding a user's file: refused, then ``--overwrite``."""
    out = tmp_path_factory.mktemp("export") / "onnx"
    out.mkdir()
    (out / USER_FILE).write_text("mine")
    refused = run_cli(["export", "onnx", str(ckpt), "--out", str(out)])
    refused_listing = sorted(p.name for p in out.iterdir())
    done = run_cli(["export", "onnx", str(ckpt), "--out", str(out), "--overwrite"])
    return dict(out=out, refused=refused, refused_listing=refused_listing, done=done)


@pytest.fixture(scope="module")
def encoders(export: dict) -> OnnxEncoders:
    return OnnxEncoders(export["out"], threads=1)


def max_diff(got: np.ndarray, want: torch.Tensor) -> float:
    assert got.dtype == np.float32 and got.shape == tuple(want.shape)
    return float(np.abs(got - want.numpy()).max())


def test_the_command_refuses_a_non_empty_folder_then_overwrites_only_its_own_files(export: dict):
    status, out, err = export["refused"]
    assert status == 2 and out == ""
    assert err.strip().splitlines() == [
        f"vlp: error: --out {export['out']}: the folder is not empty; choose another, or pass --overwrite to "
        "replace image_encoder.onnx, text_encoder.onnx, tokenizer/, export.json in it (other files are left alone)"
    ]
    assert export["refused_listing"] == [USER_FILE]
    status, out, err = export["done"]
    assert status == 0, err
    assert out.splitlines()[0] == "exported the pretrain ALBEF towers (opset 17)"
    assert out.splitlines()[-1] == f"wrote {export['out']}"
    listing = sorted(p.name for p in export["out"].iterdir())
    assert listing == ["export.json", "image_encoder.onnx", USER_FILE, "text_encoder.onnx", "tokenizer"]
    assert (export["out"] / USER_FILE).read_text() == "mine"
    assert not [p for p in export["out"].parent.iterdir() if p.name.endswith(".tmp")]  # no staging folder left


@pytest.mark.parametrize("batch", [1, 3])
def test_image_features_match_encode_image(encoders: OnnxEncoders, model: VLPModel, batch: int):
    s = model.preprocessor.image_size
    pixels = torch.randn(batch, 3, s, s, generator=torch.Generator().manual_seed(batch))
    want = model.encode_image(pixels)
    assert max_diff(encoders.embed_images(pixels.numpy()), want) < TOL
    assert max_diff(encoders.embed_images(pixels), want) < TOL  # a torch tensor as it is
    assert np.allclose(np.linalg.norm(encoders.embed_images(pixels), axis=1), 1, atol=1e-5)


@pytest.mark.parametrize("texts", [TEXTS[:1], TEXTS[:3], TEXTS], ids=["1", "3", "4"])
def test_text_features_match_encode_text_with_padding(encoders: OnnxEncoders, model: VLPModel, texts: list[str]):
    tok = tokenize(model, texts)  # padded to the longest text
    assert len(texts) == 1 or (tok["attention_mask"] == 0).any()
    got = encoders.embed_texts(tok["input_ids"].numpy(), tok["attention_mask"].numpy())
    assert max_diff(got, model.encode_text(texts)) < TOL


def test_ids_of_get_tokenizer_without_a_mask_match_encode_text(encoders: OnnxEncoders, model: VLPModel, ckpt: Path):
    ids = vlp.get_tokenizer(str(ckpt))(TEXTS)  # padded to max_len; the mask: ids != pad id
    assert ids.shape == (4, model.preprocessor.max_len)
    assert max_diff(encoders.embed_texts(ids), model.encode_text(ids)) < TOL
    assert max_diff(encoders.embed_texts(ids, batch_size=3), model.encode_text(ids)) < TOL
    assert torch.equal(encoders.tokenizer()(TEXTS), ids)  # the folder's tokenizer is the model's


def test_the_graphs_inputs_and_outputs(export: dict, model: VLPModel):
    s, e = model.preprocessor.image_size, model.model_config.embed_dim
    image = ort.InferenceSession(str(export["out"] / "image_encoder.onnx"), providers=["CPUExecutionProvider"])
    text = ort.InferenceSession(str(export["out"] / "text_encoder.onnx"), providers=["CPUExecutionProvider"])

    def io_of(xs):
        return [(x.name, x.type, x.shape) for x in xs]

    assert io_of(image.get_inputs()) == [("pixel_values", "tensor(float)", ["batch", 3, s, s])]
    assert io_of(image.get_outputs()) == [("image_embeds", "tensor(float)", ["batch", e])]
    assert io_of(text.get_inputs()) == [
        ("input_ids", "tensor(int64)", ["batch", "seq"]),
        ("attention_mask", "tensor(int64)", ["batch", "seq"]),
    ]
    assert io_of(text.get_outputs()) == [("text_embeds", "tensor(float)", ["batch", e])]
    for name in ("image_encoder.onnx", "text_encoder.onnx"):
        onnx.checker.check_model(str(export["out"] / name))
        assert onnx.load(str(export["out"] / name)).opset_import[0].version == 17


def test_export_json(export: dict, model: VLPModel, ckpt: Path, encoders: OnnxEncoders):
    meta = json.loads((export["out"] / "export.json").read_text())
    s, e = model.preprocessor.image_size, model.model_config.embed_dim
    assert meta["format"] == "vlp-onnx" and meta["format_version"] == 1
    assert (meta["kind"], meta["architecture"], meta["embed_dim"], meta["opset"]) == ("pretrain", "ALBEF", e, 17)
    assert meta["image_encoder"]["inputs"] == [
        {"name": "pixel_values", "dtype": "float32", "shape": ["batch", 3, s, s]}
    ]
    assert meta["text_encoder"]["outputs"] == [{"name": "text_embeds", "dtype": "float32", "shape": ["batch", e]}]
    assert [i["name"] for i in meta["text_encoder"]["inputs"]] == ["input_ids", "attention_mask"]
    assert meta["preprocessing"] == json.loads(model.preprocessor.to_json()) == encoders.preprocessing()
    assert meta["tokenizer"] == {
        "dir": "tokenizer",
        "pad_id": 0,
        "albef_compat": False,
        "attention_mask": "1 where input_ids != pad_id",
    }
    assert meta["source"]["run"] == str(ckpt.resolve()) and meta["source"]["checkpoint"] == str(ckpt.resolve())
    assert meta["versions"] == {
        "vlp": vlp.__version__,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
    }
    for name, entry in meta["files"].items():
        assert entry == {"bytes": (export["out"] / name).stat().st_size, "sha256": file_sha256(export["out"] / name)}
    assert meta["check"]["batch_sizes"] == [1, 3]
    assert max(meta["check"]["image_max_abs_diff"], meta["check"]["text_max_abs_diff"]) < TOL
    assert sorted(p.name for p in (export["out"] / "tokenizer").iterdir()) == [
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert (encoders.embed_dim, encoders.image_size, encoders.pad_id) == (e, s, 0)
    assert encoders.providers == ["CPUExecutionProvider"]


def test_cuda_without_the_gpu_package_runs_on_the_cpu_with_a_warning(export: dict):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    with pytest.warns(UserWarning, match="CUDAExecutionProvider is not available"):
        enc = OnnxEncoders(export["out"], device="cuda", threads=1)
    assert enc.providers == ["CPUExecutionProvider"]


def test_bad_inputs_and_folders_are_named(encoders: OnnxEncoders, tmp_path: Path):
    with pytest.raises(ValueError, match=r"expected \[B, 3, 64, 64\]"):
        encoders.embed_images(np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(ValueError, match="expected both"):
        encoders.embed_texts(np.ones((2, 5)), np.ones((2, 4)))
    with pytest.raises(CheckpointError, match="not a vlp ONNX export"):
        OnnxEncoders(tmp_path)
    (tmp_path / "export.json").write_text('{"format": "something-else"}')
    with pytest.raises(CheckpointError, match="format 'something-else'"):
        OnnxEncoders(tmp_path)


def test_a_run_that_is_no_model_and_an_out_that_is_a_file_are_one_line(tmp_path: Path, ckpt: Path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "a.txt").write_text("hi")
    status, _, err = run_cli(["export", "onnx", str(tmp_path / "run"), "--out", str(tmp_path / "o")])
    assert status == 2 and err.strip().splitlines() == [
        f"vlp: error: {tmp_path / 'run'}: no checkpoint here (expected model.safetensors or checkpoints/step_*/)"
    ]
    (tmp_path / "file").write_text("x")
    status, _, err = run_cli(["export", "onnx", str(ckpt), "--out", str(tmp_path / "file")])
    assert status == 2 and err.strip() == f"vlp: error: --out {tmp_path / 'file'}: exists and is not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "run"]


def test_the_dual_encoder_is_refused_by_name(tmp_path: Path):
    dual_checkpoint(tmp_path / "dual")
    status, _, err = run_cli(["export", "onnx", str(tmp_path / "dual"), "--out", str(tmp_path / "o")])
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "the dual encoder (model.arch=dual)" in err
    assert not (tmp_path / "o").exists()


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, export: dict):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    status, _, err = run_cli(["export", "onnx", str(tmp_path), "--out", str(tmp_path / "o")])
    assert status == 2 and err.strip().splitlines() == [
        "vlp: error: vlp export onnx needs the onnx and onnxruntime packages: pip install 'vlp[export]'"
    ]
    with pytest.raises(ConfigError, match=re.escape("pip install 'vlp[export]'")):
        OnnxEncoders(export["out"])


def doc_blocks() -> list[str]:
    """The ```python blocks of docs/api.md's "Export to ONNX" section."""
    section = (ROOT / "docs" / "api.md").read_text().split("## Export to ONNX", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_docs_snippets_run_on_an_export(export: dict, model: VLPModel, tmp_path: Path, capsys):
    """docs/api.md's two snippets, on this module's export and an RGB image of the test's."""
    image = tmp_path / "image.png"
    pixels = torch.randint(0, 256, (48, 80, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    Image.fromarray(pixels.numpy(), "RGB").save(image)
    blocks = doc_blocks()
    assert len(blocks) == 2
    captions = ["one large diamond", "a small green shape"]
    want = model.encode_image([str(image)]) @ model.encode_text(captions).T
    for block in blocks:
        assert block.count("/tmp/apidoc/onnx") == 1 and block.count("/tmp/apidoc/w/images/test/test_000000.png") == 1
        code = block.replace("/tmp/apidoc/onnx", str(export["out"]))
        code = code.replace("/tmp/apidoc/w/images/test/test_000000.png", str(image))
        namespace: dict = {}
        exec(compile(code, "docs/api.md", "exec"), namespace)
        printed = capsys.readouterr().out
        assert printed.strip().endswith("]]")
        if "image_embeds" in namespace:  # the onnxruntime-only snippet
            assert max_diff(namespace["image_embeds"], model.encode_image([str(image)])) < TOL
            assert max_diff(namespace["text_embeds"], model.encode_text(captions)) < TOL
            assert max_diff(namespace["image_embeds"] @ namespace["text_embeds"].T, want) < TOL
        else:
            enc = namespace["enc"]
            assert max_diff(enc.embed_images(namespace["pixels"]) @ enc.embed_texts(namespace["ids"]).T, want) < TOL


def test_a_kind_without_itc_projections_is_refused(monkeypatch: pytest.MonkeyPatch, model: VLPModel, tmp_path: Path):
    vqa = copy.copy(model)
    vqa.kind = "vqa"
    monkeypatch.setattr(VLPModel, "from_pretrained", lambda run, device: vqa)
    status, _, err = run_cli(["export", "onnx", "some-vqa-run", "--out", str(tmp_path / "o")])
    assert status == 2 and err.strip().splitlines() == [
        "vlp: error: some-vqa-run: vlp export onnx needs ITC projections (pretrain or helper or retrieval "
        "checkpoint); this is a vqa checkpoint"
    ]
    assert not (tmp_path / "o").exists()


def test_the_check_stops_graphs_that_differ(monkeypatch: pytest.MonkeyPatch, export: dict, model: VLPModel):
    assert set(check_export(model, export["out"])) == {"batch_sizes", "image_max_abs_diff", "text_max_abs_diff"}
    monkeypatch.setattr(onnx_export, "CHECK_TOLERANCE", 0.0)
    with pytest.raises(CheckpointError, match="the ONNX graphs do not reproduce the model"):
        check_export(model, export["out"])
