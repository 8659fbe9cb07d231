"""Loading and saving a :class:`~vlp.api.VLPModel`: the ``save_pretrained`` directory format
(docs/api.md) and the checkpoint folders and run directories training writes.

A ``save_pretrained`` directory holds exactly:

* ``config.json`` (:func:`config_dict`): format marker, vlp version, checkpoint kind, the model
  config, where the weights came from, and for a kind that ranks candidate answers (VQA) its
  answers and ``k_test``, under the kind's name (``vqa``);
* ``model.safetensors``: the inference weights. **Momentum twins and feature queues are dropped**
  (they only serve training; a pretraining file shrinks to about half). Loading builds the model of
  the kind with an empty queue and allows exactly the ``momentum.twin.*`` and ``queue.*`` keys to be
  missing (every other key is loaded strictly), then sets the twin to a copy of the online weights;
* the tokenizer files of ``tokenizer.save_pretrained`` (``tokenizer.json``, ``tokenizer_config.json``
  with transformers 5);
* ``preprocessor.json``: image size, resize mode, mean/std, minimum image side, caption cleaning,
  ``max_len`` and padding;
* ``manifest.json``: every other file's size and SHA-256, written last (as in a checkpoint folder);
  :func:`load` checks them all before loading (a directory without one is refused: nothing in it
  could be checked).

Loading such a directory goes through no training code (no :mod:`vlp.runs`, no loaders); a
checkpoint folder or run directory is opened with :func:`vlp.checkpoint.open_checkpoint` (manifest
verified, read once; its ``preprocessor.json`` where training wrote one).
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import torch
from torch import nn

from vlp.checkpoint import PREPROCESSOR, Preprocessor, open_checkpoint
from vlp.config import FinetuneConfig, ModelConfig, from_dict, to_dict
from vlp.errors import CheckpointError
from vlp.kinds import KINDS
from vlp.models.build import build_model_of_kind, without_init_sources
from vlp.preprocess.transforms import load_tokenizer
from vlp.version import __version__
from vlp.weights import (
    TOKENIZER_FILES,
    load_weights_file,
    publish,
    refuse_unlisted,
    removed_on_failure,
    save_tensors,
    staging,
    verify_checkpoint,
    weights_to_save,
)

if TYPE_CHECKING:
    from vlp.api import VLPModel

FORMAT, FORMAT_VERSION = "vlp-pretrained", 1
CONFIG, WEIGHTS = "config.json", "model.safetensors"
#: state-dict prefixes save_pretrained leaves out (training-only state)
DROPPED = ("momentum.", "queue.")


class Loaded(NamedTuple):
    """What :func:`load` reads: the arguments of :class:`~vlp.api.VLPModel` but ``batch_size``."""

    model: nn.Module
    kind: str
    model_config: ModelConfig
    tokenizer: Any
    preprocessor: Preprocessor
    answers: Optional[list[str]]
    vqa_k_test: int
    source: Optional[dict]


def build_inference_model(kind: str, model: ModelConfig, vocab_size: int) -> nn.Module:
    """The model of a checkpoint kind (:func:`vlp.models.build.build_model_of_kind`) with every
    initialisation source off (the weights come from the file) and an empty feature queue."""
    cfg = copy.deepcopy(model)
    without_init_sources(cfg)
    cfg.queue_size = 0
    return build_model_of_kind(kind, cfg, vocab_size)


def inference_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """What ``model.safetensors`` holds: the checkpoint tensors (one name per tied group) without
    momentum twins and queues."""
    return {k: v for k, v in weights_to_save(model).items() if not k.startswith(DROPPED)}


def load_inference_weights(model: nn.Module, path: Path) -> None:
    """Strictly load an inference ``model.safetensors``: only tied aliases and the dropped
    ``momentum.twin.*`` / ``queue.*`` keys may be missing; the twin becomes a copy of the online weights."""
    load_weights_file(model, path, allow_missing=["momentum.twin.*", "queue.*"])
    twin = getattr(model, "momentum", None)
    if twin is not None:
        twin.copy_from_online()


def load(path: Path, device: torch.device) -> Loaded:
    """A ``save_pretrained`` directory (it has a ``config.json``), else a checkpoint folder or run
    directory (its newest valid checkpoint), with the model on ``device``."""
    loaded = _from_directory(path) if (path / CONFIG).is_file() else _from_checkpoint(path, device)
    return loaded._replace(model=loaded.model.to(device))


def load_text_side(path: Path) -> tuple[Any, Preprocessor]:
    """The tokenizer and :class:`~vlp.checkpoint.Preprocessor` :func:`load` would give for ``path``
    (a ``save_pretrained`` directory, a checkpoint folder or a run directory), verified as it
    verifies them, without building the model or reading its weights into one."""
    if (path / CONFIG).is_file():
        text = from_dict(ModelConfig, _verified_config(path)["model"]).text
        return load_tokenizer(text, files=str(path)), Preprocessor(**json.loads((path / PREPROCESSOR).read_text()))
    ckpt = open_checkpoint(path, load=False)
    return load_tokenizer(ckpt.model_config.text), ckpt.preprocessor


def _verified_config(path: Path) -> dict:
    """``config.json`` of a ``save_pretrained`` directory whose files all verify."""
    # every file against manifest.json (if it has one); an unlisted file the loader reads is refused
    verify_checkpoint(path, (CONFIG, PREPROCESSOR), reads=(CONFIG, PREPROCESSOR, WEIGHTS))
    refuse_unlisted(path, TOKENIZER_FILES, "tokenizer")  # and no tokenizer file beside the listed ones
    config = json.loads((path / CONFIG).read_text())
    if config.get("format") != FORMAT:
        raise CheckpointError(f"{path / CONFIG}: not a vlp save_pretrained config (format {config.get('format')!r})")
    if config.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format version {config['format_version']} is newer than this vlp reads "
            f"({FORMAT_VERSION}); upgrade vlp"
        )
    return config


def _from_directory(path: Path) -> Loaded:
    config = _verified_config(path)
    kind, mcfg = config["kind"], from_dict(ModelConfig, config["model"])
    pre = Preprocessor(**json.loads((path / PREPROCESSOR).read_text()))
    tokenizer = load_tokenizer(mcfg.text, files=str(path))  # and ALBEF's compat mode, from the config
    model = build_inference_model(kind, mcfg, len(tokenizer))
    load_inference_weights(model, path / WEIGHTS)
    vqa = config.get(kind) or {}  # a kind with candidate answers: under its name (config_dict)
    return Loaded(model, kind, mcfg, tokenizer, pre, vqa.get("answers"), vqa.get("k_test", 128), config.get("source"))


def _from_checkpoint(path: Path, device: torch.device) -> Loaded:
    from vlp.data.downstream_formats import load_answer_list

    ckpt = open_checkpoint(path, device)
    answers, k_test, data = None, 128, ckpt.pretrain_config.data.train
    if isinstance(ckpt.config, FinetuneConfig):  # the fine-tuning run's settings
        ft = ckpt.config
        k_test, data = ft.vqa.k_test, ft.data.train
        if KINDS.get(ckpt.kind).candidate_answers and ft.data.answer_list and Path(ft.data.answer_list).is_file():
            answers = load_answer_list(ft.data.answer_list)
    source = {
        "checkpoint": str(ckpt.path.resolve()),
        "step": ckpt.state.get("step"),
        "vlp_version": ckpt.state.get("vlp_version"),
        "data": [str(f) for f in data] if isinstance(data, list) else data,
    }
    return Loaded(ckpt.load(), ckpt.kind, ckpt.model_config, ckpt.tokenizer, ckpt.preprocessor, answers, k_test, source)


def config_dict(vm: VLPModel) -> dict:
    """The content of ``config.json`` for VLPModel ``vm``."""
    model_config = copy.deepcopy(vm.model_config)
    without_init_sources(model_config)
    out = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "vlp_version": __version__,
        "kind": vm.kind,
        "architecture": type(vm.model).__name__,
        "model": to_dict(model_config),
        "weights": {"file": WEIGHTS, "momentum_twins": "dropped", "queues": "dropped"},
        "source": vm.source,
    }
    if KINDS.get(vm.kind).candidate_answers:
        out[vm.kind] = {"k_test": vm.vqa_k_test, "answers": vm.answers}
    return out


def save_pretrained(vm: VLPModel, directory: str | os.PathLike) -> Path:
    """Write ``config.json``, ``model.safetensors`` (no momentum twins or queues), the tokenizer
    files and ``preprocessor.json`` into ``directory`` (written next to it, then renamed). An
    existing directory is replaced only if it is empty or an earlier ``save_pretrained`` output;
    a write that fails (a full disk: one :class:`~vlp.errors.CheckpointError` saying to free space
    or choose another folder) leaves it as it was. Returns the directory."""
    out = Path(directory)
    if out.exists() and any(out.iterdir()) and not (out / CONFIG).is_file():
        raise FileExistsError(f"{out} exists and is not a vlp save_pretrained directory; choose another")
    tmp = staging(out)
    kept = f"{out} is as it was" if out.exists() else f"nothing was left at {out}"
    advice = (
        f"free some space, or save to a folder on another disk; {kept} (the new files were written "
        f"to {tmp} first, now removed)"
    )
    with removed_on_failure(tmp, out, advice):
        save_tensors(inference_weights(vm.model), tmp / WEIGHTS, metadata={"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(config_dict(vm), indent=2) + "\n")
        (tmp / PREPROCESSOR).write_text(vm.preprocessor.to_json())
        vm.tokenizer.save_pretrained(str(tmp))
        return publish(tmp, out)


def push_to_hub(
    vm: VLPModel,
    repo_id: str,
    private: bool = False,
    token: Optional[str] = None,
    metrics: Optional[dict[str, float]] = None,
    data: Optional[str] = None,
    commit_message: Optional[str] = None,
) -> str:
    """Upload the :func:`save_pretrained` folder to the Hugging Face Hub repository ``repo_id``
    (created if needed), with a model card (``README.md``: kind, config, ``data``, ``metrics``);
    returns the commit URL. ``token``: default the logged-in user's (``hf auth login``)."""
    from vlp.interop.hub import model_card, upload

    with tempfile.TemporaryDirectory() as tmp:
        folder = save_pretrained(vm, Path(tmp) / "model")
        (folder / "README.md").write_text(model_card(config_dict(vm), metrics, data))
        return upload(folder, repo_id, private, token, commit_message)
