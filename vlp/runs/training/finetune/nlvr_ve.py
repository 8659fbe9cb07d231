"""``vlp finetune nlvr2`` and ``vlp finetune ve``: two recipes of the generic classification
fine-tuning (:class:`~vlp.runs.training.finetune.classification.ClassificationRecipe`), each the
kind's evaluation (:data:`vlp.runs.evaluation.by_kind.NLVR_CLASSIFICATION`,
:data:`~vlp.runs.evaluation.by_kind.VE_CLASSIFICATION`) with its training options.

Both have a baseline with blanked images (NLVR2's ``nlvr.text_only``, SNLI-VE's
``ve.hypothesis_only``); NLVR2's classifier takes two images, SNLI-VE reports the majority class.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import torch
from torch.utils.data import DataLoader

from vlp.kinds import NLVR2, VE
from vlp.models.nlvr import NLVRModel
from vlp.models.ve import VEModel
from vlp.runs.evaluation.by_kind import NLVR_CLASSIFICATION, VE_CLASSIFICATION
from vlp.runs.evaluation.classifier import classify_correct
from vlp.runs.training.finetune.classification import Blanked, ClassificationRecipe
from vlp.runs.training.finetune.registry import RUNNERS
from vlp.tasks.nlvr import NLVRTask
from vlp.tasks.ve import VETask

#: NLVR2: doubled fusion layers alternating between the two images (K/V shared per pair), a
#: classifier on [CLS]; ``nlvr.flip`` swaps the images and mirrors left/right in training
NLVR_RECIPE = ClassificationRecipe.of(
    NLVR_CLASSIFICATION,
    make_task=lambda job, cfg: NLVRTask(
        cast(NLVRModel, job.model), cfg.loss.alpha, cfg.loss.alpha_ramp_steps, cfg.loss.distill
    ),
    blanked=Blanked("text_only", lambda cfg: cfg.nlvr.text_only),
    train_options=lambda cfg: {"flip": cfg.nlvr.flip},
    images_of=lambda items: [SimpleNamespace(image=p, origin=it.origin) for it in items for p in it.images],
)

#: SNLI-VE (ALBEF's VE): fusion [CLS] -> 3-way classifier, the training labels' majority class
#: beside it; ``ve.hypothesis_only`` blanks every premise image
VE_RECIPE = ClassificationRecipe.of(
    VE_CLASSIFICATION,
    make_task=lambda job, cfg: VETask(
        cast(VEModel, job.model), cfg.loss.alpha, cfg.loss.alpha_ramp_steps, cfg.loss.distill
    ),
    blanked=Blanked("hypothesis_only", lambda cfg: cfg.ve.hypothesis_only),
)

run_finetune_nlvr = RUNNERS.register(NLVR2, NLVR_RECIPE.run)
run_finetune_ve = RUNNERS.register(VE, VE_RECIPE.run)


def nlvr_correct(model, loader: DataLoader, device: torch.device) -> torch.Tensor:
    """:func:`~vlp.runs.evaluation.classifier.classify_correct` of the NLVR2 model (two images and the sentence)."""
    return classify_correct(model, loader, device, NLVR_CLASSIFICATION.inputs)


def nlvr_accuracy(model, loader: DataLoader, device: torch.device) -> float:
    """Accuracy in percent over every example of ``loader`` (not a mean of batch means); eval mode
    inside, the model's modes restored after."""
    right = nlvr_correct(model, loader, device)
    return 100.0 * float(right.double().mean()) if len(right) else 0.0
