"""What every fine-tuning task shares: the job (model config, weights, tokenizer), its loaders,
the training and the best checkpoint, the results file, the run and step its pictures show, the
sharded evaluation, the blanked-image baselines' transform."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, cast

import torch
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader

from vlp.checkpoint import checkpoint_model_config, open_checkpoint
from vlp.config import FinetuneConfig, ModelConfig, apply_overrides
from vlp.config.model import ARCH_ALBEF
from vlp.data.datasets import train_loader
from vlp.dist import OtherRankDone, rank, shard_bounds, world_size
from vlp.errors import ConfigError, DataError
from vlp.kinds import KINDS
from vlp.models.build import build_model_of_kind
from vlp.models.transfer import load_pretrained
from vlp.pictures import RunStep
from vlp.preprocess.transforms import load_tokenizer
from vlp.runs.training.job import Job
from vlp.train.validation import Validation
from vlp.weights import load_weights


def finetune_model_config(cfg: FinetuneConfig, source_state: dict[str, Any]) -> ModelConfig:
    """The pretrained checkpoint's model config with ``image_size`` and ``model_overrides`` applied."""
    model = checkpoint_model_config(source_state)
    if model.arch != ARCH_ALBEF:
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
    (default the kind ``cfg.task`` saves as, :attr:`vlp.kinds.Kind.saves_as`) with the pretrained
    checkpoint's weights (seeded first)."""
    if not cfg.pretrained:
        raise ConfigError(
            "config key 'pretrained': fine-tuning starts from a vlp checkpoint (run directory or "
            "checkpoint folder); none given"
        )
    if not cfg.data.train:
        raise DataError("config key 'data.train': no annotation files given")
    set_seed(cfg.train.seed)
    # found, verified and read once; its weights go into the task model (not a model of its own kind)
    source = open_checkpoint(cfg.pretrained, load=False)
    model_cfg = finetune_model_config(cfg, source.state)
    tokenizer = load_tokenizer(model_cfg.text)
    kind = kind or KINDS.get(cfg.task).saves_as
    model = build_model_of_kind(kind, model_cfg, len(tokenizer))
    transfer = load_pretrained(model, source.path)
    return Job(kind, cfg, model_cfg, model, tokenizer, source=source.path, transfer=transfer)


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


def shown_run(job: Job, best: Optional[Path]) -> RunStep:
    """What the run's pictures show: the best checkpoint's run and step (:func:`load_best`), else the
    run directory and the last training step."""
    return RunStep.of_checkpoint(best) if best is not None else RunStep(job.run_dir.name, job.cfg.train.steps)


def write_results(job: Job, results: dict) -> dict:
    """Rank 0 writes ``results.json`` and returns the results; the other ranks, done once every
    rank took its part in the final evaluation, raise :class:`vlp.dist.OtherRankDone`."""
    if rank() != 0:
        raise OtherRankDone
    (job.run_dir / "results.json").write_text(json.dumps(results, indent=2))
    return results


def shard_of(items: Sequence) -> tuple[list[int], Sequence]:
    """``(bounds, this rank's contiguous shard of items)`` (:func:`vlp.dist.shard_bounds`; all on one
    process): the sharded VQA and NLVR2 evaluation, gathered back in order with :func:`vlp.dist.gather_rows`."""
    bounds = shard_bounds(len(items), world_size())
    return bounds, items[bounds[rank()] : bounds[rank() + 1]]


class ConstantImage:
    """The text-only baseline's transform: every image becomes the same zero tensor."""

    def __init__(self, res: int) -> None:
        self.res = res

    def __call__(self, _image) -> torch.Tensor:
        return torch.zeros(3, self.res, self.res)
