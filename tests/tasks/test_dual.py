"""The dual-encoder task (loss zoo, image-level batches, LTD) and LTD / zoo losses on ALBEF."""

import pytest
import torch

from tests.helpers import DUAL, TINY_DUAL
from tests.tasks.test_pretrain import make_batch, tiny
from vlp.config import ContrastiveConfig, LossConfig, LTDConfig, PretrainConfig, TrainConfig, load_config
from vlp.errors import ConfigError
from vlp.losses import ContrastiveInputs, build_loss
from vlp.models.dual import DualEncoder
from vlp.tasks.dual import DualTask
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.pretrain import PretrainTask
from vlp.tasks.reconstruction import Reconstruction
from vlp.train.optim import build_optimizer


def dual_model() -> DualEncoder:
    torch.manual_seed(0)
    cfg = load_config(PretrainConfig, None, TINY_DUAL)
    return DualEncoder(cfg.model, vocab_size=50)


def batch(k: int = 2, b: int = 3):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 50, (b * k, 6), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    image_ids = torch.tensor([4, 9, 2][:b])
    return {
        "images": torch.randn(b, 3, 32, 32, generator=g),
        "input_ids": ids,
        "attention_mask": mask,
        "image_ids": image_ids,
        "text_image_ids": image_ids.repeat_interleave(k),
        "ltd_target": torch.randn(b * k, 5, generator=g),
    }


@pytest.mark.parametrize("name", ["infonce", "triplet", "triplet_sh", "smoothap"])
def test_dual_task_scores_every_caption_against_every_image_with_image_id_positives(name):
    model = dual_model()
    loss = LossConfig(itm=0, mlm=0, distill=False, contrastive=ContrastiveConfig(name=name, tau=0.05))
    task = DualTask(model, loss)
    bt = batch()
    out = task(bt)
    img = model.encode_image(bt["images"]).feat
    txt = model.encode_text(bt["input_ids"], bt["attention_mask"]).feat
    pos = bt["image_ids"][:, None] == bt["text_image_ids"][None, :]
    assert pos.sum(1).tolist() == [2, 2, 2]
    ref = build_loss(ContrastiveConfig(name=name))(ContrastiveInputs(img @ txt.T, pos, txt @ img.T, pos.T, tau=0.05))
    assert out["loss"].item() == pytest.approx(ref.item(), rel=1e-4, abs=1e-5)
    assert out["contrastive"].item() == pytest.approx(out["loss"].item())


def test_dual_task_with_ltd_constraint_steps_lambda_outside_the_model_optimizer():
    model = dual_model()
    ltd = LTDConfig(mode="constraint", eta=0.2, hidden=16, targets="unused")
    loss = LossConfig(itm=0, mlm=0, distill=False, contrastive=ContrastiveConfig(tau=0.05), ltd=ltd)
    task = DualTask(model, loss, Reconstruction(ltd, 8, 5, 50))
    opt = build_optimizer(task, TrainConfig(lr=1e-3))
    assert id(task.reconstruction.multiplier.lam) not in {id(p) for g in opt.param_groups for p in g["params"]}
    assert any(p is task.reconstruction.decoder.net[0].weight for g in opt.param_groups for p in g["params"])
    out = task(batch())
    l_rec = out["ltd_rec"].item()
    assert out["loss"].item() == pytest.approx(out["contrastive"].item() + 1.0 * (l_rec / 0.2 - 1), rel=1e-5)
    out["loss"].backward()
    opt.step()
    task.after_optimizer_step(1)
    # first SGD step: buffer = gradient = L_rec / eta - 1; lambda += lr * buffer
    assert task.reconstruction.multiplier.lam.item() == pytest.approx(1.0 + 5e-3 * (l_rec / 0.2 - 1), abs=1e-6)
    assert set(task.extra_state()) == {f"reconstruction.{k}" for k in task.reconstruction.state_dict()}


def test_albef_with_a_zoo_loss_and_ltd_dual():
    model = tiny(queue_size=0)
    ltd = LTDConfig(mode="dual", beta=0.5, hidden=16, targets="unused")
    loss = LossConfig(distill=False, contrastive=ContrastiveConfig(name="triplet_sh"), ltd=ltd)
    task = PretrainTask(
        model,
        loss,
        TokenInfo(model.text.config.vocab_size, 103, (0, 101, 102)),
        0,
        reconstruction=Reconstruction(ltd, 8, 5, model.text.config.vocab_size),
    )
    bt = make_batch([0, 1, 2, 3])
    bt["ltd_target"] = torch.randn(4, 5)
    out = task(bt)
    assert out["loss"].item() == pytest.approx(
        (out["itc"] + out["itm"] + out["mlm"] + 0.5 * out["ltd_rec"]).item(), rel=1e-5
    )
    assert out["itc"].item() > 0  # triplet_sh of barely trained features violates margins


def test_config_rules_name_the_keys():
    with pytest.raises(ConfigError, match=r"loss.itm=1.0 .*loss.mlm=1.0.*loss.distill=true.*eval.score=itm"):
        load_config(PretrainConfig, None, ["model.arch=dual"])
    with pytest.raises(ConfigError, match="loss.contrastive.tau unset"):
        load_config(PretrainConfig, None, [*DUAL[:-1]])
    with pytest.raises(ConfigError, match="loss.distill=true .*momentum distillation applies to InfoNCE, not smoothap"):
        load_config(PretrainConfig, None, ["loss.contrastive.name=smoothap"])
    with pytest.raises(ConfigError, match="data.captions_per_image=5"):
        load_config(PretrainConfig, None, ["data.captions_per_image=5"])
    with pytest.raises(ConfigError, match="loss.ltd.targets unset"):
        load_config(PretrainConfig, None, ["loss.ltd.mode=constraint"])
    with pytest.raises(ConfigError, match="loss.regulation=srcl .*InfoNCE ITC only"):
        load_config(PretrainConfig, None, [*DUAL, "loss.regulation=srcl"])
    with pytest.raises(ConfigError, match="loss.contrastive.name"):
        load_config(PretrainConfig, None, ["loss.contrastive.name=hinge"])
    assert load_config(PretrainConfig, "configs/ltd/shapes_dual.yaml").model.arch == "dual"
