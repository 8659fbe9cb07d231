"""Evaluating a checkpoint with its kind's evaluator (:data:`~vlp.runs.evaluation.registry.EVALUATORS`):
:func:`run_evaluate`, and the evaluators of the built-in kinds the other evaluation modules do not
provide, each registered here: retrieval (pretrain, helper, retrieval checkpoints), VQA, and the
image-text classifications NLVR2 and SNLI-VE (:class:`~vlp.runs.evaluation.classifier.ImageTextClassification`,
whose fine-tuning recipes extend them).

Every evaluator is ``(checkpoint, data, out, image_root=None, **options) -> metrics dict``: it
evaluates the checkpoint folder or run directory ``checkpoint`` on the annotation file ``data``
(relative image paths under ``image_root``, default the file's folder), writes ``out/metrics.json``
and returns what it wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from vlp.checkpoint import open_checkpoint
from vlp.data.downstream_formats import VE_LABELS, load_nlvr, load_ve
from vlp.data.nlvr import NLVRCollator, NLVRDataset
from vlp.kinds import HELPER, NLVR2, PRETRAIN, RETRIEVAL, VE, VQA
from vlp.runs.evaluation.classifier import ImageTextClassification
from vlp.runs.evaluation.registry import EVALUATORS, write_metrics

PathLike = str | Path

__all__ = ["NLVR_CLASSIFICATION", "VE_CLASSIFICATION", "evaluate_retrieval", "evaluate_vqa", "run_evaluate"]


def run_evaluate(
    checkpoint: PathLike,
    data: PathLike,
    out: PathLike,
    task: Optional[str] = None,
    image_root: Optional[str] = None,
    **options: Any,
) -> dict[str, Any]:
    """Evaluate ``checkpoint`` on ``data`` with the evaluator of ``task`` (default: the checkpoint's
    own kind, read from its ``state.json``) and its ``options``; returns the metrics (also in
    ``out/metrics.json``). A kind without an evaluator raises :class:`vlp.registry.UnknownName`
    naming those that have one."""
    name = task or open_checkpoint(checkpoint, load=False).kind
    return EVALUATORS.get(name)(checkpoint, data, out, image_root=image_root, **options)


@EVALUATORS.register(HELPER)
@EVALUATORS.register(RETRIEVAL)
@EVALUATORS.register(PRETRAIN)
def evaluate_retrieval(
    checkpoint: PathLike, data: PathLike, out: PathLike, image_root: Optional[str] = None
) -> dict[str, Any]:
    """Zero-shot retrieval on a Karpathy-style split (:func:`vlp.runs.evaluation.image_text_retrieval.run_evaluate_retrieval`,
    no relevance file); its metrics."""
    from vlp.runs.evaluation.image_text_retrieval import run_evaluate_retrieval

    return dict(run_evaluate_retrieval(checkpoint, data, None, out, image_root, show_progress=False).metrics)


@EVALUATORS.register(VQA)
def evaluate_vqa(checkpoint: PathLike, data: PathLike, out: PathLike, image_root: Optional[str] = None) -> dict:
    """VQA accuracy (ALBEF's and the official one) of the checkpoint's ranked answers
    (:meth:`vlp.api.VLPModel.answer`, its stored answer list) on a VQA file with answers."""
    from vlp.api import VLPModel
    from vlp.data.downstream_formats import load_vqa
    from vlp.eval.vqa import mean_vqa_accuracy

    questions = load_vqa([data], image_root)
    preds = VLPModel.from_pretrained(checkpoint).answer([q.image for q in questions], [q.question for q in questions])
    raw = [q.raw_answers for q in questions]
    return write_metrics(
        out,
        {
            "acc": mean_vqa_accuracy(preds, raw),
            "acc_official": mean_vqa_accuracy(preds, raw, official=True),
            "n": len(questions),
        },
    )


#: NLVR2: a sentence about two images (``images0``, ``images1``), True / False
NLVR_CLASSIFICATION = ImageTextClassification(
    load=load_nlvr,
    dataset=NLVRDataset,
    collator=NLVRCollator,
    inputs=("images0", "images1", "input_ids", "attention_mask"),
)
#: SNLI-VE: an image premise and a hypothesis, :data:`~vlp.data.downstream_formats.VE_LABELS`
VE_CLASSIFICATION = ImageTextClassification(load=load_ve, labels=VE_LABELS)
EVALUATORS.register(NLVR2, NLVR_CLASSIFICATION.evaluate)
EVALUATORS.register(VE, VE_CLASSIFICATION.evaluate)
