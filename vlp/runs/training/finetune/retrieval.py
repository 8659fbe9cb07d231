"""``vlp finetune retrieval``: ITC + ITM on image-caption pairs, validated by retrieval."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence, cast

from torch import nn

from vlp.config import FinetuneConfig
from vlp.data.datasets import Collator, ImageTextDataset
from vlp.data.formats import Sample, load_pairs, load_retrieval_split
from vlp.data.image_checks import check_image_paths
from vlp.dist import rank
from vlp.kinds import RETRIEVAL
from vlp.runs.training.assembly import build_reconstruction, load_targets_for
from vlp.runs.training.finetune.recipe import (
    finetune_job,
    fit,
    load_best,
    make_loader,
    shown_run,
    start,
    train_steps,
    write_results,
)
from vlp.runs.training.finetune.registry import RUNNERS
from vlp.runs.training.job import Job, check_queue, token_info


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


@RUNNERS.register(RETRIEVAL)
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
    best = load_best(job)
    results: dict[str, Any] = {"task": cfg.task, "score": cfg.eval.score, "k_test": cfg.eval.k_test, "best": str(best)}
    for name in splits:  # every rank evaluates its shard; rank 0 writes
        split, res = evaluate(name, show=cfg.train.progress)
        results[name] = res.metrics
        if rank() == 0:
            out = run_dir / name
            out.mkdir(exist_ok=True)
            (out / "metrics.json").write_text(json.dumps(res.metrics, indent=2))
            plot_retrieval_examples(split, res.scores_t2i, out / "retrieval_examples.png", shows=shown_run(job, best))
    return write_results(job, results)
