"""One way to open a checkpoint (:func:`vlp.checkpoint.open_checkpoint`): found, verified and read
once, whoever opens it; training checkpoints carry their preprocessing (``preprocessor.json``)."""

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import safetensors.torch
import torch

from tests.helpers import QUICK, ROOT, SHAPES_TINY, TINY_ALBEF
from vlp import VLPModel, weights
from vlp.checkpoint import PREPROCESSOR, Checkpoint, Preprocessor, open_checkpoint, preprocessor_of
from vlp.cli import main
from vlp.config import FinetuneConfig, FinetuneDataConfig, PretrainConfig, load_config, to_dict
from vlp.models.albef import ALBEF
from vlp.runs.training.finetune import finetune_job
from vlp.weights import MANIFEST, save_checkpoint, step_checkpoints

CONFIG = ROOT / SHAPES_TINY
CPU = torch.device("cpu")
TINY = [*TINY_ALBEF, "model.embed_dim=32", *QUICK, "train.steps=2", "train.ckpt_every=1"]
WORLD = dict(seed=3, n_train=16, n_val=2, n_test=6)
PRETRAIN = TINY


@pytest.fixture(scope="module")
def run(pretrained: Path) -> Path:
    """A tiny pretraining run (2 steps, a checkpoint after each), through the command line."""
    return pretrained


def count_reads(monkeypatch) -> Counter:
    """Counts, by file name, every text read of a file (``Path.read_text``: ``state.json``) and every
    safetensors load (``model.safetensors``), and every manifest verification (``"verify"``)."""
    counts: Counter = Counter()
    read_text, load_file, verify = Path.read_text, safetensors.torch.load_file, weights.verify_checkpoint

    def counted_read_text(self, *args, **kwargs):
        counts[self.name] += 1
        return read_text(self, *args, **kwargs)

    def counted_load_file(filename, *args, **kwargs):
        counts[Path(filename).name] += 1
        return load_file(filename, *args, **kwargs)

    def counted_verify(ckpt, require=()):
        counts["verify"] += 1
        return verify(ckpt, require)

    monkeypatch.setattr(Path, "read_text", counted_read_text)
    monkeypatch.setattr(weights, "verify_checkpoint", counted_verify)
    for module in list(sys.modules.values()):  # every module that imported load_file by name
        if module is not None and vars(module).get("load_file") is load_file:
            monkeypatch.setattr(module, "load_file", counted_load_file)
    return counts


def test_evaluate_retrieval_reads_the_checkpoint_once(run, world, tmp_path, monkeypatch, capsys):
    counts = count_reads(monkeypatch)
    argv = ["evaluate", "retrieval", "--checkpoint", str(run), "--data", str(world["retrieval_test"])]
    assert main([*argv, "--out", str(tmp_path / "ev"), "eval.k_test=2"]) == 0
    reads = {k: counts[k] for k in ("verify", "state.json", "model.safetensors")}
    assert reads == {"verify": 1, "state.json": 1, "model.safetensors": 1}
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert metrics["checkpoint"] == str(step_checkpoints(run)[-1]) and metrics["checkpoint_kind"] == "pretrain"


def test_the_inference_api_and_the_finetuning_job_read_it_once(run, monkeypatch):
    counts = count_reads(monkeypatch)
    VLPModel.from_pretrained(run, device="cpu")
    assert {k: counts[k] for k in ("verify", "state.json", "model.safetensors")} == {
        "verify": 1,
        "state.json": 1,
        "model.safetensors": 1,
    }
    counts.clear()
    cfg = FinetuneConfig(task="retrieval", pretrained=str(run), data=FinetuneDataConfig(train=["unread.json"]))
    job = finetune_job(cfg)
    assert {k: counts[k] for k in ("verify", "state.json", "model.safetensors")} == {
        "verify": 1,
        "state.json": 1,
        "model.safetensors": 1,
    }
    assert job.source == step_checkpoints(run)[-1] and job.kind == "retrieval"


def test_open_checkpoint_returns_kind_config_model_tokenizer_and_preprocessing(run):
    ckpt = open_checkpoint(run, CPU)
    assert isinstance(ckpt, Checkpoint) and ckpt.path == step_checkpoints(run)[-1]
    assert (ckpt.kind, ckpt.step, ckpt.state["task"]) == ("pretrain", 2, "pretrain")
    assert isinstance(ckpt.config, PretrainConfig) and ckpt.pretrain_config is ckpt.config
    assert ckpt.model_config is ckpt.config.model and ckpt.model_config.text.init == "random"
    assert isinstance(ckpt.model, ALBEF) and not ckpt.model.training and ckpt.load() is ckpt.model
    assert len(ckpt.tokenizer) == ckpt.model.text.embeddings.word_embeddings.num_embeddings
    assert ckpt.preprocessor == Preprocessor(64, ckpt.config.data.image.mean, ckpt.config.data.image.std, 32)
    # not loaded: nothing built until asked (e.g. after the kind is checked)
    later = open_checkpoint(run, load=False)
    assert later.model is None and later.tokenizer is None
    model = later.load(CPU)
    assert later.model is model and later.tokenizer is not None
    for a, b in zip(model.state_dict().values(), ckpt.model.state_dict().values()):
        assert torch.equal(a, b)


def test_training_checkpoints_save_their_preprocessing_in_the_manifest(run):
    cfg = load_config(PretrainConfig, CONFIG, [f"output_dir={run}", *TINY])
    want = preprocessor_of("pretrain", cfg, cfg.model)
    checkpoints = step_checkpoints(run)
    assert [p.name for p in checkpoints] == ["step_0000001", "step_0000002"]
    for ckpt in checkpoints:
        assert Preprocessor.read(ckpt / PREPROCESSOR) == want
        assert PREPROCESSOR in json.loads((ckpt / MANIFEST).read_text())["files"]
    assert VLPModel.from_pretrained(run, device="cpu").preprocessor == want


def _hand_made(tmp_path: Path, files=None) -> tuple[Path, PretrainConfig]:
    cfg = load_config(PretrainConfig, CONFIG, TINY)
    torch.manual_seed(0)
    state = {"task": "pretrain", "config": to_dict(cfg), "step": 0}
    return save_checkpoint(tmp_path / "ckpt", ALBEF(cfg.model), state, files=files), cfg


def test_a_checkpoint_without_preprocessor_json_gets_it_from_its_config(tmp_path):
    path, cfg = _hand_made(tmp_path)
    assert not (path / PREPROCESSOR).exists()
    ckpt = open_checkpoint(path, load=False)
    assert ckpt.preprocessor == preprocessor_of("pretrain", cfg, cfg.model)
    assert ckpt.preprocessor.image_size == 64 and ckpt.preprocessor.max_len == 32


def test_a_saved_preprocessor_json_is_what_is_read(tmp_path):
    saved = Preprocessor(64, [0.5, 0.5, 0.5], [0.25, 0.25, 0.25], 7)
    path, _ = _hand_made(tmp_path, files={PREPROCESSOR: saved.to_json()})
    assert PREPROCESSOR in json.loads((path / MANIFEST).read_text())["files"]
    assert open_checkpoint(path, load=False).preprocessor == saved
    assert VLPModel.from_pretrained(path, device="cpu").preprocessor == saved


def test_a_finetuned_kind_is_read_with_its_finetuning_settings(tmp_path):
    cfg = load_config(PretrainConfig, CONFIG, TINY)
    ft = FinetuneConfig(task="vqa", data=FinetuneDataConfig(max_len=25))
    state = {"task": "vqa", "config": to_dict(ft), "model": to_dict(cfg.model), "step": 3}
    from vlp.models.build import build_model_of_kind

    path = save_checkpoint(tmp_path / "vqa", build_model_of_kind("vqa", cfg.model, 30522), state)
    ckpt = open_checkpoint(path, load=False)
    assert ckpt.kind == "vqa" and isinstance(ckpt.config, FinetuneConfig) and ckpt.step == 3
    assert ckpt.pretrain_config.eval == ft.eval and ckpt.pretrain_config.data.image == ft.data.image
    pre = ckpt.preprocessor
    assert (pre.max_len, pre.caption_cleaning, pre.answer_max_len) == (25, "pre_question", ft.vqa.answer_max_len)
