"""``vlp pretrain`` and ``vlp train-helper``: the pretraining :class:`~vlp.runs.training.job.Job` (model,
task, data) of a config, and the run that trains it and evaluates zero-shot retrieval at the end (and
every ``train.eval_every`` steps)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, Optional, Union

import torch
from accelerate.utils import set_seed

from vlp.checkpoint import image_size
from vlp.config import PretrainConfig
from vlp.config.model import ARCH_ALBEF, ARCH_DUAL
from vlp.data.datasets import Collator, ImageTextDataset, train_loader
from vlp.data.formats import load_pairs, load_retrieval_split
from vlp.data.image_checks import bad_sample_args, check_image_paths, check_images
from vlp.dist import launch_rank
from vlp.errors import CheckpointError, ConfigError, DataError
from vlp.eval.retrieval import check_k_test
from vlp.features.helper_cache import HelperCache
from vlp.features.targets import LatentTargets
from vlp.kinds import PRETRAIN
from vlp.locks import releasing_folders
from vlp.losses.registry import build_loss
from vlp.models.albef import ALBEF, param_count
from vlp.models.build import build_model_of_kind
from vlp.models.dual import DualEncoder
from vlp.models.transfer import load_pretrained
from vlp.models.vision import check_vision_init, write_init_report
from vlp.preprocess.transforms import PixelNorm, load_tokenizer, train_transform
from vlp.runs.evaluation.image_text_retrieval import PeriodicRetrieval, run_evaluate_retrieval
from vlp.runs.training.assembly import build_reconstruction, build_regulator, check_helper_weights, load_targets_for
from vlp.runs.training.job import Job, check_queue, token_info
from vlp.tasks.dual import DualTask
from vlp.tasks.pretrain import PretrainTask
from vlp.tasks.regulation import SRCLRegulator
from vlp.train.validation import Validation
from vlp.weights import find_checkpoint

logger = logging.getLogger(__name__)

#: the metrics printed after each evaluation of ``train.eval_every``
RETRIEVAL_SHOWN = ("txt_r1", "img_r1", "r_mean")


def build_model(cfg: PretrainConfig, vocab_size: int) -> Union[ALBEF, DualEncoder]:
    return build_model_of_kind(PRETRAIN, cfg.model, vocab_size)


def load_targets(cfg: PretrainConfig) -> Optional[LatentTargets]:
    return load_targets_for(cfg.loss.ltd)


def build_task(
    cfg: PretrainConfig,
    model: Union[ALBEF, DualEncoder],
    tokenizer,
    regulator: Optional[SRCLRegulator],
    targets: Optional[LatentTargets],
) -> torch.nn.Module:
    """The training task for the config's architecture, with LTD / ITD attached if configured."""
    rec = build_reconstruction(cfg.loss.ltd, cfg.model.embed_dim, targets, len(tokenizer))
    if cfg.model.arch == ARCH_DUAL:
        task = DualTask(model, cfg.loss, rec)
    else:
        task = PretrainTask(
            model,
            cfg.loss,
            token_info(tokenizer),
            cfg.train.seed,
            regulator,
            rec,
            max_len=cfg.model.text.max_len,
            text_padding=cfg.data.text_padding,
        )
    if cfg.data.image.uint8:
        task.pixel_norm = PixelNorm(cfg.data.image)
    return task


def build_pretraining(cfg: PretrainConfig) -> Job:
    """The pretraining job of a config (shared by ``vlp pretrain`` and ``vlp bench``): seeded model,
    task and shuffled fixed-size-batch loader."""
    if not cfg.data.train:
        raise DataError("config key 'data.train': no annotation files given")
    check_run(cfg)
    set_seed(cfg.train.seed)
    tokenizer = load_tokenizer(cfg.model.text)
    regulator, cache = build_regulator(cfg)
    targets = load_targets(cfg)
    loader, pairs, images = build_train_loader(cfg, tokenizer, cache, targets)  # data errors before the model
    model = build_model(cfg, len(tokenizer))
    if cfg.init_from:
        init_weights(model, cfg.init_from)
    task = build_task(cfg, model, tokenizer, regulator, targets)
    return Job(
        PRETRAIN,
        cfg,
        cfg.model,
        model,
        tokenizer,
        task=task,
        loader=loader,
        items=pairs,
        images=images,
        micro_batch=cfg.data.batch_size,
    )


def init_weights(model: torch.nn.Module, source: str) -> None:
    """``init_from``: load the newest checkpoint of ``source`` into ``model`` (:func:`load_pretrained`)."""
    try:
        ckpt = find_checkpoint(source)
    except CheckpointError as e:
        raise CheckpointError(f"config key 'init_from': {e}") from None
    report = load_pretrained(model, ckpt)
    logger.info(
        f"init_from {ckpt}: {len(report['new'])} keys left new, {len(report['dropped'])} dropped"
        + (", momentum twin copied from the online weights" if report["momentum_copied"] else "")
    )


def check_run(cfg: PretrainConfig) -> None:
    """Combinations that need the launch, the registered losses or the evaluation data, checked
    before any work starts (the contrastive loss is built here: an unknown ``loss.contrastive.name``
    fails even where the config was loaded before the losses were)."""
    cfg.check_loss(build_loss(cfg.loss.contrastive))
    check_helper_weights(cfg)
    cfg.loss.srcl.require_delta(cfg.loss.regulation)
    if cfg.model.arch == ARCH_ALBEF:
        check_queue(cfg.model.queue_size, cfg.data.batch_size)
        check_vision_init(cfg.model.vision)
    if cfg.data.eval:
        split = load_retrieval_split(cfg.data.eval, cfg.data.image_root)
        check_k_test(cfg.eval, len(split.images), len(split.texts), f"data.eval ({split.source})")
        check_image_paths(split.images, f"data.eval ({split.source})")


def build_train_loader(
    cfg: PretrainConfig, tokenizer, cache: Optional[HelperCache], targets: Optional[LatentTargets]
) -> tuple[Iterable, int, int]:
    """(loader, pairs, images) of ``data.train``: ALBEF JSON files (map-style, shuffled per (seed,
    epoch), items seeded per (seed, epoch, index), fixed-size batches; accelerate shards it over the
    ranks: :func:`vlp.data.datasets.train_loader`) or webdataset shard folders (``data.format``;
    the stream splits itself by rank and worker, :mod:`vlp.data.shards`). Bad samples follow
    ``data.on_bad_sample`` (missing files are checked first: :func:`vlp.data.image_checks.check_images`);
    images decode per ``data.image.decode`` (:mod:`vlp.preprocess.draft`)."""
    d = cfg.data
    transform = train_transform(image_size(cfg), d.image)
    collate = Collator(tokenizer, cfg.model.text.max_len, d.text_padding)
    if d.format == "webdataset":
        from vlp.data.shards import ShardLoader

        rank, world = launch_rank()
        stream = ShardLoader(
            d, transform, collate, seed=cfg.train.seed, rank=rank, world_size=world, helper_cache=cache, targets=targets
        )
        return stream, stream.pairs, stream.images
    samples = load_pairs(d.train, d.image_root, on_bad=d.on_bad_sample)
    check_images(samples, d)
    dataset = ImageTextDataset(
        samples, transform, cache, targets, d.captions_per_image, decode=d.image.decode, **bad_sample_args(d)
    )
    loader = train_loader(dataset, d.batch_size, collate, d.num_workers, cfg.train.seed)
    return loader, len(dataset), len(dataset.key_to_id)


def run_pretrain(cfg: PretrainConfig, command: str = "vlp pretrain") -> Path:
    """Pretrain per ``cfg``; returns the run directory (config.yaml, metrics.jsonl, checkpoints/).
    ``command`` names the run in its one header line (printed by the main process only). The run
    directory is held for the run (:func:`vlp.locks.lock_folder`) and let go of when this returns or raises."""
    with releasing_folders():
        job = build_pretraining(cfg)
        run_dir = job.start()
        main = launch_rank()[0] == 0
        if main:
            logger.info(
                f"{command}: {job.items} pairs, {job.images} images, "
                f"{param_count(job.model) / 1e6:.1f}M trainable parameters -> {run_dir}"
            )
            write_init_report(job.model, run_dir)  # vision_init_report.json + one line
        periodic = PeriodicRetrieval(cfg, job.tokenizer, cfg.train.progress, job.kind) if cfg.train.eval_every else None
        job.fit(Validation(periodic, None, cfg.train.eval_every, RETRIEVAL_SHOWN) if periodic is not None else None)
        evaluate_after_training(cfg, run_dir, periodic)
    return run_dir


def evaluate_after_training(cfg: PretrainConfig, run_dir: Path, periodic: Optional[PeriodicRetrieval]) -> None:
    """``data.eval`` (if set) into ``run_dir/eval``: the evaluation ``train.eval_every`` made after the
    last step when there is one (:meth:`PeriodicRetrieval.write_final`), else the newest checkpoint's
    (:func:`run_evaluate_retrieval`; a resumed run that had no step left to train)."""
    if not cfg.data.eval or (periodic is not None and periodic.write_final(run_dir, run_dir / "eval")):
        return
    run_evaluate_retrieval(
        run_dir,
        cfg.data.eval,
        cfg.data.relevance,
        run_dir / "eval",
        cfg.data.image_root,
        graded_relevance=cfg.data.graded_relevance,
    )


def run_train_helper(cfg: PretrainConfig) -> Path:
    """Train the SRCL helper: the same architecture with plain InfoNCE (ITC only, no distillation,
    no regulation) on clean captions. Its checkpoint is what SRCL freezes."""
    c = cfg.loss
    wrong = [f"{k}={v}" for k, v in (("loss.itm", c.itm), ("loss.mlm", c.mlm)) if v != 0]
    wrong += ["loss.distill=true"] if c.distill else []
    wrong += [f"loss.regulation={c.regulation}"] if c.regulation != "none" else []
    if wrong or c.itc <= 0:
        raise ConfigError(
            f"config keys {', '.join(wrong) or 'loss.itc<=0'}: a helper is trained with plain InfoNCE "
            "(loss.itc > 0, loss.itm=0, loss.mlm=0, loss.distill=false, loss.regulation=none)"
        )
    return run_pretrain(cfg, command="vlp train-helper")
