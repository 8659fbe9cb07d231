"""``vlp finetune nlvr2`` and ``vlp finetune ve``: one classification recipe.

Both train a classifier on the fusion [CLS] state (+ distillation), validate by dev accuracy
keeping the best checkpoint, and report the best checkpoint's accuracy on val and test, each rank
classifying a contiguous shard of the items. Both have a baseline with blanked images (NLVR2's
``nlvr.text_only``, SNLI-VE's ``ve.hypothesis_only``). What differs is a :class:`Recipe`: how the
items are read, batched and fed to the model, the task, and SNLI-VE's majority-class baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Sequence, cast

import torch
from torch import nn
from torch.utils.data import DataLoader

from vlp.config import FinetuneConfig
from vlp.dist import gather_rows
from vlp.eval.mode import evaluating
from vlp.runs.training.finetune.recipe import (
    ConstantImage,
    finetune_job,
    fit,
    load_best,
    make_loader,
    shard_of,
    start,
    write_results,
)
from vlp.runs.training.job import Job


@dataclass
class Recipe:
    """What one classification task brings to :func:`run_classification`."""

    load: Callable[..., list]  # (file, image root or None) -> items
    dataset: Callable[..., Any]  # (items, transform, **options) -> Dataset
    collator: Callable[..., Any]  # (tokenizer, max_len) -> collate function
    inputs: tuple[str, ...]  # the batch keys model.classify takes, in order
    make_task: Callable[[Job, FinetuneConfig], nn.Module]
    blank_key: str  # the results key of the blanked-image baseline's switch
    blank: Callable[[FinetuneConfig], bool]
    train_options: Callable[[FinetuneConfig], dict] = lambda cfg: {}  # e.g. NLVR2's flip
    images_of: Callable[[list], list] = lambda items: items  # what the bad-sample accounting sees
    majority: Sequence[str] = ()  # class names: report the training labels' majority class


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


def run_classification(cfg: FinetuneConfig, recipe: Recipe) -> dict:
    """Fine-tune, validate and test one classification task (module doc)."""
    job = finetune_job(cfg)
    d = cfg.data
    train_items = [it for path in d.train for it in recipe.load(path, d.image_root)]
    evals = {name: recipe.load(getattr(d, name), d.image_root) for name in ("val", "test") if getattr(d, name)}
    blank = recipe.blank(cfg)
    collate = recipe.collator(job.tokenizer, d.max_len)
    train_tf = ConstantImage(job.res) if blank else job.train_transform()
    test_tf = ConstantImage(job.res) if blank else job.test_transform()
    options = recipe.train_options(cfg)
    bad = job.bad_samples(recipe.images_of(train_items))
    train_set = recipe.dataset(train_items, train_tf, **options, **bad)
    start(job, make_loader(job, train_set, collate, train=True), len(train_items))

    def accuracy(items) -> float:
        """Every rank classifies its contiguous shard of ``items``; accuracy over all of them."""
        bounds, shard = shard_of(items)
        loader = make_loader(job, recipe.dataset(shard, test_tf), collate, train=False)
        right = classify_correct(job.model, loader, job.device, recipe.inputs)
        return 100.0 * float(gather_rows(right, bounds).double().mean()) if len(items) else 0.0

    validate = (lambda _task, _step: {"acc": accuracy(evals["val"])}) if "val" in evals else None
    fit(job, recipe.make_task(job, cfg), validate, "acc")
    results: dict[str, Any] = {"task": cfg.task, recipe.blank_key: blank, **options}
    majority = None
    if recipe.majority:
        majority = max(range(len(recipe.majority)), key=lambda c: sum(it.label == c for it in train_items))
        results["majority_class"] = recipe.majority[majority]
    results["best"] = str(load_best(job))
    for name, items in evals.items():
        results[name] = {"acc": accuracy(items), "n": len(items)}
        if majority is not None:
            results[name]["majority_acc"] = 100.0 * sum(it.label == majority for it in items) / len(items)
    return write_results(job, results)


# ----------------------------------------------------------------------------- NLVR2

NLVR_INPUTS = ("images0", "images1", "input_ids", "attention_mask")


def nlvr_recipe() -> Recipe:
    """Doubled fusion layers alternating between the two images (K/V shared per pair), a
    classifier on [CLS]; ``nlvr.flip`` swaps the images and mirrors left/right in training."""
    from vlp.data.formats import load_nlvr
    from vlp.data.nlvr import NLVRCollator, NLVRDataset
    from vlp.tasks.nlvr import NLVRTask

    return Recipe(
        load=load_nlvr,
        dataset=NLVRDataset,
        collator=NLVRCollator,
        inputs=NLVR_INPUTS,
        make_task=lambda job, cfg: NLVRTask(job.model, cfg.loss.alpha, cfg.loss.alpha_ramp_steps, cfg.loss.distill),
        blank_key="text_only",
        blank=lambda cfg: cfg.nlvr.text_only,
        train_options=lambda cfg: {"flip": cfg.nlvr.flip},
        images_of=lambda items: [SimpleNamespace(image=p, origin=it.origin) for it in items for p in it.images],
    )


def run_finetune_nlvr(cfg: FinetuneConfig) -> dict:
    """NLVR2 (:func:`nlvr_recipe`): dev accuracy selects the best checkpoint; test accuracy at the end."""
    return run_classification(cfg, nlvr_recipe())


def nlvr_correct(model, loader: DataLoader, device: torch.device) -> torch.Tensor:
    """:func:`classify_correct` of the NLVR2 model (two images and the sentence)."""
    return classify_correct(model, loader, device, NLVR_INPUTS)


def nlvr_accuracy(model, loader: DataLoader, device: torch.device) -> float:
    """Accuracy in percent over every example of ``loader`` (not a mean of batch means); eval mode
    inside, the model's modes restored after."""
    right = nlvr_correct(model, loader, device)
    return 100.0 * float(right.double().mean()) if len(right) else 0.0


# ----------------------------------------------------------------------------- SNLI-VE


def ve_recipe() -> Recipe:
    """ALBEF's VE: fusion [CLS] -> 3-way classifier; the majority class of the training labels
    beside it; ``ve.hypothesis_only`` blanks every premise image."""
    from vlp.data.downstream_formats import VE_LABELS, load_ve
    from vlp.data.ve import VECollator, VEDataset
    from vlp.models.ve import VEModel
    from vlp.tasks.ve import VETask

    return Recipe(
        load=load_ve,
        dataset=VEDataset,
        collator=VECollator,
        inputs=("images", "input_ids", "attention_mask"),
        make_task=lambda job, cfg: VETask(
            cast(VEModel, job.model), cfg.loss.alpha, cfg.loss.alpha_ramp_steps, cfg.loss.distill
        ),
        blank_key="hypothesis_only",
        blank=lambda cfg: cfg.ve.hypothesis_only,
        majority=VE_LABELS,
    )


def run_finetune_ve(cfg: FinetuneConfig) -> dict:
    """SNLI-VE (:func:`ve_recipe`): dev accuracy selects the best checkpoint; test accuracy at the
    end, next to the majority class's."""
    return run_classification(cfg, ve_recipe())
