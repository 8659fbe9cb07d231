"""Fine-tuning any image-text classification task: :class:`ClassificationRecipe` and its
:meth:`~ClassificationRecipe.run` (a runner of :data:`~vlp.runs.training.finetune.registry.RUNNERS`).

Train a classifier (``model.classify(*inputs) -> logits [B, C]``, + momentum distillation), validate
by dev accuracy keeping the best checkpoint, and report the best checkpoint's accuracy on val and
test, each rank classifying a contiguous shard of the items. NLVR2 and SNLI-VE are two recipes
(:mod:`~vlp.runs.training.finetune.nlvr_ve`, extending their evaluations in
:mod:`vlp.runs.evaluation.by_kind`); a task of outside code is one more::

    TOY = ClassificationRecipe(load=read_toy, labels=("no", "yes"))
    RUNNERS.register("toy", TOY.run)
    EVALUATORS.register("toy", TOY.evaluate)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Optional

from torch import nn

from vlp.config import FinetuneConfig
from vlp.dist import gather_rows
from vlp.runs.evaluation.classifier import ImageTextClassification, classify_correct
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
from vlp.tasks.classification import ClassificationTask


def default_task(job: Job, cfg: FinetuneConfig, inputs: tuple[str, ...]) -> nn.Module:
    """:class:`~vlp.tasks.classification.ClassificationTask` of the job's model: cross-entropy with the
    run's distillation (``loss.alpha``, ``loss.alpha_ramp_steps``, ``loss.distill``), its loss logged
    under the task's name."""
    loss = cfg.loss
    return ClassificationTask(job.model, inputs, cfg.task, loss.alpha, loss.alpha_ramp_steps, loss.distill)


@dataclass(frozen=True)
class Blanked:
    """A blanked-image baseline: every image the same zero tensor when ``on(cfg)``; the results
    record the switch under ``key`` (NLVR2's ``text_only``, SNLI-VE's ``hypothesis_only``)."""

    key: str
    on: Callable[[FinetuneConfig], bool]


@dataclass(frozen=True)
class ClassificationRecipe(ImageTextClassification):
    """What one classification task brings to :meth:`run`: the data and classifier inputs of
    :class:`~vlp.runs.evaluation.classifier.ImageTextClassification`, and optionally ``make_task``
    (``(job, cfg) -> task``, default :func:`default_task`), ``blanked`` (a blanked-image baseline),
    ``train_options`` (``cfg -> keywords`` of the training dataset, e.g. NLVR2's flip, also
    recorded in the results) and ``images_of`` (``items -> objects with image and origin``, what the
    bad-sample check reads; default the items)."""

    make_task: Optional[Callable[[Job, FinetuneConfig], nn.Module]] = None
    blanked: Optional[Blanked] = None
    train_options: Callable[[FinetuneConfig], dict] = lambda cfg: {}
    images_of: Callable[[list], list] = lambda items: items

    @classmethod
    def of(cls, task: ImageTextClassification, **training: Any) -> ClassificationRecipe:
        """The recipe of the evaluated ``task`` (its data fields) with the ``training`` fields."""
        return cls(**{f.name: getattr(task, f.name) for f in fields(task)}, **training)

    def run(self, cfg: FinetuneConfig) -> dict:
        """Fine-tune, validate and test the task (module doc); the results (``results.json``)."""
        job = finetune_job(cfg)
        d = cfg.data
        train_items = [it for path in d.train for it in self.load(path, d.image_root)]
        evals = {name: list(self.load(getattr(d, name), d.image_root)) for name in ("val", "test") if getattr(d, name)}
        blank = self.blanked is not None and self.blanked.on(cfg)
        collate = self.collator(job.tokenizer, d.max_len)
        test_tf = ConstantImage(job.res) if blank else job.test_transform()
        options = self.train_options(cfg)
        train_set = self.dataset(
            train_items,
            ConstantImage(job.res) if blank else job.train_transform(),
            **options,
            **job.bad_samples(self.images_of(train_items)),
        )
        start(job, make_loader(job, train_set, collate, train=True), len(train_items))

        def accuracy(items: list) -> float:
            """Every rank classifies its contiguous shard of ``items``; accuracy over all of them."""
            bounds, shard = shard_of(items)
            loader = make_loader(job, self.dataset(shard, test_tf), collate, train=False)
            right = classify_correct(job.model, loader, job.device, self.inputs)
            return 100.0 * float(gather_rows(right, bounds).double().mean()) if len(items) else 0.0

        validate = (lambda _task, _step: {"acc": accuracy(evals["val"])}) if "val" in evals else None
        task = self.make_task(job, cfg) if self.make_task else default_task(job, cfg, self.inputs)
        fit(job, task, validate, "acc")
        results: dict[str, Any] = {"task": cfg.task, **({self.blanked.key: blank} if self.blanked else {}), **options}
        majority = self._majority(train_items, results)
        results["best"] = str(load_best(job))
        for name, items in evals.items():
            results[name] = {"acc": accuracy(items), "n": len(items)}
            if majority is not None:
                results[name]["majority_acc"] = 100.0 * sum(it.label == majority for it in items) / len(items)
        return write_results(job, results)

    def _majority(self, train_items: list, results: dict[str, Any]) -> Optional[int]:
        """With :attr:`labels`: the training labels' majority class (its name into ``results``), else None."""
        if not self.labels:
            return None
        majority = max(range(len(self.labels)), key=lambda c: sum(it.label == c for it in train_items))
        results["majority_class"] = self.labels[majority]
        return majority
