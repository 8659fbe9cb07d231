"""``vlp pretrain nlvr-ta``: text-assignment pre-training of NLVR2's doubled fusion layers."""

from __future__ import annotations

from vlp.config import FinetuneConfig
from vlp.data.datasets import Collator, ImageTextDataset
from vlp.data.formats import load_pairs
from vlp.kinds import NLVR_TA
from vlp.runs.training.finetune.recipe import finetune_job, fit, make_loader, start, write_results
from vlp.runs.training.finetune.registry import RUNNERS
from vlp.weights import find_checkpoint


@RUNNERS.register(NLVR_TA)
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
    return write_results(job, {"task": cfg.task, "checkpoint": str(find_checkpoint(job.run_dir))})  # rank 0 only
