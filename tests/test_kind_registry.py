"""The kind registry (:mod:`vlp.kinds`, issue 43 item 1): every built-in kind resolves, and a task
defined entirely here - model class, data format, runner, evaluator - registered from the test runs
through the public ``vlp finetune`` command and :func:`vlp.runs.evaluation.by_kind.run_evaluate` end to
end, with no file under vlp/ naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from tests.helpers import FT, QUICK, TINY_ALBEF
from vlp.checkpoint import open_checkpoint
from vlp.cli import main
from vlp.config import FinetuneConfig, ModelConfig, TextConfig, VisionConfig
from vlp.kinds import (
    Kind,
    UnknownKind,
    checkpoint_kinds,
    finetune_kinds,
    kind,
    kind_names,
    kinds_with,
    register_kind,
    resolve,
    unregister_kind,
)
from vlp.models.albef import ALBEF
from vlp.models.build import build_model_of_kind
from vlp.preprocess.images import open_image
from vlp.preprocess.transforms import tokenize
from vlp.runs.evaluation.by_kind import run_evaluate, write_metrics
from vlp.runs.training.finetune.recipe import finetune_job, fit, make_loader, start, write_results
from vlp.tasks.base import Task
from vlp.weights import find_checkpoint

WORLD = dict(seed=5, n_train=16, n_val=4, n_test=4)
PRETRAIN = [*TINY_ALBEF, "model.queue_size=16", "model.embed_dim=32", *QUICK, "train.steps=2"]
TOY = "toy-match"

# ----------------------------------------------------------------------------- the toy task


class ToyMatchModel(ALBEF):
    """A binary image-text match classifier: the ALBEF fusion encoder and its ITM head, no MLM head."""

    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__(cfg, mlm=False)

    def classify(self, images: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Match logits [B, 2] of aligned pairs."""
        fused = self.fuse(self.text_states(input_ids, attention_mask), attention_mask, self.encode_image(images).tokens)
        return self.itm_logits(fused)


class ToyTask(Task):
    """Cross-entropy of the match logits against ``labels`` (1: the caption describes the image)."""

    def forward(self, batch: dict[str, torch.Tensor], step: int = 0) -> dict[str, torch.Tensor]:
        args = (batch["images"], batch["input_ids"], batch["attention_mask"])
        return self.distilled_classification(self.model.classify, args, batch["labels"], step, "match")


def read_toy(path: str | Path, image_root: Optional[str] = None) -> list[dict[str, Any]]:
    """The toy format: a JSON list of ``{"image", "caption", "match": 0|1}``, images under the file's folder."""
    root = Path(image_root) if image_root else Path(path).parent
    return [{**e, "image": str(root / e["image"])} for e in json.loads(Path(path).read_text())]


class ToyDataset(Dataset):
    def __init__(self, items: list[dict[str, Any]], transform) -> None:
        self.items, self.transform = items, transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: Any) -> dict[str, Any]:
        i = int(getattr(index, "index", index))  # the training loader's indices are SeededIndex
        e = self.items[i]
        return {
            "image": self.transform(open_image(e["image"], f"toy {i}")),
            "caption": e["caption"],
            "label": e["match"],
        }


def toy_collate(tokenizer, max_len: int):
    def collate(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        tok = tokenize(tokenizer, [r["caption"] for r in rows], max_len)
        images = torch.stack([r["image"] for r in rows])
        return {"images": images, **tok, "labels": torch.tensor([r["label"] for r in rows])}

    return collate


def run_toy(cfg: FinetuneConfig) -> dict:
    job = finetune_job(cfg)
    items = [it for path in cfg.data.train for it in read_toy(path, cfg.data.image_root)]
    loader = make_loader(job, ToyDataset(items, job.train_transform()), toy_collate(job.tokenizer, 32), train=True)
    start(job, loader, len(items))
    fit(job, ToyTask(job.model), None, "acc")
    return write_results(job, {"task": cfg.task, "checkpoint": str(find_checkpoint(job.run_dir))})


@torch.no_grad()
def evaluate_toy(checkpoint, data, out, image_root: Optional[str] = None) -> dict:
    opened = open_checkpoint(checkpoint, torch.device("cpu"))
    model: Any = opened.model
    items = read_toy(data, image_root)
    dataset = ToyDataset(items, opened.preprocessor.image_transform())
    batch = toy_collate(opened.tokenizer, opened.preprocessor.max_len)([dataset[i] for i in range(len(items))])
    right = model.classify(batch["images"], batch["input_ids"], batch["attention_mask"]).argmax(-1) == batch["labels"]
    return write_metrics(out, {"acc": 100.0 * float(right.double().mean()), "n": len(items), "kind": opened.kind})


@pytest.fixture
def toy_kind():
    entry = register_kind(
        Kind(
            TOY,
            ToyMatchModel,
            about="toy: does the caption describe the image",
            finetune=run_toy,
            evaluate=evaluate_toy,
        )
    )
    try:
        yield entry
    finally:
        unregister_kind(TOY)


def write_toy_file(world: dict[str, Path], path: Path) -> Path:
    """Each pretraining image of the world with its first caption (a match) and with another image's
    (a mismatch)."""
    pairs = json.loads(world["pretrain"].read_text())
    root = world["pretrain"].parent
    captions = [e["caption"][0] if isinstance(e["caption"], list) else e["caption"] for e in pairs]
    rows = []
    for i, e in enumerate(pairs):
        image = str((root / e["image"]).resolve())
        rows += [
            {"image": image, "caption": captions[i], "match": 1},
            {"image": image, "caption": captions[(i + len(pairs) // 2) % len(pairs)], "match": 0},
        ]
    path.write_text(json.dumps(rows))
    return path


# ----------------------------------------------------------------------------- tests


def test_a_task_registered_from_the_test_finetunes_and_evaluates_end_to_end(world, pretrained, tmp_path, toy_kind):
    data = write_toy_file(world, tmp_path / "toy.json")
    config = tmp_path / "toy.yaml"
    config.write_text(f"task: {TOY}\ndata:\n  max_len: 32\n")
    out = tmp_path / "run"
    assert TOY in finetune_kinds()
    args = ["finetune", TOY, "--config", str(config), f"output_dir={out}", f"pretrained={pretrained}"]
    assert main([*args, *FT, f"data.train=[{data}]"]) == 0
    results = json.loads((out / "results.json").read_text())
    state = json.loads((Path(results["checkpoint"]) / "state.json").read_text())
    assert results["task"] == TOY and state["task"] == TOY and state["step"] == 4
    ckpt = open_checkpoint(out, torch.device("cpu"))  # its kind builds the toy model and reads its config
    assert ckpt.kind == TOY and isinstance(ckpt.model, ToyMatchModel) and isinstance(ckpt.config, FinetuneConfig)
    metrics = run_evaluate(out, data, tmp_path / "ev")
    assert metrics == json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert metrics["kind"] == TOY and metrics["n"] == 2 * len(json.loads(world["pretrain"].read_text()))
    assert 0.0 <= metrics["acc"] <= 100.0


def test_the_toy_task_is_gone_after_it_is_unregistered(toy_kind):
    assert kind(TOY) is toy_kind
    unregister_kind(TOY)
    with pytest.raises(UnknownKind, match=r"unknown kind 'toy-match'; known kinds: \['pretrain'"):
        kind(TOY)
    register_kind(toy_kind)  # for the fixture's teardown
    with pytest.raises(ValueError, match="registered already"):
        register_kind(toy_kind)


def test_every_built_in_kind_resolves_its_model_runner_and_evaluator():
    cfg = ModelConfig(
        vision=VisionConfig(depth=1, img_size=32),
        text=TextConfig(layers=1, fusion_layers=1),
        queue_size=0,
        embed_dim=16,
    )
    for name in checkpoint_kinds():
        assert isinstance(build_model_of_kind(name, cfg, 30522), nn.Module), name
    for name in kind_names():
        entry = kind(name)
        assert callable(resolve(entry.model)), name
        assert entry.finetune is None or callable(entry.runner()), name
        assert entry.evaluate is None or callable(entry.evaluator()), name
        assert entry.saves_as in checkpoint_kinds(), name
        assert set(entry.actions) <= set(entry.capabilities), name
        assert all(callable(entry.action(method)) for method in entry.actions), name
    assert set(finetune_kinds()) >= {"retrieval", "vqa", "nlvr2", "nlvr-ta", "ve", "grounding"}
    assert kinds_with("similarity") == ("pretrain", "helper", "retrieval")
    assert {name for name in kind_names() if kind(name).evaluate is None} == {"nlvr-ta"}


def toy_answer(vm, images, questions, candidates=None, k=None, batch_size=None) -> list[str]:
    """The toy kind's ``answer`` action: whether gradients were on, once per question."""
    return [f"grad={torch.is_grad_enabled()}" for _ in vm.image_list(images)]


def test_vlpmodel_actions_go_through_the_registry(tmp_path):
    from vlp.api import UnsupportedKind, VLPModel
    from vlp.checkpoint import Preprocessor

    entry = register_kind(Kind("toy-answer", ToyMatchModel, capabilities=("answer",), actions={"answer": toy_answer}))
    try:
        pre = Preprocessor(image_size=16, mean=[0.5] * 3, std=[0.5] * 3, max_len=8)
        vm = VLPModel(nn.Linear(1, 1), entry.name, ModelConfig(), None, pre)
        assert vm.answer(torch.zeros(2, 3, 16, 16), ["q1", "q2"]) == ["grad=False", "grad=False"]
        with pytest.raises(UnsupportedKind, match=r"VLPModel.nlvr needs the NLVR2 classifier \(nlvr2 checkpoint\); "):
            vm.nlvr(torch.zeros(1, 3, 16, 16), torch.zeros(1, 3, 16, 16), "s")
    finally:
        unregister_kind(entry.name)
