"""The evaluation commands: ``vlp evaluate retrieval`` (:mod:`~vlp.runs.evaluation.image_text_retrieval`),
``vlp evaluate classification`` (zero-shot: :mod:`~vlp.runs.evaluation.zero_shot_classification`),
``vlp evaluate grounding`` (Grad-CAM: :mod:`~vlp.runs.evaluation.gradcam_grounding`), ``vlp explain``
(:mod:`~vlp.runs.evaluation.explain`), and a checkpoint evaluated by its kind's evaluator
(:mod:`~vlp.runs.evaluation.by_kind`; ``vlp evaluate vqa|nlvr2|ve|...``).

The evaluators are in :data:`~vlp.runs.evaluation.registry.EVALUATORS`, each registered by the
module that defines it; importing this package imports those modules, so every built-in one is there."""

from vlp.runs.evaluation import by_kind, gradcam_grounding
from vlp.runs.evaluation.classifier import ImageTextClassification
from vlp.runs.evaluation.registry import EVALUATORS, Evaluator, write_metrics

__all__ = ["EVALUATORS", "Evaluator", "ImageTextClassification", "by_kind", "gradcam_grounding", "write_metrics"]
