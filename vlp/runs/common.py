"""What several command families share: the :class:`Job` every training command builds and hands
to the loop, the run directory, image-file and queue checks, and the SRCL / LTD parts of a task."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch
from torch import nn

from vlp.checkpoint import PREPROCESSOR, Preprocessor, image_size, open_checkpoint, preprocessor_of
from vlp.config import BadSampleConfig, FinetuneConfig, LTDConfig, ModelConfig, PretrainConfig, to_dict, to_yaml
from vlp.config.resume import resume_changes
from vlp.data.datasets import BAD_SAMPLE_HINT
from vlp.dist import launch_rank
from vlp.errors import CheckpointError, ConfigError, DataError
from vlp.features.helper_cache import HelperCache
from vlp.features.targets import LatentTargets
from vlp.models.build import model_image_size
from vlp.models.open_clip_helper import is_open_clip_spec, require_weights
from vlp.preprocess.transforms import test_transform, train_transform
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.reconstruction import Reconstruction
from vlp.tasks.regulation import SRCLRegulator, helper_span
from vlp.train.loop import train
from vlp.train.setup import make_accelerator
from vlp.train.validation import Validation
from vlp.version import __version__
from vlp.weights import KIND_KEY, find_checkpoint, read_state


@dataclass
class Job:
    """One training run of any command (``vlp pretrain``, ``train-helper``, ``finetune
    retrieval|vqa|nlvr2``, ``pretrain nlvr-ta``; ``vlp bench`` times its steps): what it is made of
    and what :meth:`fit` hands to the loop (:func:`vlp.train.loop.train`).

    A command builds the model and tokenizer, then the training data (``loader``, ``items``), then
    the objective (``task``) around the model; :meth:`start` creates the run directory."""

    kind: str  # the checkpoint kind, state.json "task": pretrain, retrieval, vqa, nlvr2, nlvr-ta
    cfg: Union[PretrainConfig, FinetuneConfig]
    model_cfg: ModelConfig
    model: nn.Module
    tokenizer: Any
    task: Optional[nn.Module] = None  # the training objective around ``model``
    loader: Optional[Iterable] = None  # a DataLoader, or the webdataset ShardLoader
    items: int = 0  # training items: pairs, questions, statements
    images: Optional[int] = None  # distinct training images, where counted (pretraining)
    source: Optional[Path] = None  # the pretrained checkpoint a fine-tuning job starts from
    transfer: dict = field(default_factory=dict)  # what loading it did (:func:`vlp.models.transfer.load_pretrained`)
    micro_batch: Optional[int] = None  # pairs per process per forward for DeepSpeed's config (pretraining)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def run_dir(self) -> Path:
        """The run directory (``output_dir``; created by :meth:`start`)."""
        return Path(self.cfg.output_dir)

    @property
    def res(self) -> int:
        """The model's input resolution."""
        return model_image_size(self.model_cfg)

    def train_transform(self):
        return train_transform(self.res, self.cfg.data.image)

    def test_transform(self):
        return test_transform(self.res, self.cfg.data.image)

    def bad_samples(self, images: Sequence) -> dict:
        """Check the training split's image files (``images``: each with ``image`` and ``origin``;
        :func:`check_images`) and return the training datasets' bad-sample keywords."""
        check_images(images, self.cfg.data)
        return bad_sample_args(self.cfg.data)

    def preprocessor(self) -> Preprocessor:
        """The evaluation preprocessing of the run's checkpoints (``preprocessor.json`` in each)."""
        return preprocessor_of(self.kind, self.cfg, self.model_cfg)

    def start(self) -> Path:
        """Create the run directory (:func:`prepare_run_dir`)."""
        return prepare_run_dir(self.cfg)

    def state(self) -> dict[str, Any]:
        """What every checkpoint's ``state.json`` records besides the step."""
        state = {
            KIND_KEY: self.kind,
            "vlp_version": __version__,
            "config": to_dict(self.cfg),
            "model": to_dict(self.model_cfg),
        }
        return state | ({"pretrained": str(self.source)} if self.source is not None else {})

    def accelerator(self):
        """The run's accelerator (parameters the objective leaves unused are frozen by the task's
        ``unused_parameters``, so DDP runs without ``find_unused_parameters``)."""
        return make_accelerator(self.cfg.train, micro_batch=self.micro_batch)

    def built(self) -> tuple[nn.Module, Iterable]:
        """``(task, loader)``, which the command builds after the model."""
        if self.task is None or self.loader is None:
            raise RuntimeError(f"{self.kind} job: its task and training loader are not built yet")
        return self.task, self.loader

    def fit(self, validation: Optional[Validation] = None) -> None:
        """Train ``task`` on ``loader`` into ``run_dir`` (``train.steps`` steps), validating if given."""
        task, loader = self.built()
        train(
            task,
            loader,
            self.cfg.train,
            self.run_dir,
            self.state(),
            accelerator=self.accelerator(),
            validation=validation,
            max_bad_fraction=self.cfg.data.max_bad_fraction,
            files={PREPROCESSOR: self.preprocessor().to_json()},
        )


def token_info(tokenizer) -> TokenInfo:
    return TokenInfo(len(tokenizer), tokenizer.mask_token_id, tuple(sorted(set(tokenizer.all_special_ids))))


def check_image_paths(paths: Sequence[str], source: str, limit: int = 5) -> None:
    """Before an evaluation encodes anything: image files of ``paths`` (resolved, as ``source``, the
    data file, lists them) that do not exist, in one :class:`DataError` naming the count, the first
    few and the image root to check (a wrong ``--image-root`` fails here, in one line)."""
    missing = [(i, p) for i, p in enumerate(paths) if not os.path.isfile(p)]
    if missing:
        listed = "; ".join(f"image {i}: {p}" for i, p in missing[:limit])
        raise DataError(
            f"{source}: {len(missing)} of {len(paths)} image files not found, e.g. {listed} (check --image-root / "
            "data.image_root: relative paths are read from it, else from the data file's folder)"
        )


def check_images(samples: Sequence, data: Optional[BadSampleConfig] = None, limit: int = 5) -> None:
    """Before training or a pass over ``samples`` (each with ``image`` and ``origin``): image files
    that do not exist. Without ``data`` or with ``data.on_bad_sample=raise``, any fails, naming the
    first few; with ``skip`` they are counted in one warning line (stderr, rank 0) and fail only when
    their share exceeds ``data.max_bad_fraction`` (training replaces them)."""
    missing = [s for s in samples if not os.path.isfile(s.image)]
    if not missing:
        return
    n, total = len(missing), len(samples)
    listed = "; ".join(f"{s.origin}: {s.image}" for s in missing[:limit])
    if data is None:
        raise DataError(f"{n} of {total} image files not found, e.g. {listed}")
    if data.on_bad_sample == "raise":
        raise DataError(f"{n} of {total} image files not found, e.g. {listed}; {BAD_SAMPLE_HINT}")
    if n / total > data.max_bad_fraction:
        raise DataError(
            f"{n} of {total} image files not found ({n / total:.2%}), more than "
            f"data.max_bad_fraction={data.max_bad_fraction:g}, e.g. {listed}"
        )
    if launch_rank()[0] == 0:
        print(
            f"vlp data: warning: {n} of {total} image files not found ({n / total:.2%}); data.on_bad_sample=skip "
            f"replaces them at training time, e.g. {listed}",
            file=sys.stderr,
        )


def bad_sample_args(data: BadSampleConfig) -> dict:
    """The bad-sample keywords of the training datasets and the shard loader (``data.*`` keys)."""
    return {"on_bad": data.on_bad_sample, "max_pixels": data.max_image_pixels, "min_side": data.min_image_side}


def prepare_run_dir(cfg: Union[PretrainConfig, FinetuneConfig]) -> Path:
    """Create the run directory; refuse one that already holds a run (nothing written is lost)
    unless the run resumes (``train.resume``). Writes ``config.yaml`` and ``run_info.json``."""
    run_dir = Path(cfg.output_dir)
    if cfg.train.resume:
        if not run_dir.is_dir():
            raise DataError(
                f"config key 'train.resume': output_dir {run_dir} does not exist; resume into the "
                "directory of the run that wrote the checkpoint"
            )
        changes = compare_with_saved(cfg, run_dir)
    elif (run_dir / "metrics.jsonl").exists() or any((run_dir / "checkpoints").glob("step_*")):
        fresh = (
            ""
            if any((run_dir / "checkpoints").glob("step_*"))
            else " (it has no checkpoint yet: --resume auto starts it again from step 0)"
        )
        raise DataError(
            f"config key 'output_dir': {run_dir} already holds a run (metrics.jsonl or "
            f"checkpoints/); choose another output_dir, move that run away, or continue it with --resume auto{fresh}"
        )
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    if launch_rank()[0] == 0:  # versions, revision, devices, command line; a resume appends to "resumes"
        from vlp.train.logging import write_run_info

        write_run_info(run_dir, resumed=bool(cfg.train.resume), config_changes=changes if cfg.train.resume else None)
    return run_dir


def saved_config(resume: str, run_dir: Path) -> Optional[Path]:
    """The ``config.yaml`` the run being resumed was started with: that of the run directory holding
    the checkpoint ``resume`` names (``RUN/checkpoints/step_N``), else ``run_dir``'s; None if neither exists."""
    named = Path(resume)
    candidates = [named.parent.parent / "config.yaml"] if named.parent.name == "checkpoints" else []
    candidates += [named / "config.yaml"] if resume != "auto" else []
    return next((p for p in [*candidates, run_dir / "config.yaml"] if p.is_file()), None)


def trained_config(resume: str, run_dir: Path) -> Optional[tuple[dict[str, Any], Path]]:
    """The config the checkpoint ``resume`` names (``auto``: ``run_dir``'s newest valid one) was
    trained with, from its ``state.json``, and that file; None when there is no such checkpoint (a
    run killed before its first one) or it records no config (older vlp)."""
    try:
        ckpt = find_checkpoint(run_dir if resume == "auto" else resume)
        state = read_state(ckpt)
    except CheckpointError:  # no usable checkpoint: the loader says so when it loads
        return None
    config = state.get("config")
    return (config, ckpt / "state.json") if isinstance(config, dict) else None


def compare_with_saved(cfg: Union[PretrainConfig, FinetuneConfig], run_dir: Path) -> dict[str, list[Any]]:
    """The changes ``cfg`` makes to the config of the run it resumes (``{key: [old, new]}``);
    :class:`ConfigError` for those that alter the run and are not in ``train.resume_allow_changes``
    (:func:`vlp.config.resume.resume_changes`). Compared with the config the resumed checkpoint was
    trained with (its ``state.json``), which editing or deleting the run's ``config.yaml`` does not
    change; with ``config.yaml`` only when the checkpoint records none; not at all (a warning) when
    neither exists."""
    from omegaconf import OmegaConf

    assert cfg.train.resume
    trained = trained_config(cfg.train.resume, run_dir)
    saved: Any
    if trained is not None:
        saved, path = trained
    else:
        yaml = saved_config(cfg.train.resume, run_dir)
        if yaml is None:
            print(
                f"vlp: warning: no config.yaml of the resumed run in {run_dir}: the config is not compared",
                file=sys.stderr,
            )
            return {}
        try:
            saved, path = OmegaConf.to_container(OmegaConf.load(yaml)), yaml
        except Exception as e:  # yaml errors and friends
            raise ConfigError(f"{yaml}: the resumed run's config is not readable YAML ({e})") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: the resumed run's config is not a mapping of config keys")
    changes = resume_changes(
        {str(k): v for k, v in saved.items()}, to_dict(cfg), cfg.train.resume_allow_changes, str(path)
    )
    return {k: list(v) for k, v in changes.items()}


def check_queue(queue_size: int, batch_size: int, key: str = "data.batch_size") -> None:
    """A feature queue receives every rank's batch each step (ALBEF): a smaller one would drop
    features of the batch it is given (0 disables the queue)."""
    world = launch_rank()[1]
    if 0 < queue_size < batch_size * world:
        raise ConfigError(
            f"config keys 'model.queue_size'/'{key}': a queue of {queue_size} is smaller than the global "
            f"batch ({batch_size} x {world} processes = {batch_size * world}) it receives each step; "
            "raise model.queue_size (ALBEF: 65536) or set it to 0 (in-batch negatives only)"
        )


def load_targets_for(ltd: LTDConfig) -> Optional[LatentTargets]:
    """The LTD latent targets (None unless ``loss.ltd`` decodes latent targets)."""
    return LatentTargets.load(ltd.targets, ltd.encoder) if ltd.mode != "off" and ltd.decoder == "latent" else None


def build_reconstruction(
    ltd: LTDConfig, embed_dim: int, targets: Optional[LatentTargets], vocab_size: int
) -> Optional[Reconstruction]:
    """The LTD / ITD head and multiplier of ``loss.ltd`` (None when off)."""
    if ltd.mode == "off":
        return None
    return Reconstruction(ltd, embed_dim, targets.dim if targets is not None else None, vocab_size)


def build_regulator(
    cfg: PretrainConfig, finetune: bool = False
) -> tuple[Optional[SRCLRegulator], Optional[HelperCache]]:
    """The SRCL regulator of a run (None for ``loss.regulation: none``) and the helper-feature
    cache it reads (None in live-helper mode and when the helper is not used, e.g. fine-tuning).
    An oracle cache (``vlp.lab.oracle.run_cache_oracle_features``) hands its relevance table
    to the regulator."""
    mode, s = cfg.loss.regulation, cfg.loss.srcl
    if mode == "none":
        return None, None
    cache, helper, dim = None, None, 1
    if helper_span(s, cfg.train.steps, finetune) > 0:
        if s.helper_features:
            cache = HelperCache.load(s.helper_features)
            if is_open_clip_spec(s.helper):  # the cache of this very helper, built before the run
                check_cache_of_helper(cache, str(s.helper), "loss.srcl.helper_features")
            check_helper_init(cache, s.helper_init)
            dim = cache.dim
        elif is_open_clip_spec(s.helper):  # not live: cached once into output_dir (open_clip_helper_cache)
            cache = open_clip_helper_cache(cfg)
            dim = cache.dim
        elif s.helper:
            if s.helper_init != "pretrained":
                raise ConfigError(
                    f"config key 'loss.srcl.helper_init': {s.helper_init} is for an open_clip helper without "
                    f"weights; the vlp checkpoint {s.helper} has its own (leave loss.srcl.helper_init=pretrained)"
                )
            opened = open_checkpoint(s.helper, torch.device("cpu"))
            helper, hcfg = opened.model, opened.pretrain_config
            if image_size(hcfg) != image_size(cfg) or hcfg.model.text.tokenizer != cfg.model.text.tokenizer:
                raise ConfigError(
                    f"config key 'loss.srcl.helper': the live helper {s.helper} must take the same "
                    f"images ({image_size(hcfg)} px vs {image_size(cfg)} px) and tokenizer as the model"
                )
            dim = hcfg.model.embed_dim
        else:
            raise ConfigError(
                f"config key 'loss.srcl.helper_features': loss.regulation={mode} needs helper features: "
                "a cache from `vlp cache-helper-features` (or loss.srcl.helper for a live helper)"
            )
    relevance = cache.relevance if cache is not None else None  # an oracle cache: the ground-truth table
    return SRCLRegulator(s, mode, cfg.train.steps, cfg.model.queue_size, dim, finetune, helper, relevance), cache


def check_helper_weights(cfg: PretrainConfig) -> None:
    """Before any work: an open_clip ``loss.srcl.helper`` of a regulated run names weights, or
    none with ``loss.srcl.helper_init=random`` (:func:`~vlp.models.open_clip_helper.require_weights`)."""
    s = cfg.loss.srcl
    if cfg.loss.regulation != "none" and is_open_clip_spec(s.helper):
        require_weights(str(s.helper), s.helper_init, "loss.srcl.helper")


#: the folder of ``output_dir`` that ``loss.srcl.helper=open_clip:...`` caches the helper's features in
OPEN_CLIP_CACHE = "helper_features_open_clip"


@dataclass(frozen=True)
class FeatureEncoder:
    """A frozen helper as its feature cache sees it: ``preprocess`` (a PIL image -> [3, H, W]),
    ``encode_image`` (a batch [N, 3, H, W] -> [N, E]), ``encode_text`` (a list of N raw captions
    -> [N, E]) and ``meta``, what ``index.json`` records of it."""

    preprocess: Callable[[Any], torch.Tensor]
    encode_image: Callable[[torch.Tensor], torch.Tensor]
    encode_text: Callable[[list[str]], torch.Tensor]
    meta: dict[str, Any]


def check_helper_init(cache: HelperCache, init: str, key: str = "loss.srcl.helper_features") -> None:
    """The cache must agree with ``loss.srcl.helper_init``: a randomly initialised helper's
    (``index.json`` ``helper_init: random``) only with ``random``, a helper with weights only with
    ``pretrained`` (an oracle cache with either); one :class:`ConfigError` naming ``key`` otherwise."""
    if cache.helper_init in (None, init):
        return
    if cache.helper_init == "random":
        raise ConfigError(
            f"config key '{key}': {cache.path} holds the features of a randomly initialised helper "
            f"({cache.meta.get('helper')}, index.json helper_init: random), which weights negatives by noise; "
            "cache a helper with weights, or set loss.srcl.helper_init=random (tests)"
        )
    raise ConfigError(
        f"config keys '{key}'/'loss.srcl.helper_init': loss.srcl.helper_init={init}, but {cache.path} holds "
        f"the features of a helper with weights ({cache.meta.get('helper')}); leave loss.srcl.helper_init=pretrained"
    )


def check_cache_of_helper(cache: HelperCache, spec: str, key: str) -> None:
    """The cache ``key`` names must hold the features of the open_clip helper ``spec``
    (``loss.srcl.helper``): one :class:`ConfigError` naming both keys otherwise."""
    from vlp.models.open_clip_helper import parse_open_clip_spec

    if not parse_open_clip_spec(spec).built(cache.meta):
        raise ConfigError(
            f"config keys '{key}'/'loss.srcl.helper': {cache.path} holds the features of "
            f"{cache.meta.get('helper')!r}, not of {spec!r}; point {key} at that helper's cache, or set "
            "loss.srcl.helper=null to use this one"
        )


def open_clip_encoder(spec: str, key: str = "--helper", init: str = "pretrained") -> FeatureEncoder:
    """The open_clip helper ``spec`` (``open_clip:ARCH[/PRETRAINED]``, :mod:`vlp.models.open_clip_helper`)
    as a :class:`FeatureEncoder`: open_clip's own eval preprocessing of the images (read as vlp reads
    images) and its tokenizer of the raw captions; cache kind ``learned``, ``helper_init`` ``init``
    (``random`` only for a spec without weights: :func:`~vlp.models.open_clip_helper.require_weights`).
    ``key`` (``--helper`` or ``loss.srcl.helper``) is named by the errors of a bad spec."""
    from vlp.models.open_clip_helper import OpenClipHelper

    helper = OpenClipHelper.load(spec, key, init=init)
    meta = {
        "kind": "learned",
        "helper": spec,
        "helper_init": init,
        "arch": helper.spec.model_name,
        "pretrained": helper.pretrained,
        "image_size": helper.image_size,
        "context_length": helper.context_length,
    }
    return FeatureEncoder(helper.preprocess, helper.encode_image, helper.encode_text, meta)


#: a part of a cache's image rows: image keys, their features [N, E] in that order, the captions met
ImageRows = tuple[list[str], torch.Tensor, set[str]]


@torch.no_grad()
def write_feature_cache(
    out: str | Path,
    data: Sequence[str],
    encoder: FeatureEncoder,
    image_root: Optional[str] = None,
    batch_size: int = 256,
    num_workers: int = 0,
    show_progress: bool = True,
    caption_key: str = "caption",
) -> Path:
    """The helper-feature cache (:mod:`vlp.features.helper_cache`) ``out`` of ``data``: annotation
    files and shard entries (shard folders, brace patterns of tars, URL entries:
    :mod:`vlp.data.shard_samples`; ``caption_key``: img2dataset's caption key). Every image goes
    through the encoder's ``preprocess`` and ``encode_image``, every distinct caption through its
    ``encode_text``, in batches of ``batch_size``, with progress bars; rows are keyed as training
    looks them up (a shard sample by its ``image_key``). ``index.json`` records the encoder's
    ``meta``, ``data`` and, for shard entries, the ``shards`` read (what a URL shard set is checked
    against)."""
    from vlp.data.shard_format import read_sizes
    from vlp.data.shard_samples import shard_name, split_data
    from vlp.features.helper_cache import write_cache
    from vlp.progress import progress

    files, entries = split_data(data)
    shards = read_sizes(entries, caption_key) if entries else []
    parts = [_file_image_rows(files, encoder, image_root, batch_size, num_workers, show_progress)] if files else []
    if shards:
        parts.append(_shard_image_rows(shards, encoder, batch_size, num_workers, show_progress))
    keys, image, texts = _merged_rows(parts, data)
    bar = progress(len(texts), "helper features (captions)", show_progress)
    text_feats = []
    for start in range(0, len(texts), batch_size):
        text_feats.append(encoder.encode_text(texts[start : start + batch_size]).float().cpu())
        bar.update(len(text_feats[-1]))
    bar.close()
    meta = {**encoder.meta, "data": [str(d) for d in data]}
    if entries:
        meta["shards"] = [shard_name(s) for s in shards]
    return write_cache(out, keys, image, texts, torch.cat(text_feats), meta)


def _file_image_rows(
    files: list[str], encoder: FeatureEncoder, image_root: Optional[str], batch_size: int, workers: int, bar: bool
) -> ImageRows:
    """The image rows of annotation ``files``: every distinct image key, its image read from disk."""
    from torch.utils.data import DataLoader

    from vlp.data.datasets import ImageDataset
    from vlp.data.formats import load_pairs
    from vlp.features.helper_cache import cache_rows
    from vlp.progress import progress

    samples = load_pairs(files, image_root)
    check_images(samples)
    paths, keys, texts = cache_rows(samples)
    dataset = ImageDataset([paths[k] for k in keys], encoder.preprocess, "helper cache")
    shown = progress(len(keys), "helper features (images)", bar)
    feats = []
    for images in DataLoader(dataset, batch_size=batch_size, num_workers=workers):
        feats.append(encoder.encode_image(images).float().cpu())
        shown.update(len(images))
    shown.close()
    return keys, torch.cat(feats), set(texts)


def _shard_image_rows(shards: Sequence, encoder: FeatureEncoder, batch_size: int, workers: int, bar: bool) -> ImageRows:
    """The image rows of ``shards`` (:class:`~vlp.data.shard_format.ShardInfo`): every readable sample,
    its image decoded from the tar member as it streams by (loader workers split the shards)."""
    import json

    from torch.utils.data import DataLoader

    from vlp.data.shard_samples import ShardImages
    from vlp.progress import progress

    shown = progress(sum(s.images for s in shards), "helper features (shard images)", bar)
    keys: list[str] = []
    feats: list[torch.Tensor] = []
    texts: set[str] = set()
    for batch_keys, captions, images in DataLoader(
        ShardImages(shards, encoder.preprocess), batch_size=batch_size, num_workers=min(workers, len(shards))
    ):
        feats.append(encoder.encode_image(images).float().cpu())
        keys += batch_keys
        texts.update(c for caps in captions for c in json.loads(caps))
        shown.update(len(images))
    shown.close()
    if not keys:
        raise DataError(f"{len(shards)} shard(s) from {shards[0].path} on: no readable sample to cache")
    return keys, torch.cat(feats), texts


def _merged_rows(parts: list[ImageRows], data: Sequence[str]) -> tuple[list[str], torch.Tensor, list[str]]:
    """The parts' image keys sorted with their features [N, E] in that order, and the sorted captions.
    An image key met twice (two img2dataset folders numbering their samples alike) is one
    :class:`DataError`: a cache row per key cannot tell the two images apart."""
    keys = [k for p in parts for k in p[0]]
    image = torch.cat([p[1] for p in parts])
    order = sorted(range(len(keys)), key=keys.__getitem__)
    twice = next((keys[a] for a, b in zip(order, order[1:]) if keys[a] == keys[b]), None)
    if twice is not None:
        raise DataError(
            f"--data {list(data)}: image key {twice!r} is held by two samples, whose features would share "
            "one cache row; build one cache per shard set whose keys repeat"
        )
    return [keys[i] for i in order], image[order], sorted(set().union(*(p[2] for p in parts)))


def open_clip_helper_cache(cfg: PretrainConfig, poll_s: float = 2.0) -> HelperCache:
    """The helper-feature cache of ``loss.srcl.helper=open_clip:...``, used exactly as
    ``loss.srcl.helper_features``. An open_clip helper cannot run live on the training batch (that
    carries BERT token ids and vlp-transformed images; open_clip needs its own tokenizer and
    preprocessing of the raw data), so its features of ``data.train`` are computed once, before the
    first step, into ``<output_dir>/helper_features_open_clip`` (:func:`open_clip_encoder`).
    An existing cache (a resumed run) is reused if the same helper built it. With several processes
    the main one (launch rank 0) builds it and the others wait until it appears (it appears whole:
    the cache writer renames a finished folder)."""
    import time

    s, d = cfg.loss.srcl, cfg.data
    require_weights(str(s.helper), s.helper_init, "loss.srcl.helper")  # a reused cache too
    if d.format != "json":
        raise ConfigError(
            f"config key 'loss.srcl.helper': an open_clip helper ({s.helper}) is cached here from annotation files "
            f"only, not data.format={d.format}; build the cache with `vlp cache-helper-features --helper {s.helper} "
            "--data ENTRIES` (data.train's shard entries) and set loss.srcl.helper_features instead"
        )
    out = Path(cfg.output_dir) / OPEN_CLIP_CACHE
    rank = launch_rank()[0]
    if rank == 0 and not out.exists():
        print(f"loss.srcl.helper={s.helper}: caching its features of data.train into {out}")
        encoder = open_clip_encoder(str(s.helper), key="loss.srcl.helper", init=s.helper_init)
        write_feature_cache(
            out, d.train, encoder, d.image_root, num_workers=d.num_workers, show_progress=cfg.train.progress
        )
    elif not out.exists():
        print(f"rank {rank}: waiting for rank 0 to cache the open_clip helper's features into {out}", file=sys.stderr)
        while not out.exists():
            time.sleep(poll_s)
    cache = HelperCache.load(out)
    if cache.meta.get("helper") != s.helper:
        raise ConfigError(
            f"config key 'loss.srcl.helper': {out} holds the features of {cache.meta.get('helper')!r}, not of "
            f"{s.helper!r}; remove that folder (it is rebuilt) or choose another output_dir"
        )
    check_helper_init(cache, s.helper_init, "loss.srcl.helper")
    return cache
