"""Fine-tuning: ``vlp finetune TASK`` and ``vlp pretrain nlvr-ta``, one module per task (NLVR2 and
SNLI-VE are two recipes of the generic :mod:`~vlp.runs.training.finetune.classification`);
:func:`run_finetune` runs the task's runner in :data:`~vlp.runs.training.finetune.registry.RUNNERS`.
Importing this package imports every task module, so each built-in runner is registered.

Every run: read the pretrained checkpoint's model config, change the resolution (position
embedding interpolated) and any ``model_overrides``, build the task model, load the weights
(:func:`vlp.models.transfer.load_pretrained`) into a :class:`~vlp.runs.training.job.Job`, train with the
shared loop, validate every epoch keeping the best checkpoint, and evaluate the best checkpoint on
the test split at the end (:mod:`~vlp.runs.training.finetune.recipe`). Like the rest of :mod:`vlp.runs`,
this is glue: it reads files, the tasks and models never do.
"""

from __future__ import annotations

from vlp.config import FinetuneConfig
from vlp.locks import releasing_folders
from vlp.runs.evaluation.classifier import ImageTextClassification, classify_correct
from vlp.runs.training.finetune.classification import Blanked, ClassificationRecipe
from vlp.runs.training.finetune.grounding import run_finetune_grounding
from vlp.runs.training.finetune.nlvr_ta import run_nlvr_ta
from vlp.runs.training.finetune.nlvr_ve import nlvr_accuracy, nlvr_correct, run_finetune_nlvr, run_finetune_ve
from vlp.runs.training.finetune.recipe import ConstantImage, finetune_job, finetune_model_config, shard_of
from vlp.runs.training.finetune.registry import RUNNERS, Runner
from vlp.runs.training.finetune.retrieval import contrastive_task, run_finetune_retrieval
from vlp.runs.training.finetune.vqa import predict_answers, rank_answer_indices, run_finetune_vqa

__all__ = [
    "RUNNERS",
    "Blanked",
    "ClassificationRecipe",
    "ConstantImage",
    "ImageTextClassification",
    "Runner",
    "classify_correct",
    "contrastive_task",
    "finetune_job",
    "finetune_model_config",
    "nlvr_accuracy",
    "nlvr_correct",
    "predict_answers",
    "rank_answer_indices",
    "run_finetune",
    "run_finetune_grounding",
    "run_finetune_nlvr",
    "run_finetune_retrieval",
    "run_finetune_ve",
    "run_finetune_vqa",
    "run_nlvr_ta",
    "shard_of",
]


def run_finetune(cfg: FinetuneConfig) -> dict:
    """Fine-tune ``cfg.task`` with its registered runner; returns its results (``results.json``). The
    run directory is held for the run (:func:`vlp.locks.lock_folder`) and let go of when this returns or raises."""
    with releasing_folders():
        return RUNNERS.get(cfg.task)(cfg)
