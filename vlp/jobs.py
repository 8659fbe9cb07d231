"""Jobs: the glue that reads files, builds model/task/data and runs the loop or the evaluator.

This is the only layer (with ``cli``) that touches the filesystem for runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence

import torch
from accelerate.utils import set_seed
from torch.utils.data import DataLoader

from vlp import __version__
from vlp.config import VISION_PRESETS, EvalConfig, PretrainConfig, apply_overrides, from_dict, resolved, to_dict, to_yaml
from vlp.data.datasets import Collator, ImageTextDataset
from vlp.data.formats import DataError, load_pairs, load_relevance, load_retrieval_split
from vlp.data.transforms import load_tokenizer, test_transform, train_transform
from vlp.eval.retrieval import RetrievalResult, embed, evaluate_retrieval
from vlp.models.albef import ALBEF, param_count
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.pretrain import PretrainTask
from vlp.train.checkpoint import find_checkpoint, load_weights, read_state
from vlp.train.loop import train


def token_info(tokenizer) -> TokenInfo:
    return TokenInfo(len(tokenizer), tokenizer.mask_token_id, tuple(sorted(set(tokenizer.all_special_ids))))


def image_size(cfg: PretrainConfig) -> int:
    return resolved(cfg.model.vision, VISION_PRESETS)["img_size"]


def check_images(samples: Sequence, limit: int = 5) -> None:
    """Fail before training if image files are missing, naming the first few."""
    missing = [s for s in samples if not os.path.isfile(s.image)]
    if missing:
        listed = "; ".join(f"{s.origin}: {s.image}" for s in missing[:limit])
        raise DataError(f"{len(missing)} of {len(samples)} image files not found, e.g. {listed}")


def prepare_run_dir(cfg: PretrainConfig) -> Path:
    """Create the run directory; refuse one that already holds a run (nothing written is lost)."""
    run_dir = Path(cfg.output_dir)
    if (run_dir / "metrics.jsonl").exists() or any((run_dir / "checkpoints").glob("step_*")):
        raise DataError(f"config key 'output_dir': {run_dir} already holds a run (metrics.jsonl or "
                        "checkpoints/); choose another output_dir or move that run away")
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    return run_dir


def run_pretrain(cfg: PretrainConfig) -> Path:
    """Pretrain per ``cfg``; returns the run directory (config.yaml, metrics.jsonl, checkpoints/)."""
    if not cfg.data.train:
        raise DataError("config key 'data.train': no annotation files given")
    set_seed(cfg.train.seed)
    samples = load_pairs(cfg.data.train, cfg.data.image_root)
    check_images(samples)
    run_dir = prepare_run_dir(cfg)
    tokenizer = load_tokenizer(cfg.model.text)
    model = ALBEF(cfg.model)
    dataset = ImageTextDataset(samples, train_transform(image_size(cfg), cfg.data.image))
    loader = DataLoader(
        dataset,
        batch_size=cfg.data.batch_size,
        shuffle=True,
        drop_last=len(dataset) >= cfg.data.batch_size,  # fixed-size batches
        num_workers=cfg.data.num_workers,
        persistent_workers=cfg.data.num_workers > 0,
        collate_fn=Collator(tokenizer, cfg.model.text.max_len),
        generator=torch.Generator().manual_seed(cfg.train.seed),
    )
    print(f"vlp pretrain: {len(dataset)} pairs, {len(dataset.key_to_id)} images, "
          f"{param_count(model) / 1e6:.1f}M trainable parameters -> {run_dir}")
    task = PretrainTask(model, cfg.loss, token_info(tokenizer), cfg.train.seed)
    state = {"task": "pretrain", "vlp_version": __version__, "config": to_dict(cfg)}
    train(task, loader, cfg.train, run_dir, state)
    if cfg.data.eval:
        run_evaluate_retrieval(run_dir, cfg.data.eval, cfg.data.relevance, run_dir / "eval", cfg.data.image_root)
    return run_dir


def load_albef(checkpoint: str | Path, device: Optional[torch.device] = None):
    """Model, config and tokenizer from a checkpoint folder or run directory (strict load)."""
    ckpt = find_checkpoint(checkpoint)
    cfg = from_dict(PretrainConfig, read_state(ckpt)["config"])
    cfg.model.text.init = "random"  # the checkpoint holds every weight: skip initial-weight loading
    cfg.model.vision.pretrained = None
    model = ALBEF(cfg.model)
    load_weights(model, ckpt)
    model.eval()
    return model.to(device or default_device()), cfg, load_tokenizer(cfg.model.text)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run_evaluate_retrieval(
    checkpoint: str | Path,
    data: str | Path,
    relevance: Optional[str | Path],
    out: str | Path,
    image_root: Optional[str] = None,
    overrides: Sequence[str] = (),
    show_progress: bool = True,
) -> RetrievalResult:
    """Zero-shot retrieval of a checkpoint on a Karpathy-style split; writes ``out/metrics.json``
    and ``out/retrieval_examples.png``."""
    ckpt = find_checkpoint(checkpoint)
    model, cfg, tokenizer = load_albef(ckpt)
    cfg = apply_overrides(cfg, overrides)
    ecfg: EvalConfig = cfg.eval
    split = load_retrieval_split(data, image_root)
    rel = load_relevance(relevance, split) if relevance else None
    device = next(model.parameters()).device
    emb = embed(model, split, tokenizer, test_transform(image_size(cfg), cfg.data.image), cfg.model.text.max_len,
                ecfg.batch_size, device, show_progress)
    result = evaluate_retrieval(model, emb, split, ecfg, rel, show_progress)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    record = {**result.metrics, "score": ecfg.score, "k_test": ecfg.k_test, "n_images": len(split.images),
              "n_texts": len(split.texts), "checkpoint": str(ckpt)}
    (out / "metrics.json").write_text(json.dumps(record, indent=2))
    from vlp.viz import plot_retrieval_examples

    plot_retrieval_examples(split, result.scores_t2i, out / "retrieval_examples.png", rel)
    return result
