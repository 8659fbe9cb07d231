"""``vlp export onnx RUN --out DIR``: the two towers of a model as ONNX graphs that onnxruntime runs
without torch or vlp.

:func:`export_onnx` loads RUN as :meth:`vlp.VLPModel.from_pretrained` does (a run directory, a
checkpoint folder, a ``save_pretrained`` directory, a zoo tag or a Hub id) and writes

* ``image_encoder.onnx``: ``pixel_values`` float32 [batch, 3, S, S] (the evaluation transform's
  output) -> ``image_embeds`` float32 [batch, E], :meth:`~vlp.VLPModel.encode_image`'s features
  (the ITC projection of the CLS token, L2-normalised);
* ``text_encoder.onnx``: ``input_ids`` and ``attention_mask`` int64 [batch, seq] -> ``text_embeds``
  float32 [batch, E], :meth:`~vlp.VLPModel.encode_text`'s features (the ITC projection of [CLS],
  L2-normalised);
* ``export.json``: the graphs' inputs and outputs with their shapes, the opset, the preprocessing
  (the checkpoint's ``preprocessor.json``), the tokenizer's facts (pad id, ALBEF mode, how the mask
  is made), the source, the vlp, torch, onnx and onnxruntime versions, the files' sizes and SHA-256, and the
  check below;
* ``tokenizer/``: the model's tokenizer files (``tokenizer.save_pretrained``).

The graphs are traced from :class:`ImageTower` and :class:`TextTower`, which call the model's own
``encode_image`` / ``encode_text`` (no second implementation), by PyTorch's TorchScript-based
exporter (``torch.onnx.export(..., dynamo=False)``; the dynamo exporter needs the onnxscript
package), with the batch (and the text's seq) axes dynamic. Before anything is moved into DIR,
onnxruntime runs both graphs at batch 1 and 3 (three texts of different lengths, padded) against
the PyTorch features; a difference above :data:`CHECK_TOLERANCE` stops the export.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from vlp.api import VLPModel, tokenize
from vlp.api.capability import UnsupportedKind, require
from vlp.config.model import ARCH_DUAL
from vlp.errors import CheckpointError, ConfigError
from vlp.eval.mode import evaluating
from vlp.export.onnx_runtime import (
    ATTENTION_MASK,
    EXPORT_JSON,
    EXTRA_HINT,
    FORMAT,
    FORMAT_VERSION,
    IMAGE_EMBEDS,
    IMAGE_FILE,
    INPUT_IDS,
    PIXEL_VALUES,
    TEXT_EMBEDS,
    TEXT_FILE,
    TOKENIZER_DIR,
    OnnxEncoders,
)
from vlp.manifests import file_sha256
from vlp.version import __version__
from vlp.weights import removed_on_failure

__all__ = ["CHECK_TOLERANCE", "OPSET", "ImageTower", "OnnxEncoders", "TextTower", "export_onnx"]

#: the ONNX opset the graphs are written in (onnxruntime 1.16 and later run it)
OPSET = 17
#: the largest difference (max abs) between onnxruntime's and PyTorch's features an export may have
CHECK_TOLERANCE = 1e-4
#: the texts of the export's check: three lengths, so that two are padded
CHECK_TEXTS = ("a circle", "two red squares to the left of a small blue circle on a grey background", "one dog")
#: what the export leaves in DIR (``--overwrite`` replaces these names and no other)
EXPORT_FILES = (IMAGE_FILE, TEXT_FILE, TOKENIZER_DIR, EXPORT_JSON)


class ImageTower(nn.Module):
    """``model.encode_image(pixel_values).feat``: pixels [B, 3, S, S] -> L2-normalised ITC image
    features [B, E] (what is traced into ``image_encoder.onnx``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model: Any = model  # the kind's model class: encode_image / encode_text

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(pixel_values).feat


class TextTower(nn.Module):
    """``model.encode_text(input_ids, attention_mask).feat``: ids and mask [B, T] -> L2-normalised
    ITC text features [B, E] (what is traced into ``text_encoder.onnx``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model: Any = model  # the kind's model class: encode_image / encode_text

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model.encode_text(input_ids, attention_mask).feat


def _require_packages() -> None:
    """onnx and onnxruntime importable; else one :class:`ConfigError` naming the extra."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        raise ConfigError(f"vlp export onnx needs the onnx and onnxruntime packages: {EXTRA_HINT}") from None


def _check_out(out: Path, overwrite: bool) -> None:
    """``out`` may be written: absent, an empty folder, or (``overwrite``) any folder; else
    :class:`ConfigError`."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(
            f"--out {out}: the folder is not empty; choose another, or pass --overwrite to replace "
            f"{', '.join(n + '/' if n == TOKENIZER_DIR else n for n in EXPORT_FILES)} in it (other files are left alone)"
        )


def _load(run: str | os.PathLike) -> VLPModel:
    """The model of ``run`` on the CPU, checked to have ITC projections and an exportable text
    tower; a :class:`CheckpointError` naming ``run`` otherwise."""
    vm = VLPModel.from_pretrained(run, device="cpu")
    try:
        require(vm, "encode_image", "ITC projections", name="vlp export onnx")
    except UnsupportedKind as e:
        raise CheckpointError(f"{run}: {e}") from None
    if vm.model_config.arch == ARCH_DUAL:
        raise CheckpointError(
            f"{run}: vlp export onnx exports ALBEF's towers; the dual encoder (model.arch=dual) runs its GRU "
            "over packed sequences, which the ONNX exporter does not trace"
        )
    vm.model.requires_grad_(False)  # the traced weights become graph constants, gradients unneeded
    return vm


def _export_graph(module: nn.Module, args: tuple, path: Path, names: tuple[list, list], axes: dict, opset: int) -> None:
    """``torch.onnx.export`` of ``module`` traced on ``args`` into ``path`` (TorchScript exporter)."""
    with warnings.catch_warnings():
        # the exporter's notice that it is the TorchScript one, and timm's image-size assert traced as a
        # constant (the graph's image size is fixed; the batch and seq axes are checked after the export)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            input_names=names[0],
            output_names=names[1],
            dynamic_axes=axes,
            opset_version=opset,
            do_constant_folding=True,
        )


def _write_graphs(vm: VLPModel, tmp: Path, opset: int) -> None:
    """Both graphs into ``tmp``, traced at batch 2 (the texts padded to their longest)."""
    s = vm.preprocessor.image_size
    tok = tokenize(vm, list(CHECK_TEXTS[:2]))
    batch = {0: "batch"}
    with torch.no_grad(), evaluating(vm.model):
        pixels = torch.randn(2, 3, s, s, generator=torch.Generator().manual_seed(0))
        _export_graph(
            ImageTower(vm.model),
            (pixels,),
            tmp / IMAGE_FILE,
            ([PIXEL_VALUES], [IMAGE_EMBEDS]),
            {PIXEL_VALUES: batch, IMAGE_EMBEDS: batch},
            opset,
        )
        seq = {0: "batch", 1: "seq"}
        _export_graph(
            TextTower(vm.model),
            (tok["input_ids"], tok["attention_mask"]),
            tmp / TEXT_FILE,
            ([INPUT_IDS, ATTENTION_MASK], [TEXT_EMBEDS]),
            {INPUT_IDS: seq, ATTENTION_MASK: seq, TEXT_EMBEDS: batch},
            opset,
        )


def check_export(vm: VLPModel, folder: Path) -> dict[str, Any]:
    """onnxruntime's features of ``folder``'s graphs against ``vm``'s ``encode_image`` /
    ``encode_text`` at batch 1 and 3 (random pixels; :data:`CHECK_TEXTS`, padded to the longest):
    the batch sizes and the largest difference of each tower. Raises :class:`CheckpointError` above
    :data:`CHECK_TOLERANCE`."""
    import onnx

    onnx.checker.check_model(str(folder / IMAGE_FILE))
    onnx.checker.check_model(str(folder / TEXT_FILE))
    enc = OnnxEncoders(folder, threads=1)
    s = vm.preprocessor.image_size
    pixels = torch.randn(3, 3, s, s, generator=torch.Generator().manual_seed(1))
    image = text = 0.0
    for n in (1, 3):
        image = max(image, _diff(enc.embed_images(pixels[:n].numpy()), vm.encode_image(pixels[:n])))
        tok = tokenize(vm, list(CHECK_TEXTS[:n]))
        got = enc.embed_texts(tok["input_ids"].numpy(), tok["attention_mask"].numpy())
        text = max(text, _diff(got, vm.encode_text(list(CHECK_TEXTS[:n]))))
    result = {"batch_sizes": [1, 3], "image_max_abs_diff": image, "text_max_abs_diff": text}
    if max(image, text) > CHECK_TOLERANCE:
        raise CheckpointError(
            f"the ONNX graphs do not reproduce the model: onnxruntime and PyTorch differ by up to "
            f"{max(image, text):.2e} (image {image:.2e}, text {text:.2e}; allowed {CHECK_TOLERANCE:g})"
        )
    return result


def _diff(got: np.ndarray, want: torch.Tensor) -> float:
    """The largest absolute difference of two [N, E] feature arrays."""
    return float(np.abs(got - want.numpy()).max())


def _io(name: str, dtype: str, shape: list) -> dict[str, Any]:
    """One input or output of a graph as ``export.json`` names it."""
    return {"name": name, "dtype": dtype, "shape": shape}


def export_meta(vm: VLPModel, run: str | os.PathLike, opset: int) -> dict[str, Any]:
    """``export.json`` of ``vm`` loaded from ``run`` (without ``files`` and ``check``, added when the
    graphs are written and checked)."""
    import onnx
    import onnxruntime

    s, e = vm.preprocessor.image_size, vm.model_config.embed_dim
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": vm.kind,
        "architecture": type(vm.model).__name__,
        "embed_dim": e,
        "opset": opset,
        "image_encoder": {
            "file": IMAGE_FILE,
            "inputs": [_io(PIXEL_VALUES, "float32", ["batch", 3, s, s])],
            "outputs": [_io(IMAGE_EMBEDS, "float32", ["batch", e])],
        },
        "text_encoder": {
            "file": TEXT_FILE,
            "inputs": [_io(INPUT_IDS, "int64", ["batch", "seq"]), _io(ATTENTION_MASK, "int64", ["batch", "seq"])],
            "outputs": [_io(TEXT_EMBEDS, "float32", ["batch", e])],
            "max_seq": vm.preprocessor.max_len,
        },
        "normalized": True,
        "preprocessing": asdict(vm.preprocessor),
        "tokenizer": {
            "dir": TOKENIZER_DIR,
            "pad_id": int(vm.tokenizer.pad_token_id),
            "albef_compat": bool(vm.model_config.text.albef_compat),
            "attention_mask": "1 where input_ids != pad_id",
        },
        "source": {"run": str(Path(run).resolve()) if Path(run).exists() else str(run), **vm.source},
        "versions": {
            "vlp": __version__,
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
    }


def _files(tmp: Path) -> dict[str, dict[str, Any]]:
    """The graphs' sizes and SHA-256."""
    return {n: {"bytes": (tmp / n).stat().st_size, "sha256": file_sha256(tmp / n)} for n in (IMAGE_FILE, TEXT_FILE)}


def _publish(tmp: Path, out: Path) -> None:
    """Move the export in ``tmp`` into ``out``: renamed whole when ``out`` does not exist; else each
    of :data:`EXPORT_FILES` replaces its namesake (``export.json`` last), other files stay."""
    if not out.exists():
        os.replace(tmp, out)
        return
    for name in EXPORT_FILES:
        if (out / name).is_dir() and not (out / name).is_symlink():
            shutil.rmtree(out / name)
        elif (out / name).exists() or (out / name).is_symlink():
            (out / name).unlink()
        os.replace(tmp / name, out / name)
    tmp.rmdir()


def export_onnx(
    run: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False, opset: int = OPSET
) -> dict[str, Any]:
    """Export the image and text towers of ``run`` (anything :meth:`vlp.VLPModel.from_pretrained`
    loads) into the folder ``out`` (the module's docstring); returns the ``export.json`` content.

    ``out`` must be absent or empty unless ``overwrite``, which replaces the export's own names
    (:data:`EXPORT_FILES`) and leaves every other file. Everything is written into a staging folder
    beside ``out`` and checked there (:func:`check_export`): an export or a check that fails leaves
    ``out`` as it was.
    Raises :class:`ConfigError` (onnx / onnxruntime missing: ``pip install 'vlp[export]'``; an
    ``out`` that may not be written) and :class:`CheckpointError` (``run`` is no model, a kind
    without ITC projections, the dual encoder, graphs that do not reproduce the model)."""
    _require_packages()
    out = Path(out)
    _check_out(out, overwrite)
    vm = _load(run)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:12]}.tmp")
    tmp.mkdir()  # the umask's mode (tempfile.mkdtemp's 0700 would stay with a folder renamed into place)
    with removed_on_failure(tmp, out, f"free some space or export elsewhere; {out} is as it was"):
        meta = export_meta(vm, run, opset)
        _write_graphs(vm, tmp, opset)
        vm.tokenizer.save_pretrained(str(tmp / TOKENIZER_DIR))
        meta["files"] = _files(tmp)
        (tmp / EXPORT_JSON).write_text(json_text(meta))  # what the check's OnnxEncoders reads
        meta["check"] = check_export(vm, tmp)
        (tmp / EXPORT_JSON).write_text(json_text(meta))
        _publish(tmp, out)
    return meta


def json_text(meta: dict[str, Any]) -> str:
    """``export.json``'s text (indented, no NaN)."""
    return json.dumps(meta, indent=2, allow_nan=False) + "\n"


def summary(meta: dict[str, Any], out: Optional[str | os.PathLike] = None) -> str:
    """What ``vlp export onnx`` prints of an export: the graphs, their inputs and outputs, the check."""
    image, text, check = meta["image_encoder"], meta["text_encoder"], meta["check"]

    def shapes(tensors: list[dict[str, Any]]) -> str:
        return ", ".join(f"{t['name']} {t['dtype']} {t['shape']}" for t in tensors)

    def sig(part: dict[str, Any]) -> str:
        return f"{part['file']}: {shapes(part['inputs'])} -> {shapes(part['outputs'])}"

    where = f" into {out}" if out is not None else ""
    return "\n".join(
        [
            f"exported the {meta['kind']} {meta['architecture']} towers{where} (opset {meta['opset']})",
            f"  {sig(image)}",
            f"  {sig(text)}",
            f"  onnxruntime vs PyTorch at batch {' and '.join(map(str, check['batch_sizes']))}: max abs diff "
            f"image {check['image_max_abs_diff']:.1e}, text {check['text_max_abs_diff']:.1e}",
        ]
    )
