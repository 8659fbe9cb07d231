"""Fine-tuning: ``vlp finetune retrieval|vqa|nlvr2|ve|grounding`` and ``vlp pretrain nlvr-ta``.

Every run: read the pretrained checkpoint's model config, change the resolution (position
embedding interpolated) and any ``model_overrides``, build the task model, load the weights
(:func:`vlp.models.transfer.load_pretrained`) into a :class:`~vlp.runs.common.Job`, train with the
shared loop, validate every epoch keeping the best checkpoint, and evaluate the best checkpoint on
the test split at the end. Like the rest of :mod:`vlp.runs`, this is glue: it reads files, the tasks
and models never do.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence, cast

import torch
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader

from vlp.config import FinetuneConfig, ModelConfig, apply_overrides
from vlp.data.datasets import Collator, ImageTextDataset, train_loader
from vlp.data.formats import Sample, load_pairs, load_retrieval_split
from vlp.data.transforms import load_tokenizer
from vlp.dist import OtherRankDone, gather_rows, rank, shard_bounds, world_size
from vlp.errors import ConfigError, DataError
from vlp.eval.mode import evaluating
from vlp.models.build import build_task_model
from vlp.models.transfer import load_pretrained
from vlp.pretrained import checkpoint_model_config
from vlp.runs.common import Job, build_reconstruction, check_image_paths, check_queue, load_targets_for, token_info
from vlp.train.validation import Validation
from vlp.weights import find_checkpoint, load_weights, read_state


def finetune_model_config(cfg: FinetuneConfig, source_state: dict[str, Any]) -> ModelConfig:
    """The pretrained checkpoint's model config with ``image_size`` and ``model_overrides`` applied."""
    model = checkpoint_model_config(source_state)
    if model.arch != "albef":
        raise ConfigError(
            f"config key 'pretrained': {cfg.pretrained} is a model.arch={model.arch} checkpoint; "
            "fine-tuning needs an ALBEF checkpoint (fusion encoder)"
        )
    if cfg.image_size is not None:
        model.vision.img_size = cfg.image_size
    model = apply_overrides(model, cfg.model_overrides)
    model.text.init, model.vision.pretrained = "random", None  # every weight comes from the checkpoint
    return model


def finetune_job(cfg: FinetuneConfig, kind: Optional[str] = None) -> Job:
    """The job of every fine-tuning run, before its data: the model of checkpoint kind ``kind``
    (default ``cfg.task``) with the pretrained checkpoint's weights (seeded first)."""
    if not cfg.pretrained:
        raise ConfigError(
            "config key 'pretrained': fine-tuning starts from a vlp checkpoint (run directory or "
            "checkpoint folder); none given"
        )
    if not cfg.data.train:
        raise DataError("config key 'data.train': no annotation files given")
    set_seed(cfg.train.seed)
    source = find_checkpoint(cfg.pretrained)
    model_cfg = finetune_model_config(cfg, read_state(source))
    tokenizer = load_tokenizer(model_cfg.text)
    kind = kind or cfg.task
    model = build_task_model(kind, model_cfg, len(tokenizer))
    transfer = load_pretrained(model, source)
    return Job(kind, cfg, model_cfg, model, tokenizer, source=source, transfer=transfer)


def start(job: Job, loader: DataLoader, items: int) -> Path:
    """Take the training ``loader`` of ``items`` items, create the run directory and say what runs."""
    job.loader, job.items = loader, items
    run_dir = job.start()
    report = job.transfer
    print(
        f"vlp {cast(FinetuneConfig, job.cfg).task}: {items} training items, from {job.source} "
        f"({len(report['new'])} new tensors, {len(report['dropped'])} checkpoint tensors unused"
        f"{', momentum twins copied from the loaded weights' if report['momentum_copied'] else ''}), "
        f"{job.res} px -> {run_dir}"
    )
    return run_dir


def make_loader(job: Job, dataset, collate: Callable, train: bool) -> DataLoader:
    """Training: :func:`vlp.data.datasets.train_loader` (shuffled per epoch, items seeded); else in
    order, with ``eval.num_workers`` loader processes (pinned batches on CUDA)."""
    d = job.cfg.data
    if train:
        return train_loader(dataset, d.batch_size, collate, d.num_workers, job.cfg.train.seed)
    return DataLoader(
        dataset,
        batch_size=d.eval_batch_size,
        num_workers=job.cfg.eval.resolved_workers(),
        collate_fn=collate,
        pin_memory=job.device.type == "cuda",
        generator=torch.Generator().manual_seed(job.cfg.train.seed),
    )


def train_steps(job: Job, loader: DataLoader) -> int:
    """Optimizer steps of the run: ``train.epochs`` passes over ``loader`` (``grad_accum_steps``
    batches per step), else ``train.steps``."""
    t = job.cfg.train
    return max(1, t.epochs * len(loader) // t.grad_accum_steps) if t.epochs is not None else t.steps


def fit(job: Job, task: nn.Module, evaluate: Optional[Callable[[nn.Module, int], dict]], select: str) -> None:
    """Train ``task`` for ``train_steps``, validating with ``evaluate`` (keeping the best by
    ``select``) every ``eval_every`` steps, by default once per epoch."""
    t = job.cfg.train
    t.steps = train_steps(job, job.loader)
    every = job.cfg.eval_every or max(1, len(job.loader) // t.grad_accum_steps)  # default: once per epoch
    job.task = task
    job.fit(Validation(evaluate, select, every) if evaluate is not None else None)


def load_best(job: Job) -> Optional[Path]:
    """Put the best validated weights into the model (if validation ran); returns that checkpoint."""
    best = job.run_dir / "checkpoints" / "best"
    if (best / "model.safetensors").is_file():
        load_weights(job.model, best)
        return best
    return None


def write_results(job: Job, results: dict) -> dict:
    """Rank 0 writes ``results.json`` and returns the results; the other ranks, done once every
    rank took its part in the final evaluation, raise :class:`vlp.dist.OtherRankDone`."""
    if rank() != 0:
        raise OtherRankDone
    (job.run_dir / "results.json").write_text(json.dumps(results, indent=2))
    return results


# ----------------------------------------------------------------------------- retrieval


def contrastive_task(job: Job, samples: Sequence[Sample]) -> tuple[Path, nn.Module]:
    """ITC (positives by image id: ``Sample.image_key``, id queue, optional SRCL on the live model)
    + ITM (same-image negatives excluded), no MLM: the objective of retrieval and grounding
    fine-tuning. Builds the training loader of ``samples``, starts the run; returns its directory
    and the :class:`vlp.tasks.pretrain.PretrainTask`."""
    from vlp.tasks.pretrain import PretrainTask
    from vlp.tasks.regulation import SRCLRegulator

    cfg = cast(FinetuneConfig, job.cfg)
    targets = load_targets_for(cfg.loss.ltd)
    dataset = ImageTextDataset(samples, job.train_transform(), targets=targets, **job.bad_samples(samples))
    loader = make_loader(job, dataset, Collator(job.tokenizer, cfg.data.max_len, cfg.data.text_padding), train=True)
    check_queue(job.model_cfg.queue_size, cfg.data.batch_size)
    run_dir = start(job, loader, len(dataset))
    regulator = None
    if cfg.loss.regulation != "none":  # fine-tuning: the live model's similarities only (no helper)
        regulator = SRCLRegulator(
            cfg.loss.srcl, cfg.loss.regulation, train_steps(job, loader), job.model_cfg.queue_size, 1, finetune=True
        )
    rec = build_reconstruction(cfg.loss.ltd, job.model_cfg.embed_dim, targets, len(job.tokenizer))
    task = PretrainTask(
        job.model,
        cfg.loss,
        token_info(job.tokenizer),
        cfg.train.seed,
        regulator,
        rec,
        max_len=cfg.data.max_len,
        text_padding=cfg.data.text_padding,
    )
    return run_dir, task


def run_finetune_retrieval(cfg: FinetuneConfig) -> dict:
    """ITC (positives by image id, id queue, optional SRCL on the live model) + ITM (same-image
    negatives excluded); validation = ITC top-k + ITM re-rank, best by r_mean; test at the end."""
    from vlp.dist import is_dist
    from vlp.eval.retrieval import check_k_test, embed, evaluate_retrieval
    from vlp.viz import plot_retrieval_examples

    splits = {
        s: load_retrieval_split(getattr(cfg.data, s), cfg.data.image_root)
        for s in ("val", "test")
        if getattr(cfg.data, s)
    }
    for name, split in splits.items():  # before any work
        check_k_test(cfg.eval, len(split.images), len(split.texts), f"data.{name} ({split.source})")
        check_image_paths(split.images, f"data.{name} ({split.source})")
    cfg.loss.srcl.require_delta(cfg.loss.regulation)
    job = finetune_job(cfg)
    samples = load_pairs(cfg.data.train, cfg.data.image_root, on_bad=cfg.data.on_bad_sample)
    run_dir, task = contrastive_task(job, samples)

    def evaluate(split_name: str, show: bool = False):
        """Every rank calls it: encoding and ITM re-ranking are sharded over the ranks
        (:mod:`vlp.eval.retrieval`) and every rank gets the same metrics."""
        split, e, sharded = splits[split_name], cfg.eval, is_dist()
        show = show and rank() == 0
        emb = embed(
            job.model,
            split,
            job.tokenizer,
            job.test_transform(),
            cfg.data.max_len,
            cfg.data.eval_batch_size,
            job.device,
            show,
            num_workers=e.resolved_workers(),
            precision=e.precision,
            distributed=sharded,
            offload=e.offload,
        )
        return split, evaluate_retrieval(job.model, emb, split, e, show_progress=show, distributed=sharded)

    validate = (lambda _task, _step: evaluate("val")[1].metrics) if "val" in splits else None
    fit(job, task, validate, "r_mean")
    results: dict[str, Any] = {
        "task": "retrieval",
        "score": cfg.eval.score,
        "k_test": cfg.eval.k_test,
        "best": str(load_best(job)),
    }
    for name in splits:  # every rank evaluates its shard; rank 0 writes
        split, res = evaluate(name, show=cfg.train.progress)
        results[name] = res.metrics
        if rank() == 0:
            out = run_dir / name
            out.mkdir(exist_ok=True)
            (out / "metrics.json").write_text(json.dumps(res.metrics, indent=2))
            plot_retrieval_examples(split, res.scores_t2i, out / "retrieval_examples.png")
    return write_results(job, results)


# ----------------------------------------------------------------------------- VQA


def run_finetune_vqa(cfg: FinetuneConfig) -> dict:
    """Answer decoder from the pretrained fusion layers; weighted answer NLL (+ distillation);
    validation = VQA accuracy of the ranked candidate answers; test predictions in the official
    ``[{"question_id", "answer"}]`` format; the most-frequent-answer-per-type baseline for reference."""
    from vlp.data.formats import load_answer_list, load_vqa, write_vqa_predictions
    from vlp.data.vqa import VQACollator, VQADataset, tokenize_answers
    from vlp.eval.vqa import baseline_predictions, mean_vqa_accuracy, most_frequent_answers, per_type_accuracy
    from vlp.tasks.vqa import VQATask

    if not cfg.data.answer_list:
        raise ConfigError("config key 'data.answer_list': VQA ranks a fixed list of candidate answers; none given")
    d = cfg.data
    answers = load_answer_list(d.answer_list)
    if cfg.vqa.k_test > len(answers):  # before any work
        raise ConfigError(
            f"config key 'vqa.k_test': {cfg.vqa.k_test} candidates per question, but the answer list "
            f"{d.answer_list} has {len(answers)}; set vqa.k_test <= {len(answers)}"
        )
    job = finetune_job(cfg)
    train_q = load_vqa(d.train, d.image_root, d.vg_root)
    val_q = load_vqa([d.val], d.image_root, d.vg_root) if d.val else []
    test_q = load_vqa([d.test], d.image_root, d.vg_root, require_answers=False) if d.test else []
    collate = VQACollator(job.tokenizer, d.max_len, cfg.vqa.answer_max_len)
    loader = make_loader(
        job, VQADataset(train_q, job.train_transform(), train=True, **job.bad_samples(train_q)), collate, train=True
    )
    run_dir = start(job, loader, len(train_q))
    task = VQATask(job.model, cfg.loss.alpha, cfg.loss.alpha_ramp_steps, cfg.loss.distill)
    cand_ids, cand_mask = tokenize_answers(job.tokenizer, answers, cfg.vqa.answer_max_len)

    def predict(questions) -> list[str]:
        """Every rank ranks the answers of its contiguous shard of ``questions``; all in order."""
        bounds, shard = shard_of(questions)
        loader = make_loader(job, VQADataset(shard, job.test_transform(), train=False), collate, train=False)
        picked = rank_answer_indices(job.model, loader, cand_ids, cand_mask, cfg.vqa.k_test, job.device)
        return [answers[i] for i in gather_rows(picked, bounds).tolist()]

    def val_metrics(preds: list[str]) -> dict[str, float]:
        acc = mean_vqa_accuracy(preds, [q.raw_answers for q in val_q])
        official = mean_vqa_accuracy(preds, [q.raw_answers for q in val_q], official=True)
        return {
            "acc": acc,
            "acc_official": official,
            **{f"acc_{k}": v for k, v in per_type_accuracy(preds, val_q).items()},
        }

    validate = (lambda _task, _step: val_metrics(predict(val_q))) if val_q else None
    fit(job, task, validate, "acc")
    results: dict[str, Any] = {
        "task": "vqa",
        "k_test": cfg.vqa.k_test,
        "answers": len(answers),
        "best": str(load_best(job)),
    }
    if val_q:
        results["val"] = val_metrics(predict(val_q))
        base = baseline_predictions(most_frequent_answers(train_q), val_q)
        results["val_baseline_most_frequent_per_type"] = val_metrics(base)
    if test_q:
        preds = predict(test_q)
        if rank() == 0:
            path = write_vqa_predictions(run_dir / "vqa_test_predictions.json", [q.question_id for q in test_q], preds)
            results["test_predictions"] = str(path)
    return write_results(job, results)


def shard_of(items: Sequence) -> tuple[list[int], Sequence]:
    """``(bounds, this rank's contiguous shard of items)`` (:func:`vlp.dist.shard_bounds`; all on one
    process): the sharded VQA and NLVR2 evaluation, gathered back in order with :func:`vlp.dist.gather_rows`."""
    bounds = shard_bounds(len(items), world_size())
    return bounds, items[bounds[rank()] : bounds[rank() + 1]]


@torch.no_grad()
def rank_answer_indices(
    model, loader: DataLoader, cand_ids: torch.Tensor, cand_mask: torch.Tensor, k: int, device: torch.device
) -> torch.Tensor:
    """The ranked answer (an index into the candidates) of every question of ``loader``, in order:
    [n] long on ``device``. Eval mode inside, the model's modes restored after."""
    cand_ids, cand_mask = cand_ids.to(device), cand_mask.to(device)
    out = [torch.zeros(0, dtype=torch.long, device=device)]
    with evaluating(model):
        for batch in loader:
            mask = batch["attention_mask"].to(device, non_blocking=True)
            states = model.encode_question(
                batch["images"].to(device, non_blocking=True), batch["input_ids"].to(device, non_blocking=True), mask
            )
            out.append(model.rank_answers(states, mask, cand_ids, cand_mask, k)[0])
    return torch.cat(out)


def predict_answers(
    model,
    loader: DataLoader,
    cand_ids: torch.Tensor,
    cand_mask: torch.Tensor,
    answers: list[str],
    k: int,
    device: torch.device,
) -> list[str]:
    """The ranked answer (a string of ``answers``) for every question of ``loader``, in order (eval
    mode inside, the model's modes restored after)."""
    return [answers[i] for i in rank_answer_indices(model, loader, cand_ids, cand_mask, k, device).tolist()]


# ----------------------------------------------------------------------------- NLVR2


class ConstantImage:
    """The text-only baseline's transform: every image becomes the same zero tensor."""

    def __init__(self, res: int) -> None:
        self.res = res

    def __call__(self, _image) -> torch.Tensor:
        return torch.zeros(3, self.res, self.res)


def run_finetune_nlvr(cfg: FinetuneConfig) -> dict:
    """Doubled fusion layers alternating between the two images (K/V shared per pair), a classifier
    on [CLS] (+ distillation); validation = dev accuracy, best checkpoint; test accuracy at the end."""
    from vlp.data.formats import load_nlvr
    from vlp.data.nlvr import NLVRCollator, NLVRDataset
    from vlp.tasks.nlvr import NLVRTask

    job = finetune_job(cfg)
    d = cfg.data
    train_items = [it for path in d.train for it in load_nlvr(path, d.image_root)]
    evals = {name: load_nlvr(getattr(d, name), d.image_root) for name in ("val", "test") if getattr(d, name)}
    blank = cfg.nlvr.text_only
    collate = NLVRCollator(job.tokenizer, d.max_len)
    train_tf = ConstantImage(job.res) if blank else job.train_transform()
    test_tf = ConstantImage(job.res) if blank else job.test_transform()
    images = [SimpleNamespace(image=path, origin=it.origin) for it in train_items for path in it.images]
    loader = make_loader(
        job, NLVRDataset(train_items, train_tf, flip=cfg.nlvr.flip, **job.bad_samples(images)), collate, train=True
    )
    start(job, loader, len(train_items))
    task = NLVRTask(job.model, cfg.loss.alpha, cfg.loss.alpha_ramp_steps, cfg.loss.distill)

    def accuracy(items) -> float:
        """Every rank classifies its contiguous shard of ``items``; accuracy over all of them."""
        bounds, shard = shard_of(items)
        right = nlvr_correct(job.model, make_loader(job, NLVRDataset(shard, test_tf), collate, train=False), job.device)
        return 100.0 * float(gather_rows(right, bounds).double().mean()) if len(items) else 0.0

    validate = (lambda _task, _step: {"acc": accuracy(evals["val"])}) if "val" in evals else None
    fit(job, task, validate, "acc")
    results: dict[str, Any] = {"task": "nlvr2", "text_only": blank, "flip": cfg.nlvr.flip, "best": str(load_best(job))}
    for name, items in evals.items():
        results[name] = {"acc": accuracy(items), "n": len(items)}
    return write_results(job, results)


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


def nlvr_correct(model, loader: DataLoader, device: torch.device) -> torch.Tensor:
    """:func:`classify_correct` of the NLVR2 model (two images and the sentence)."""
    return classify_correct(model, loader, device, ("images0", "images1", "input_ids", "attention_mask"))


def nlvr_accuracy(model, loader: DataLoader, device: torch.device) -> float:
    """Accuracy in percent over every example of ``loader`` (not a mean of batch means); eval mode
    inside, the model's modes restored after."""
    right = nlvr_correct(model, loader, device)
    return 100.0 * float(right.double().mean()) if len(right) else 0.0


# ----------------------------------------------------------------------------- SNLI-VE


def run_finetune_ve(cfg: FinetuneConfig) -> dict:
    """ALBEF's VE: fusion [CLS] -> 3-way classifier (+ distillation); validation = dev accuracy,
    best checkpoint; test accuracy at the end, next to the majority class of the training labels.
    ``ve.hypothesis_only``: every premise image blanked (the hypothesis-only baseline)."""
    from vlp.data.downstream_formats import VE_LABELS, load_ve
    from vlp.data.ve import VECollator, VEDataset
    from vlp.models.ve import VEModel
    from vlp.tasks.ve import VETask

    job = finetune_job(cfg)
    d = cfg.data
    train_items = [it for path in d.train for it in load_ve(path, d.image_root)]
    evals = {name: load_ve(getattr(d, name), d.image_root) for name in ("val", "test") if getattr(d, name)}
    blank = cfg.ve.hypothesis_only
    collate = VECollator(job.tokenizer, d.max_len)
    train_tf = ConstantImage(job.res) if blank else job.train_transform()
    test_tf = ConstantImage(job.res) if blank else job.test_transform()
    loader = make_loader(job, VEDataset(train_items, train_tf, **job.bad_samples(train_items)), collate, train=True)
    start(job, loader, len(train_items))
    task = VETask(cast(VEModel, job.model), cfg.loss.alpha, cfg.loss.alpha_ramp_steps, cfg.loss.distill)
    inputs = ("images", "input_ids", "attention_mask")

    def accuracy(items) -> float:
        """Every rank classifies its contiguous shard of ``items``; accuracy over all of them."""
        bounds, shard = shard_of(items)
        loader = make_loader(job, VEDataset(shard, test_tf), collate, train=False)
        right = classify_correct(job.model, loader, job.device, inputs)
        return 100.0 * float(gather_rows(right, bounds).double().mean()) if len(items) else 0.0

    validate = (lambda _task, _step: {"acc": accuracy(evals["val"])}) if "val" in evals else None
    fit(job, task, validate, "acc")
    majority = max(range(len(VE_LABELS)), key=lambda c: sum(it.label == c for it in train_items))
    results: dict[str, Any] = {
        "task": "ve",
        "hypothesis_only": blank,
        "majority_class": VE_LABELS[majority],
        "best": str(load_best(job)),
    }
    for name, items in evals.items():
        results[name] = {
            "acc": accuracy(items),
            "n": len(items),
            "majority_acc": 100.0 * sum(it.label == majority for it in items) / len(items),
        }
    return write_results(job, results)


# ----------------------------------------------------------------------------- grounding


def grounding_model(job: Job):
    """The job's in-training model as a :class:`vlp.api.VLPModel` with the evaluation preprocessing
    a saved checkpoint of the run loads with (resolution, mean/std, ``data.max_len``), so that
    validation scores exactly what ``vlp evaluate grounding`` scores on that checkpoint. The
    constructor puts the model in eval mode: build it inside :func:`vlp.eval.mode.evaluating`."""
    from vlp.api import Preprocessor, VLPModel

    d = cast(FinetuneConfig, job.cfg).data
    pre = Preprocessor(job.res, list(d.image.mean), list(d.image.std), d.max_len)
    return VLPModel(job.model, job.kind, job.model_cfg, job.tokenizer, pre, batch_size=d.eval_batch_size)


def grounding_layer(job: Job) -> int:
    """The fusion layer of ``grounding.layer`` (None: the middle one); one the model lacks raises
    :class:`ConfigError` before any training."""
    from vlp.models.gradcam import fusion_layer_index

    try:
        return fusion_layer_index(job.model, cast(FinetuneConfig, job.cfg).grounding.layer)
    except ValueError as e:
        raise ConfigError(f"config key 'grounding.layer': {e}") from e


def run_finetune_grounding(cfg: FinetuneConfig) -> dict:
    """ALBEF's weakly supervised grounding (``Grounding.py``): ITC (every expression of one image
    shares its id: positives by image) + ITM on (image, referring expression) pairs, no MLM, as
    retrieval (:func:`contrastive_task`); validation = grounding accuracy on ``data.val`` (Grad-CAM
    of the ITM score over fusion layer ``grounding.layer``, :func:`vlp.runs.grounding.ground`, the
    scoring of ``vlp evaluate grounding``), best checkpoint by accuracy; at the end val and test with
    the best checkpoint beside the random-candidate and the fixed-position baseline (fitted on the
    training files' boxes, when every training entry has them). The checkpoints are of kind
    ``retrieval`` (the model is the retrieval ALBEF)."""
    from vlp.data.grounding import GroundingEntry, read_grounding_file
    from vlp.runs.grounding import (
        EXAMPLES,
        entry_size,
        example_indices,
        ground,
        plot_examples,
        position_baseline,
        split_metrics,
    )

    d, g = cfg.data, cfg.grounding
    train_entries = [e for path in d.train for e in read_grounding_file(path, d.image_root, "train")]
    evals = {s: read_grounding_file(getattr(d, s), d.image_root, "eval") for s in ("val", "test") if getattr(d, s)}
    sizes = {s: [entry_size(e) for e in entries] for s, entries in evals.items()}
    job = finetune_job(cfg, kind="retrieval")
    layer = grounding_layer(job)
    samples = [Sample(e.image, (e.text,), e.image, e.origin) for e in train_entries]  # image id = the image
    run_dir, task = contrastive_task(job, samples)

    def choose(name: str, show: bool = False) -> list[int]:
        """Every rank grounds its contiguous shard of the split; the chosen candidate of every entry."""
        entries, bounds = evals[name], shard_bounds(len(evals[name]), world_size())
        lo, hi = bounds[rank()], bounds[rank() + 1]
        chosen: list[int] = []
        if hi > lo:
            with evaluating(job.model):
                vm = grounding_model(job)
                chosen = ground(
                    vm, entries[lo:hi], sizes[name][lo:hi], layer, d.eval_batch_size, g.words_only, show
                ).chosen
        return gather_rows(torch.tensor(chosen, dtype=torch.long, device=job.device), bounds).tolist()

    def examples(
        entries: list[GroundingEntry], split_sizes: list[tuple[int, int]], chosen: list[int], path: Path
    ) -> None:
        """The examples picture: 8 entries spread over the split, their maps and ``chosen`` boxes."""
        shown = example_indices(len(entries), 8)
        with evaluating(job.model):
            picked = [entries[i] for i in shown]
            maps = ground(grounding_model(job), picked, [split_sizes[i] for i in shown], layer, 8, g.words_only).maps
        plot_examples(entries, shown, maps, [entries[i].candidates[chosen[i]] for i in shown], path)

    def validate(_task: nn.Module, _step: int) -> dict[str, float]:
        return {"acc": split_metrics(evals["val"], choose("val"))["accuracy"]}

    fit(job, task, validate if "val" in evals else None, "acc")
    with_boxes = all(e.bbox is not None and e.candidates for e in train_entries)
    results: dict[str, Any] = {
        "task": "grounding",
        "layer": layer,
        "words_only": g.words_only,
        "best": str(load_best(job)),
    }
    for name, entries in evals.items():  # every rank grounds its shard; rank 0 writes
        chosen = choose(name, show=cfg.train.progress and rank() == 0)
        prior = position_baseline(train_entries, entries, sizes[name]) if with_boxes else None
        results[name] = {**split_metrics(entries, chosen), "fixed_position": prior}
        if rank() == 0:
            out = run_dir / name
            out.mkdir(exist_ok=True)
            (out / "metrics.json").write_text(json.dumps(results[name], indent=2))
            examples(entries, sizes[name], chosen, out / EXAMPLES)
    return write_results(job, results)


def run_nlvr_ta(cfg: FinetuneConfig) -> dict:
    """Text-assignment pre-training of the doubled fusion layers on pretraining data (one epoch in
    ALBEF): which of two images (or neither) a caption describes."""
    from vlp.tasks.nlvr import TextAssignmentTask

    job = finetune_job(cfg)
    samples = load_pairs(cfg.data.train, cfg.data.image_root, on_bad=cfg.data.on_bad_sample)
    dataset = ImageTextDataset(samples, job.train_transform(), **job.bad_samples(samples))
    loader = make_loader(job, dataset, Collator(job.tokenizer, cfg.data.max_len, cfg.data.text_padding), train=True)
    start(job, loader, len(dataset))
    fit(job, TextAssignmentTask(job.model, cfg.train.seed), None, "acc")
    return write_results(job, {"task": "nlvr-ta", "checkpoint": str(find_checkpoint(job.run_dir))})  # rank 0 only


RUNNERS: dict[str, Callable[[FinetuneConfig], dict]] = {
    "retrieval": run_finetune_retrieval,
    "vqa": run_finetune_vqa,
    "nlvr2": run_finetune_nlvr,
    "nlvr-ta": run_nlvr_ta,
    "ve": run_finetune_ve,
    "grounding": run_finetune_grounding,
}


def run_finetune(cfg: FinetuneConfig) -> dict:
    return RUNNERS[cfg.task](cfg)
