"""The evaluation commands: ``vlp evaluate retrieval`` (:mod:`~vlp.runs.evaluation.image_text_retrieval`),
``vlp evaluate classification`` (zero-shot: :mod:`~vlp.runs.evaluation.zero_shot_classification`),
``vlp evaluate grounding`` (Grad-CAM: :mod:`~vlp.runs.evaluation.gradcam_grounding`), ``vlp explain``
(:mod:`~vlp.runs.evaluation.explain`), and a checkpoint evaluated by its kind's evaluator
(:mod:`~vlp.runs.evaluation.by_kind`)."""
