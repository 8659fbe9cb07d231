"""The shipped configs: every one loads, and the paper recipes hold the published numbers
(albef.md §11, methods.md §1.2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import NO_TASKS
from vlp.config import FinetuneConfig, PretrainConfig, load_config

ROOT = Path(__file__).parents[1]
PRETRAIN = (
    sorted((ROOT / "configs").glob("pretrain/*.yaml"))
    + sorted((ROOT / "configs").glob("helper/*.yaml"))
    + sorted((ROOT / "configs").glob("ltd/*.yaml"))
)
FINETUNE = sorted((ROOT / "configs").glob("finetune/*.yaml"))
GPUS = 8  # ALBEF's and SRCL's batch sizes are per GPU, 8 GPUs


@pytest.mark.parametrize("path", PRETRAIN, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_pretraining_configs_load(path):
    cfg = load_config(PretrainConfig, path)
    assert cfg.train.steps >= 1 and cfg.data.batch_size >= 1


@pytest.mark.parametrize("path", FINETUNE, ids=lambda p: p.name)
def test_finetune_configs_load(path):
    import yaml

    from vlp.config import load_finetune_config

    task = yaml.safe_load(path.read_text())["task"]
    cfg = load_finetune_config(task, str(path), [])
    assert isinstance(cfg, FinetuneConfig) and cfg.task == task


def test_albef_4m_recipe():
    c = load_config(PretrainConfig, ROOT / "configs/pretrain/albef_4m.yaml")
    steps_per_epoch = -(-5_100_000 // (c.data.batch_size * GPUS))  # 5.1M pairs, batch 512
    assert c.data.batch_size * GPUS == 512 and steps_per_epoch == 9961
    assert c.train.steps == 30 * steps_per_epoch and c.loss.alpha_ramp_steps == steps_per_epoch
    assert (c.train.lr, c.train.min_lr, c.train.warmup_lr, c.train.warmup_steps) == (1e-4, 1e-5, 1e-5, 2000)
    assert (c.train.weight_decay, c.model.queue_size, c.model.momentum, c.model.temp) == (0.02, 65536, 0.995, 0.07)
    assert (c.model.embed_dim, c.model.vision.preset, c.model.text.preset, c.model.text.max_len) == (
        256,
        "base",
        "base",
        25,
    )
    assert (c.model.vision.init, c.model.vision.pretrained) == ("deit", "deit_base_patch16_224.fb_in1k")
    assert (c.loss.itc, c.loss.itm, c.loss.mlm, c.loss.mlm_probability, c.loss.alpha) == (1.0, 1.0, 1.0, 0.15, 0.4)
    assert c.data.image.crop_scale == [0.2, 1.0] and c.data.image.randaugment and c.loss.regulation == "none"


def test_srcl_4m_recipe():
    from vlp.models.albef import ALBEF
    from vlp.train.optim import lr_scale_of

    base = load_config(PretrainConfig, ROOT / "configs/pretrain/albef_4m.yaml")
    c = load_config(PretrainConfig, ROOT / "configs/pretrain/srcl_4m.yaml")
    assert (c.model.vision.init, c.model.vision.preset, c.model.vision.pretrained) == (
        "clip",
        "base",
        "vit_base_patch16_clip_224.openai",
    )
    assert c.loss.regulation == "srcl" and c.loss.srcl.helper_span is None  # alpha_h 1 -> 0 over the run
    assert (c.train.weight_decay, c.train.warmup_steps) == (0.01, 1000)
    vit_lr = c.train.lr * lr_scale_of("vision.blocks.0.attn.qkv.weight", c.train.lr_scale)[1]
    bert_lr = c.train.lr * lr_scale_of("text.encoder.layer.0.attention.self.query.weight", c.train.lr_scale)[1]
    assert (vit_lr, bert_lr) == (pytest.approx(1e-5), 1e-4)
    from vlp.config import ModelConfig
    from vlp.train.optim import param_groups

    groups = param_groups(ALBEF(ModelConfig(queue_size=8)), c.train.weight_decay, c.train.lr_scale)  # 'vision' matches
    assert sorted({g["lr_scale"] for g in groups}) == [0.1, 1.0]
    same = ("steps", "min_lr", "precision", "ckpt_every")
    assert all(getattr(c.train, k) == getattr(base.train, k) for k in same) and c.data.train == base.data.train


def test_albef_4m_config_trains_when_shrunk(make_world, tmp_path):
    """The recipe's loss, data and schedule keys run as they are; only sizes, weights and data are
    swapped for a CPU-sized stand-in."""
    from vlp.cli import main
    from vlp.train.logging import read_metrics

    world = make_world(seed=1, n_train=32, n_val=0, n_test=0, image_size=32, **NO_TASKS)
    small = [
        "model.vision.preset=tiny",
        "model.vision.init=none",
        "model.vision.pretrained=null",
        "model.vision.depth=1",
        "model.vision.img_size=32",
        "model.text.preset=tiny",
        "model.text.layers=1",
        "model.text.fusion_layers=1",
        "model.queue_size=32",
        f"data.train=[{world['pretrain']}]",
        "data.image_root=null",
        "data.eval=null",
        "data.batch_size=8",
        "data.num_workers=0",
        "train.steps=3",
        "train.warmup_steps=2",
        "train.log_every=1",
        "train.progress=false",
        "train.precision=fp32",
        "train.ckpt_every=0",
        f"output_dir={tmp_path / 'run'}",
    ]
    assert main(["pretrain", "--config", "configs/pretrain/albef_4m.yaml", *small]) == 0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["mlm"] > 0 and r["itm"] > 0 for r in rows)
