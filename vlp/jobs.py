"""Jobs: the glue that reads files, builds model/task/data and runs the loop or the evaluator.

This is the only layer (with ``cli``) that touches the filesystem for runs.
"""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import torch
from accelerate.utils import set_seed
from torch.utils.data import DataLoader

from vlp import __version__
from vlp.config import BadSampleConfig, ConfigError, EvalConfig, LTDConfig, ModelConfig, PretrainConfig, apply_overrides, from_dict, to_dict, to_yaml
from vlp.data.datasets import BAD_SAMPLE_HINT, Collator, ImageTextDataset, train_loader
from vlp.data.helper_cache import HelperCache, write_cache
from vlp.data.targets import LatentTargets
from vlp.data.formats import DataError, load_pairs, load_relevance, load_retrieval_split
from vlp.data.transforms import PixelNorm, load_tokenizer, test_transform, train_transform
from vlp.dist import barrier, is_dist, launch_rank, rank, world_size
from vlp.eval.retrieval import RetrievalResult, check_k_test, embed, evaluate_retrieval
from vlp.models.albef import ALBEF, param_count
from vlp.models.build import build_task_model, model_image_size
from vlp.models.dual import DualEncoder
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.dual import DualTask
from vlp.tasks.pretrain import PretrainTask
from vlp.tasks.reconstruction import Reconstruction
from vlp.tasks.regulation import SRCLRegulator, helper_span
from vlp.models.loading import CheckpointError
from vlp.models.vision import check_vision_init, write_init_report
from vlp.train.checkpoint import find_checkpoint, load_weights, read_state
from vlp.train.loop import make_accelerator, train


def token_info(tokenizer) -> TokenInfo:
    return TokenInfo(len(tokenizer), tokenizer.mask_token_id, tuple(sorted(set(tokenizer.all_special_ids))))


def image_size(cfg: PretrainConfig) -> int:
    return model_image_size(cfg.model)


def build_model(cfg: PretrainConfig, vocab_size: int) -> Union[ALBEF, DualEncoder]:
    return build_task_model("pretrain", cfg.model, vocab_size)


def checkpoint_model_config(state: dict) -> ModelConfig:
    """The model config recorded in a checkpoint's ``state.json`` (fine-tuned checkpoints carry it
    under "model"; pretraining ones inside their "config")."""
    if "model" in state:
        return from_dict(ModelConfig, state["model"])
    return from_dict(PretrainConfig, state["config"]).model


def load_targets_for(ltd: LTDConfig) -> Optional[LatentTargets]:
    """The LTD latent targets (None unless ``loss.ltd`` decodes latent targets)."""
    return LatentTargets.load(ltd.targets, ltd.encoder) if ltd.mode != "off" and ltd.decoder == "latent" else None


def load_targets(cfg: PretrainConfig) -> Optional[LatentTargets]:
    return load_targets_for(cfg.loss.ltd)


def build_reconstruction(ltd: LTDConfig, embed_dim: int, targets: Optional[LatentTargets],
                         vocab_size: int) -> Optional[Reconstruction]:
    """The LTD / ITD head and multiplier of ``loss.ltd`` (None when off)."""
    if ltd.mode == "off":
        return None
    return Reconstruction(ltd, embed_dim, targets.dim if targets is not None else None, vocab_size)


def build_task(cfg: PretrainConfig, model: Union[ALBEF, DualEncoder], tokenizer, regulator: Optional[SRCLRegulator],
               targets: Optional[LatentTargets]) -> torch.nn.Module:
    """The training task for the config's architecture, with LTD / ITD attached if configured."""
    rec = build_reconstruction(cfg.loss.ltd, cfg.model.embed_dim, targets, len(tokenizer))
    if cfg.model.arch == "dual":
        task = DualTask(model, cfg.loss, rec)
    else:
        task = PretrainTask(model, cfg.loss, token_info(tokenizer), cfg.train.seed, regulator, rec,
                            max_len=cfg.model.text.max_len, text_padding=cfg.data.text_padding)
    if cfg.data.image.uint8:
        task.pixel_norm = PixelNorm(cfg.data.image)
    return task


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
        raise DataError(f"{n} of {total} image files not found ({n / total:.2%}), more than "
                        f"data.max_bad_fraction={data.max_bad_fraction:g}, e.g. {listed}")
    if launch_rank()[0] == 0:
        print(f"vlp data: warning: {n} of {total} image files not found ({n / total:.2%}); data.on_bad_sample=skip "
              f"replaces them at training time, e.g. {listed}", file=sys.stderr)


def bad_sample_args(data: BadSampleConfig) -> dict:
    """The bad-sample keywords of the training datasets and the shard loader (``data.*`` keys)."""
    return {"on_bad": data.on_bad_sample, "max_pixels": data.max_image_pixels, "min_side": data.min_image_side}


def prepare_run_dir(cfg: PretrainConfig) -> Path:
    """Create the run directory; refuse one that already holds a run (nothing written is lost)
    unless the run resumes (``train.resume``). Writes ``config.yaml`` and ``run_info.json``."""
    run_dir = Path(cfg.output_dir)
    if cfg.train.resume:
        if not run_dir.is_dir():
            raise DataError(f"config key 'train.resume': output_dir {run_dir} does not exist; resume into the "
                            "directory of the run that wrote the checkpoint")
    elif (run_dir / "metrics.jsonl").exists() or any((run_dir / "checkpoints").glob("step_*")):
        raise DataError(f"config key 'output_dir': {run_dir} already holds a run (metrics.jsonl or "
                        "checkpoints/); choose another output_dir or move that run away")
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    if launch_rank()[0] == 0:  # versions, revision, devices, command line; a resume appends to "resumes"
        from vlp.train.logging import write_run_info

        write_run_info(run_dir, resumed=bool(cfg.train.resume))
    return run_dir


@dataclass
class Pretraining:
    """What a pretraining run is made of (shared by ``vlp pretrain`` and ``vlp bench``)."""

    model: torch.nn.Module
    task: torch.nn.Module
    loader: Iterable  # a DataLoader, or the webdataset ShardLoader
    pairs: int
    images: int

    def accelerator(self, cfg: PretrainConfig):
        """The run's accelerator (parameters the objective leaves unused are frozen by the task's
        ``unused_parameters``, so DDP runs without ``find_unused_parameters``)."""
        return make_accelerator(cfg.train, micro_batch=cfg.data.batch_size)


def build_pretraining(cfg: PretrainConfig) -> Pretraining:
    """Seeded model, task and shuffled fixed-size-batch loader of a pretraining config."""
    if not cfg.data.train:
        raise DataError("config key 'data.train': no annotation files given")
    check_run(cfg)
    set_seed(cfg.train.seed)
    tokenizer = load_tokenizer(cfg.model.text)
    regulator, cache = build_regulator(cfg)
    targets = load_targets(cfg)
    loader, pairs, images = build_train_loader(cfg, tokenizer, cache, targets)  # data errors before the model
    model = build_model(cfg, len(tokenizer))
    task = build_task(cfg, model, tokenizer, regulator, targets)
    return Pretraining(model, task, loader, pairs, images)


def check_queue(queue_size: int, batch_size: int, key: str = "data.batch_size") -> None:
    """A feature queue receives every rank's batch each step (ALBEF): a smaller one would drop
    features of the batch it is given (0 disables the queue)."""
    world = launch_rank()[1]
    if 0 < queue_size < batch_size * world:
        raise ConfigError(f"config keys 'model.queue_size'/'{key}': a queue of {queue_size} is smaller than the global "
                          f"batch ({batch_size} x {world} processes = {batch_size * world}) it receives each step; "
                          "raise model.queue_size (ALBEF: 65536) or set it to 0 (in-batch negatives only)")


def check_run(cfg: PretrainConfig) -> None:
    """Combinations that need the launch or the evaluation data, checked before any work starts."""
    if cfg.model.arch == "albef":
        check_queue(cfg.model.queue_size, cfg.data.batch_size)
        check_vision_init(cfg.model.vision)
    if cfg.data.eval:
        split = load_retrieval_split(cfg.data.eval, cfg.data.image_root)
        check_k_test(cfg.eval, len(split.images), len(split.texts), f"data.eval ({split.source})")


def build_train_loader(cfg: PretrainConfig, tokenizer, cache: Optional[HelperCache],
                       targets: Optional[LatentTargets]) -> tuple[Iterable, int, int]:
    """(loader, pairs, images) of ``data.train``: ALBEF JSON files (map-style, shuffled per (seed,
    epoch), items seeded per (seed, epoch, index), fixed-size batches; accelerate shards it over the
    ranks: :func:`vlp.data.datasets.train_loader`) or webdataset shard folders (``data.format``;
    the stream splits itself by rank and worker, :mod:`vlp.data.shards`). Bad samples follow
    ``data.on_bad_sample`` (missing files are checked first: :func:`check_images`)."""
    d = cfg.data
    transform = train_transform(image_size(cfg), d.image)
    collate = Collator(tokenizer, cfg.model.text.max_len, d.text_padding)
    if d.format == "webdataset":
        from vlp.data.shards import ShardLoader

        stream = ShardLoader(d.train, transform, collate, d.batch_size, *launch_rank(), num_workers=d.num_workers,
                             seed=cfg.train.seed, shuffle_buffer=d.shuffle_buffer, caption_mode=d.caption_mode,
                             captions_per_image=d.captions_per_image, helper_cache=cache, targets=targets,
                             **bad_sample_args(d))
        return stream, stream.pairs, stream.images
    samples = load_pairs(d.train, d.image_root, on_bad=d.on_bad_sample)
    check_images(samples, d)
    dataset = ImageTextDataset(samples, transform, cache, targets, d.captions_per_image, **bad_sample_args(d))
    loader = train_loader(dataset, d.batch_size, collate, d.num_workers, cfg.train.seed)
    return loader, len(dataset), len(dataset.key_to_id)


def run_pretrain(cfg: PretrainConfig) -> Path:
    """Pretrain per ``cfg``; returns the run directory (config.yaml, metrics.jsonl, checkpoints/)."""
    run = build_pretraining(cfg)
    run_dir = prepare_run_dir(cfg)
    print(f"vlp pretrain: {run.pairs} pairs, {run.images} images, "
          f"{param_count(run.model) / 1e6:.1f}M trainable parameters -> {run_dir}")
    write_init_report(run.model, run_dir)  # vision_init_report.json + one line
    state = {"task": "pretrain", "vlp_version": __version__, "config": to_dict(cfg), "model": to_dict(cfg.model)}
    train(run.task, run.loader, cfg.train, run_dir, state, accelerator=run.accelerator(cfg),
          max_bad_fraction=cfg.data.max_bad_fraction)
    if cfg.data.eval:
        run_evaluate_retrieval(run_dir, cfg.data.eval, cfg.data.relevance, run_dir / "eval", cfg.data.image_root,
                               graded_relevance=cfg.data.graded_relevance)
    return run_dir


def build_regulator(cfg: PretrainConfig, finetune: bool = False) -> tuple[Optional[SRCLRegulator], Optional[HelperCache]]:
    """The SRCL regulator of a run (None for ``loss.regulation: none``) and the helper-feature
    cache it reads (None in live-helper mode and when the helper is not used, e.g. fine-tuning)."""
    mode, s = cfg.loss.regulation, cfg.loss.srcl
    if mode == "none":
        return None, None
    cache, helper, dim = None, None, 1
    if helper_span(s, cfg.train.steps, finetune) > 0:
        if s.helper_features:
            cache = HelperCache.load(s.helper_features)
            dim = cache.dim
        elif s.helper:
            helper, hcfg, _ = load_model(s.helper, torch.device("cpu"))
            if image_size(hcfg) != image_size(cfg) or hcfg.model.text.tokenizer != cfg.model.text.tokenizer:
                raise ConfigError(f"config key 'loss.srcl.helper': the live helper {s.helper} must take the same "
                                  f"images ({image_size(hcfg)} px vs {image_size(cfg)} px) and tokenizer as the model")
            dim = hcfg.model.embed_dim
        else:
            raise ConfigError(f"config key 'loss.srcl.helper_features': loss.regulation={mode} needs helper features: "
                              "a cache from `vlp cache-helper-features` (or loss.srcl.helper for a live helper)")
    return SRCLRegulator(s, mode, cfg.train.steps, cfg.model.queue_size, dim, finetune, helper), cache


def run_train_helper(cfg: PretrainConfig) -> Path:
    """Train the SRCL helper: the same architecture with plain InfoNCE (ITC only, no distillation,
    no regulation) on clean captions. Its checkpoint is what SRCL freezes."""
    c = cfg.loss
    wrong = [f"{k}={v}" for k, v in (("loss.itm", c.itm), ("loss.mlm", c.mlm)) if v != 0]
    wrong += ["loss.distill=true"] if c.distill else []
    wrong += [f"loss.regulation={c.regulation}"] if c.regulation != "none" else []
    if wrong or c.itc <= 0:
        raise ConfigError(f"config keys {', '.join(wrong) or 'loss.itc<=0'}: a helper is trained with plain InfoNCE "
                          "(loss.itc > 0, loss.itm=0, loss.mlm=0, loss.distill=false, loss.regulation=none)")
    return run_pretrain(cfg)


@torch.no_grad()
def run_cache_helper_features(helper: str | Path, data: Sequence[str], out: str | Path, image_root: Optional[str] = None,
                              batch_size: int = 256, num_workers: int = 0, show_progress: bool = True) -> Path:
    """Features of every image (eval transform) and caption of ``data`` under the frozen helper,
    written to the cache folder ``out`` that ``loss.srcl.helper_features`` points at."""
    from vlp.data.datasets import ImageDataset
    from vlp.data.transforms import tokenize
    from vlp.progress import progress

    if Path(out).exists():
        raise DataError(f"{out} already exists; choose another --out or remove it")
    ckpt = find_checkpoint(helper)
    model, hcfg, tokenizer = load_model(ckpt)
    device = next(model.parameters()).device
    samples = load_pairs(list(data), image_root)
    check_images(samples)
    paths = {}
    for smp in samples:
        paths.setdefault(smp.image_key, smp.image)
    keys = sorted(paths)
    texts = sorted({c for smp in samples for c in smp.captions})
    bar = progress(len(keys) + len(texts), "helper features", show_progress)
    loader = DataLoader(ImageDataset([paths[k] for k in keys], test_transform(image_size(hcfg), hcfg.data.image),
                                     "helper cache"), batch_size=batch_size, num_workers=num_workers)
    image_feats = []
    for images in loader:
        image_feats.append(model.encode_image(images.to(device)).feat.float().cpu())
        bar.update(len(images))
    text_feats = []
    for start in range(0, len(texts), batch_size):
        tok = tokenize(tokenizer, texts[start : start + batch_size], hcfg.model.text.max_len)
        text_feats.append(model.encode_text(tok["input_ids"].to(device), tok["attention_mask"].to(device)).feat.float().cpu())
        bar.update(len(text_feats[-1]))
    bar.close()
    meta = {"helper": str(ckpt.resolve()), "helper_step": read_state(ckpt).get("step"), "data": [str(d) for d in data],
            "image_size": image_size(hcfg), "max_len": hcfg.model.text.max_len}
    return write_cache(out, keys, torch.cat(image_feats), texts, torch.cat(text_feats), meta)


def run_make_targets(data: Sequence[str], encoder: str, out: str | Path, batch_size: int = 256,
                     show_progress: bool = True) -> Path:
    """Embed every distinct caption of the annotation files ``data`` once with a sentence encoder
    and write the LTD targets file ``out`` (``loss.ltd.targets``)."""
    from vlp.data.targets import encode_sentences, write_targets

    if Path(out).exists():
        raise DataError(f"{out} already exists; choose another --out or remove it")
    captions = sorted({c for smp in load_pairs(list(data)) for c in smp.captions})
    print(f"vlp make-targets: {len(captions)} distinct captions, encoder {encoder}")
    vectors = encode_sentences(encoder, captions, batch_size, str(default_device()), show_progress)
    return write_targets(out, captions, vectors, encoder, [str(Path(d).resolve()) for d in data])


def load_model(checkpoint: str | Path, device: Optional[torch.device] = None):
    """Model, config and tokenizer from a checkpoint folder or run directory (strict load). The
    model is the checkpoint's kind (pretraining ALBEF, dual encoder, retrieval, VQA, NLVR2); the
    config is a :class:`PretrainConfig` (a fine-tuned checkpoint's model, image and eval settings)."""
    from vlp.config import FINETUNE_TASKS, FinetuneConfig

    ckpt = find_checkpoint(checkpoint)
    state = read_state(ckpt)
    kind = state.get("task", "pretrain")
    if kind in FINETUNE_TASKS:
        ft = from_dict(FinetuneConfig, state["config"])
        cfg = PretrainConfig(model=checkpoint_model_config(state), eval=ft.eval)
        cfg.data.image = ft.data.image
    else:
        cfg = from_dict(PretrainConfig, state["config"])
    cfg.model.text.init = "random"  # the checkpoint holds every weight: skip initial-weight loading
    cfg.model.vision.pretrained = None
    cfg.model.dual.image_pretrained = None
    tokenizer = load_tokenizer(cfg.model.text)
    model = build_task_model(kind, cfg.model, len(tokenizer))
    load_weights(model, ckpt)
    model.eval()
    return model.to(device or default_device()), cfg, tokenizer


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# Zero-shot protocols (docs/evaluation.md): which checkpoint kind each takes and the eval settings.
EVAL_PRESETS: dict[str, dict] = {
    # A raw pretrained checkpoint at its pretraining resolution (ALBEF#25), ITM re-ranking.
    "zero-shot": {"kinds": ("pretrain", "helper"), "overrides": ["eval.score=itm"],
                  "about": "raw pretrained checkpoint at its pretraining resolution, ITC top-k + ITM re-rank"},
    # ALBEF/BLIP "zero-shot Flickr30k": the COCO-fine-tuned retrieval checkpoint evaluated on Flickr30k
    # at its fine-tuning resolution, k_test 128 (ALBEF#29, #74, #89).
    "albef-flickr": {"kinds": ("retrieval",), "overrides": ["eval.score=itm", "eval.k_test=128"],
                     "about": "ALBEF protocol: COCO-fine-tuned retrieval checkpoint on Flickr30k, k_test 128, ITM"},
}


def launcher_device() -> torch.device:
    """This process's device. Launched as several processes (torchrun, accelerate launch: the
    launcher sets WORLD_SIZE > 1), it joins the launcher's process group, starting it if no group
    exists yet (accelerate: NCCL on GPUs, gloo on CPU), and takes its own GPU. One process: the
    default device, no group."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState

        return PartialState(cpu=not torch.cuda.is_available()).device
    return default_device()


def run_evaluate_retrieval(
    checkpoint: str | Path,
    data: str | Path,
    relevance: Optional[str | Path],
    out: str | Path,
    image_root: Optional[str] = None,
    overrides: Sequence[str] = (),
    show_progress: bool = True,
    graded_relevance: Optional[str | Path] = None,
    preset: Optional[str] = None,
) -> RetrievalResult:
    """Zero-shot retrieval of a checkpoint on a Karpathy-style split; writes ``out/metrics.json``
    and ``out/retrieval_examples.png``. ``graded_relevance`` (a ``.npy`` [texts, images] of gains,
    needs ``relevance``) gives the text->image nDCG graded gains instead of binary ones.

    Launched as several processes, every process must call it: encoding and ITM scoring are split
    over the ranks (:mod:`vlp.eval.retrieval`), every rank returns the same result and rank 0
    alone prints and writes files."""
    from vlp.data.formats import load_graded_relevance

    if graded_relevance and not relevance:
        raise DataError(f"graded relevance {graded_relevance} needs the relevance file as well (--relevance / "
                        "data.relevance): R-precision, mAP and relevance-aware recall use its lists")
    device = launcher_device()
    main, sharded = rank() == 0, is_dist()
    if sharded:  # after a multi-process run (vlp pretrain), rank 0 has written the newest checkpoint
        barrier()
    ckpt = find_checkpoint(checkpoint)
    kind = read_state(ckpt).get("task", "pretrain")
    if preset is not None:
        p = EVAL_PRESETS[preset]
        if kind not in p["kinds"]:
            raise CheckpointError(f"{ckpt}: --preset {preset} takes a {' or '.join(p['kinds'])} checkpoint "
                                  f"({p['about']}); this one is a {kind} checkpoint")
        overrides = [*p["overrides"], *overrides]
    elif kind not in ("pretrain", "helper", "retrieval"):
        raise CheckpointError(f"{ckpt}: a {kind} checkpoint has no retrieval heads (ITC/ITM)")
    if preset is not None and main:
        print(f"protocol {preset}: {EVAL_PRESETS[preset]['about']}")
    show_progress = show_progress and main
    model, cfg, tokenizer = load_model(ckpt, device)
    cfg = apply_overrides(cfg, overrides)
    ecfg: EvalConfig = cfg.eval
    split = load_retrieval_split(data, image_root)
    rel = load_relevance(relevance, split) if relevance else None
    graded = load_graded_relevance(graded_relevance, split) if graded_relevance else None
    check_k_test(ecfg, len(split.images), len(split.texts), split.source)  # before any encoding
    emb = embed(model, split, tokenizer, test_transform(image_size(cfg), cfg.data.image), cfg.model.text.max_len,
                ecfg.batch_size, device, show_progress, num_workers=ecfg.resolved_workers(), precision=ecfg.precision,
                distributed=sharded, offload=ecfg.offload)
    result = evaluate_retrieval(model, emb, split, ecfg, rel, show_progress, graded_relevance=graded, distributed=sharded)
    if not main:
        return result
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    record = {**result.metrics, "score": ecfg.score, "k_test": ecfg.k_test, "precision": ecfg.resolved_precision(device),
              "offload": ecfg.resolved_offload(device),
              "processes": world_size(), "preset": preset, "checkpoint_kind": kind,
              "image_size": image_size(cfg), "n_images": len(split.images),
              "n_texts": len(split.texts), "checkpoint": str(ckpt)}
    if rel is not None:
        record["ndcg_gains"] = "graded" if graded is not None else "binary"
    (out / "metrics.json").write_text(json.dumps(record, indent=2))
    from vlp.viz import plot_retrieval_examples

    plot_retrieval_examples(split, result.scores_t2i, out / "retrieval_examples.png", rel)
    return result


@torch.no_grad()
def run_srcl_weight_plots(run: str | Path, out: Optional[str | Path] = None, heatmap_size: int = 10, batches: int = 50,
                          alpha_h: Optional[float] = None, overrides: Sequence[str] = (),
                          show_progress: bool = True) -> dict[str, Path]:
    """SRCL weights of a checkpoint on its training data (eval transform, in-batch negatives):
    ``srcl_weights_heatmap.png`` (one batch of ``heatmap_size``, images and captions labelled) and
    ``srcl_weights_hist.png`` (negatives over ``batches`` training batches). ``alpha_h`` defaults
    to the schedule's value at the checkpoint's step. A run without regulation is shown with its
    ``loss.srcl`` settings (what SRCL would do), which then need helper features."""
    from vlp.viz import plot_weight_heatmap, plot_weight_histogram
    from vlp.progress import progress

    ckpt = find_checkpoint(run)
    model, cfg, tokenizer = load_model(ckpt)
    cfg = apply_overrides(cfg, overrides)
    if cfg.loss.regulation == "none":
        cfg.loss.regulation = "srcl"
    regulator, cache = build_regulator(cfg)
    device = next(model.parameters()).device
    regulator.to(device)
    step = int(read_state(ckpt).get("step", 0))
    a = regulator.alpha_h(step) if alpha_h is None else alpha_h
    samples = load_pairs(cfg.data.train, cfg.data.image_root)
    dataset = ImageTextDataset(samples, test_transform(image_size(cfg), cfg.data.image), cache)
    collate = Collator(tokenizer, cfg.model.text.max_len, cfg.data.text_padding)

    def weights(batch: dict) -> tuple:
        batch = {k: v.to(device) for k, v in batch.items()}
        img = model.encode_image(batch["images"]).feat
        txt = model.encode_text(batch["input_ids"], batch["attention_mask"]).feat
        img_m = model.encode_image(batch["images"], momentum=True).feat
        txt_m = model.encode_text(batch["input_ids"], batch["attention_mask"], momentum=True).feat
        ids = batch["image_ids"]
        pos = torch.eye(len(ids), dtype=torch.bool, device=device)
        same = ids[:, None] == ids[None, :]
        helper = regulator.helper_features(batch, 0) if a > 0 else None
        r = regulator.regulate(img @ txt_m.T, txt @ img_m.T, pos, same, helper, step, alpha_h=a)
        return r, pos

    out = Path(out) if out is not None else Path(run) / "srcl_plots"
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    first = torch.randperm(len(dataset), generator=gen)[:heatmap_size].tolist()
    items = [dataset[i] for i in first]
    r, _ = weights(collate(items))
    caps = [it["caption"] for it in items]
    title = (f"SRCL weights (i2t rows), {cfg.loss.srcl.norm} norm, delta={cfg.loss.srcl.delta:g}, alpha_h={a:.2f}, "
             f"step {step}, batch of {len(first)}")
    heat = plot_weight_heatmap(r.w_i2t.cpu(), [dataset.samples[i].image for i in first], caps,
                               out / "srcl_weights_heatmap.png", title)
    loader = DataLoader(dataset, batch_size=cfg.data.batch_size, shuffle=True, drop_last=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(1))
    vals = []
    bar = progress(min(batches, len(loader)), "srcl weights", show_progress)
    for k, batch in enumerate(loader):
        if k == batches:
            break
        r, pos = weights(batch)
        vals += [r.w_i2t[~pos].cpu(), r.w_t2i[~pos].cpu()]
        bar.update(1)
    bar.close()
    hist = plot_weight_histogram(torch.cat(vals), out / "srcl_weights_hist.png",
                                 f"negatives' weights over {len(vals) // 2} batches of {cfg.data.batch_size}, "
                                 f"alpha_h={a:.2f}, step {step}")
    return {"heatmap": heat, "histogram": hist}


@torch.no_grad()
def run_cocos(checkpoint: str | Path, data: Sequence[str], loss: str, out: str | Path, threshold: float = 0.01,
              batches: Optional[int] = None, overrides: Sequence[str] = (), show_progress: bool = True) -> dict:
    """COCOS (docs/methods.md): how many candidates contribute to the gradient of each query under
    ``loss``, over one pass of ``data`` (the training split) in eval mode with test transforms, at
    the run's batch size (``data.batch_size``, ``data.captions_per_image``; override them). Writes
    ``out/cocos.json`` (mean and std over batches of every statistic, per direction) and
    ``out/cocos.png`` (per-query count histograms)."""
    from vlp.losses.cocos import cocos
    from vlp.progress import progress
    from vlp.viz import plot_cocos

    ckpt = find_checkpoint(checkpoint)
    model, cfg, tokenizer = load_model(ckpt)
    cfg = apply_overrides(cfg, overrides)
    c = cfg.loss.contrastive
    tau = c.tau if c.tau is not None else float(getattr(model, "temp", 0.05))
    samples = load_pairs(list(data), cfg.data.image_root)
    check_images(samples)
    dataset = ImageTextDataset(samples, test_transform(image_size(cfg), cfg.data.image),
                               captions_per_image=cfg.data.captions_per_image)
    loader = DataLoader(dataset, batch_size=cfg.data.batch_size, shuffle=True, drop_last=len(dataset) >= cfg.data.batch_size,
                        collate_fn=Collator(tokenizer, cfg.model.text.max_len, cfg.data.text_padding),
                        generator=torch.Generator().manual_seed(0))
    device = next(model.parameters()).device
    n = len(loader) if batches is None else min(batches, len(loader))
    per_batch: dict[str, list[float]] = {}
    counts: dict[str, list[torch.Tensor]] = {"i2t": [], "t2i": []}
    bar = progress(n, f"cocos {loss}", show_progress)
    random.seed(0)  # the caption drawn per image
    for k, batch in enumerate(loader):
        if k == n:
            break
        batch = {key: v.to(device) for key, v in batch.items()}
        img = model.encode_image(batch["images"]).feat
        txt = model.encode_text(batch["input_ids"], batch["attention_mask"]).feat
        txt_ids = batch.get("text_image_ids", batch["image_ids"])
        pos = batch["image_ids"][:, None] == txt_ids[None, :]
        for direction, sim, p in (("i2t", img @ txt.T, pos), ("t2i", txt @ img.T, pos.T)):
            stats = cocos(loss, sim, p, tau=tau, margin=c.margin, smoothap_tau=c.smoothap_tau, threshold=threshold)
            counts[direction].append(stats.pop("counts").float().cpu())
            for key, v in stats.items():
                per_batch.setdefault(f"{direction}_{key}", []).append(float(v))
        bar.update(1)
    bar.close()
    summary = {key: {"mean": float(torch.tensor(v).nanmean()), "std": float(torch.tensor(v).std()) if len(v) > 1 else 0.0}
               for key, v in per_batch.items()}
    record = {"loss": loss, "checkpoint": str(ckpt), "data": [str(d) for d in data], "batches": n,
              "batch_size": cfg.data.batch_size, "captions_per_image": cfg.data.captions_per_image, "tau": tau,
              "margin": c.margin, "smoothap_tau": c.smoothap_tau, "threshold": threshold, "stats": summary}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cocos.json").write_text(json.dumps(record, indent=2))
    plot_cocos({d: torch.cat(v) for d, v in counts.items()}, out / "cocos.png",
               f"COCOS {loss}: contributing candidates per query ({n} batches of {cfg.data.batch_size}, eval mode)")
    return record
