"""The SRCL paper's fine-tuning recipes (Table 5, methods.md §1.2): configs/finetune/srcl_*.yaml
load with the project loader and hold the paper's values; retrieval regulates ITC with SRCL and
leaves delta to be calibrated; VQA and NLVR2 have no ITC to regulate."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vlp.config import FinetuneConfig, ModelConfig, TextConfig, VisionConfig, load_finetune_config
from vlp.errors import ConfigError
from vlp.train.optim import lr_at, lr_scale_of, param_groups

ROOT = Path(__file__).parents[1]
GPUS = 8  # the configs' batch sizes are per GPU

# file: (task, ViT lr, BERT lr, global batch, epochs, loss.regulation)
PAPER = {
    "srcl_coco.yaml": ("retrieval", 1e-5, 2e-6, 256, 5, "srcl"),
    "srcl_flickr.yaml": ("retrieval", 1e-5, 2e-6, 256, 5, "srcl"),
    "srcl_vqa.yaml": ("vqa", 2e-5, 5e-6, 1024, 8, "none"),
    "srcl_nlvr2.yaml": ("nlvr2", 5e-5, 5e-6, 256, 15, "none"),
}
# the ALBEF configs each recipe takes its data, image size and evaluation from
ALBEF = {
    "srcl_coco.yaml": "retrieval_coco.yaml",
    "srcl_flickr.yaml": "retrieval_flickr.yaml",
    "srcl_vqa.yaml": "vqa.yaml",
    "srcl_nlvr2.yaml": "nlvr2.yaml",
}


def load(name: str, overrides: tuple[str, ...] = ()) -> FinetuneConfig:
    """configs/finetune/NAME through the project loader, for the task its ``task:`` key names."""
    path = ROOT / "configs/finetune" / name
    return load_finetune_config(yaml.safe_load(path.read_text())["task"], str(path), list(overrides))


def tiny_model(task: str):
    """A small model of the task's architecture, for the parameter names ``train.lr_scale`` matches."""
    from vlp.models.albef import ALBEF as ALBEFModel
    from vlp.models.nlvr import NLVRModel
    from vlp.models.vqa import VQAModel

    cfg = ModelConfig(
        vision=VisionConfig(depth=1, img_size=32), text=TextConfig(layers=1, fusion_layers=1), queue_size=8
    )
    return {
        "retrieval": lambda: ALBEFModel(cfg, mlm=False),
        "vqa": lambda: VQAModel(cfg),
        "nlvr2": lambda: NLVRModel(cfg),
    }[task]()


@pytest.mark.parametrize("name", sorted(PAPER))
def test_recipe_loads_and_holds_the_papers_values(name):
    task, vit_lr, bert_lr, batch, epochs, regulation = PAPER[name]
    c = load(name)
    t = c.train
    assert isinstance(c, FinetuneConfig) and c.task == task
    assert t.lr * lr_scale_of("vision.blocks.0.attn.qkv.weight", t.lr_scale)[1] == pytest.approx(vit_lr)
    for bert in ("text.encoder.layer.0.attention.self.query.weight", "fusion.layer.0.crossattention.self.key.weight"):
        assert t.lr * lr_scale_of(bert, t.lr_scale)[1] == pytest.approx(bert_lr)
    assert c.data.batch_size * GPUS == batch and t.grad_accum_steps == 1
    assert t.epochs == epochs and t.weight_decay == 0.05
    assert c.data.image.randaugment
    assert c.loss.regulation == regulation


@pytest.mark.parametrize("name", sorted(PAPER))
def test_recipe_lr_per_module_reaches_the_model(name):
    """``lr_scale: {vision: ...}`` matches the task model's ViT (and nothing else); every other
    trainable parameter (BERT, fusion, decoder, heads) is at the base rate."""
    task, vit_lr, bert_lr, *_ = PAPER[name]
    t = load(name).train
    model = tiny_model(task)
    groups = param_groups(model, t.weight_decay, t.lr_scale)  # raises if a path matches nothing
    rates = {t.lr * g["lr_scale"] for g in groups}
    assert sorted(rates) == [pytest.approx(bert_lr), pytest.approx(vit_lr)]
    for pname, p in model.named_parameters():
        if p.requires_grad and not pname.startswith("momentum."):
            want = vit_lr if pname.startswith("vision.") else bert_lr
            assert t.lr * lr_scale_of(pname, t.lr_scale)[1] == pytest.approx(want), pname


@pytest.mark.parametrize("name", sorted(PAPER))
def test_recipe_schedule_is_cosine_decay(name):
    """vlp's schedule is always linear warm-up + cosine to ``min_lr`` (no schedule key)."""
    t = load(name).train
    t.steps = 1000 + t.warmup_steps
    assert 0 < t.min_lr < t.lr and t.warmup_lr <= t.lr
    assert lr_at(t.warmup_steps, t) == pytest.approx(t.lr)
    assert lr_at(t.warmup_steps + 500, t) == pytest.approx((t.lr + t.min_lr) / 2)
    assert lr_at(t.steps, t) == pytest.approx(t.min_lr)


@pytest.mark.parametrize("name", sorted(PAPER))
def test_recipe_keeps_albefs_data_image_size_and_evaluation(name):
    c, a = load(name), load(ALBEF[name])
    assert (c.data.train, c.data.val, c.data.test, c.data.image_root) == (
        a.data.train,
        a.data.val,
        a.data.test,
        a.data.image_root,
    )
    assert (c.image_size, c.data.max_len, c.data.image, c.eval, c.vqa, c.nlvr) == (
        a.image_size,
        a.data.max_len,
        a.data.image,
        a.eval,
        a.vqa,
        a.nlvr,
    )
    assert (c.loss.distill, c.loss.alpha) == (a.loss.distill, a.loss.alpha)


@pytest.mark.parametrize("name", sorted(PAPER))
def test_albef_baseline_is_the_same_file_without_regulation(name):
    c = load(name)
    base = load(name, ("loss.regulation=none",))
    assert base.loss.regulation == "none"
    c.loss.regulation = "none"
    assert base == c  # nothing else changes


@pytest.mark.parametrize("name", ["srcl_coco.yaml", "srcl_flickr.yaml"])
def test_retrieval_recipes_leave_delta_to_calibration(name):
    from vlp.tasks.regulation import SRCLRegulator

    c = load(name)
    assert c.loss.srcl.delta is None and c.loss.srcl.norm == "softmax"
    assert c.loss.srcl.helper is None and c.loss.srcl.helper_features is None  # alpha_h = 0: no helper
    with pytest.raises(ConfigError, match="loss.srcl.delta"):
        SRCLRegulator(c.loss.srcl, c.loss.regulation, 100, 8, 1, finetune=True)
    calibrated = load(name, ("loss.srcl.delta=4.0",))
    reg = SRCLRegulator(calibrated.loss.srcl, calibrated.loss.regulation, 100, 8, 1, finetune=True)
    assert reg.delta == 4.0 and not reg.uses_helper and reg.alpha_h(0) == 0.0


@pytest.mark.parametrize("name", ["srcl_vqa.yaml", "srcl_nlvr2.yaml"])
def test_vqa_and_nlvr2_have_no_itc_to_regulate(name):
    with pytest.raises(ConfigError, match="retrieval only"):
        load(name, ("loss.regulation=srcl",))


@pytest.mark.parametrize("name", sorted(PAPER))
def test_header_gives_the_command_and_the_baseline(name):
    head = "".join(line for line in (ROOT / "configs/finetune" / name).read_text().splitlines(True) if line[0] == "#")
    task = PAPER[name][0]
    assert f"--config configs/finetune/{name}" in head
    assert f"-m vlp.cli finetune {task}" in head and "loss.regulation=none" in head
