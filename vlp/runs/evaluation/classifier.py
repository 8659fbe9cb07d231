"""An image-text classification task (NLVR2, SNLI-VE, or an outside author's): what it brings, in
:class:`ImageTextClassification`, and its evaluation, :meth:`ImageTextClassification.evaluate`
(an evaluator of :data:`vlp.runs.evaluation.registry.EVALUATORS`): the accuracy of the argmax of
``model.classify(*inputs)`` over an annotation file. Its fine-tuning recipe
(:class:`vlp.runs.training.finetune.classification.ClassificationRecipe`) adds the training options
to the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from vlp.checkpoint import open_checkpoint
from vlp.data.ve import VECollator, VEDataset
from vlp.eval.mode import evaluating
from vlp.runs.evaluation.registry import write_metrics

PathLike = str | Path
#: the batch keys a one-image classifier's ``classify`` takes, in order
IMAGE_TEXT_INPUTS = ("images", "input_ids", "attention_mask")


@dataclass(frozen=True)
class ImageTextClassification:
    """What an image-text classification task brings.

    ``load``: ``(annotation file, image root or None) -> items``, each with ``label`` (the class
    index); with the default dataset also ``image`` (a path), ``sentence`` and ``origin`` (where it
    was read, for errors), e.g. :class:`vlp.data.downstream_formats.VEItem`. ``dataset``:
    ``(items, transform, **options) -> Dataset`` (default :class:`~vlp.data.ve.VEDataset`: one image
    and one sentence per item). ``collator``: ``(tokenizer, max_len) -> collate``, whose batches hold
    ``inputs`` and ``labels`` [B] (default :class:`~vlp.data.ve.VECollator`). ``inputs``: the batch
    keys ``model.classify`` takes, in order; it returns logits [B, C]. ``labels``: the class names by
    index (given: fine-tuning also reports the training labels' majority class)."""

    load: Callable[[PathLike, Optional[str]], Sequence[Any]]
    dataset: Callable[..., Dataset] = VEDataset
    collator: Callable[[Any, int], Callable] = VECollator
    inputs: tuple[str, ...] = IMAGE_TEXT_INPUTS
    labels: tuple[str, ...] = ()

    def evaluate(
        self,
        checkpoint: PathLike,
        data: PathLike,
        out: PathLike,
        image_root: Optional[str] = None,
        batch_size: int = 32,
    ) -> dict[str, Any]:
        """Accuracy (percent) and the item count of ``checkpoint``'s classifier on the annotation file
        ``data``, with the checkpoint's own preprocessing; written to ``out/metrics.json``."""
        opened = open_checkpoint(checkpoint, load=False)
        model = opened.load()  # on the default device, in eval mode
        items = self.load(data, image_root)
        dataset = self.dataset(items, opened.preprocessor.image_transform())
        collate = self.collator(opened.tokenizer, opened.preprocessor.max_len)
        loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate)
        right = classify_correct(model, loader, next(model.parameters()).device, self.inputs)
        acc = 100.0 * float(right.double().mean()) if len(right) else 0.0
        return write_metrics(out, {"acc": acc, "n": len(right)})


@torch.no_grad()
def classify_correct(model, loader: DataLoader, device: torch.device, inputs: Sequence[str]) -> torch.Tensor:
    """1 for every example of ``loader`` that ``model.classify(*batch[inputs])`` classifies right
    (argmax == ``labels``), else 0: [n] long on ``device``, in order. Eval mode inside, the model's
    modes restored after."""
    out = [torch.zeros(0, dtype=torch.long, device=device)]
    with evaluating(model):
        for batch in loader:
            logits = model.classify(*(batch[k].to(device, non_blocking=True) for k in inputs))
            out.append((logits.argmax(-1) == batch["labels"].to(device)).long())
    return torch.cat(out)
