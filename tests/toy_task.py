"""A binary image-text task written as outside code would write it (no file under vlp/ names it):
does the caption describe the image? Its Kind, model builder, fine-tuning runner (the generic
classification recipe) and evaluator are registered by :func:`register`; tests/test_kind_registry.py
runs it through ``vlp finetune toy-match`` and ``vlp evaluate toy-match``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from torch import nn

from vlp.data.downstream_formats import VEItem
from vlp.kinds import KINDS, Kind
from vlp.models.build import MODEL_BUILDERS
from vlp.models.ve import VEModel
from vlp.runs.evaluation import EVALUATORS
from vlp.runs.training.finetune import RUNNERS, ClassificationRecipe

NAME = "toy-match"


class ToyMatchModel(VEModel):
    """SNLI-VE's classifier on the fused [CLS] state, with two classes (0 mismatch, 1 match)."""

    def build_heads(self) -> None:
        hidden = self.text.config.hidden_size
        self.cls_head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))


def read_toy(path: str | Path, image_root: Optional[str] = None) -> list[VEItem]:
    """A JSON list of ``{"image", "caption", "match": 0|1}``, images under ``image_root`` or the file's folder."""
    root = Path(image_root or Path(path).parent)
    rows = json.loads(Path(path).read_text())
    return [VEItem(str(root / e["image"]), e["caption"], e["match"], f"{path} entry {i}") for i, e in enumerate(rows)]


RECIPE = ClassificationRecipe(load=read_toy, labels=("mismatch", "match"))


def register() -> None:
    KINDS.register(NAME, Kind(NAME, "toy: does the caption describe the image", finetuned=True))
    MODEL_BUILDERS.register(NAME, lambda cfg, vocab_size: ToyMatchModel(cfg))
    RUNNERS.register(NAME, RECIPE.run)
    EVALUATORS.register(NAME, RECIPE.evaluate)


def unregister() -> None:
    for registry in (EVALUATORS, RUNNERS, MODEL_BUILDERS, KINDS):
        registry.unregister(NAME)
