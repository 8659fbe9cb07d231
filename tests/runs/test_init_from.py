"""``init_from``: pretraining that starts from an earlier vlp checkpoint (a warmed-up model)."""

import pytest
import torch

from tests.helpers import QUICK, TINY_ALBEF
from vlp.config import PretrainConfig, load_config
from vlp.errors import CheckpointError
from vlp.runs.training.pretrain import build_pretraining, run_pretrain
from vlp.weights import find_checkpoint

TINY = [*TINY_ALBEF, "model.vision.img_size=32", *QUICK, "train.steps=3", "train.warmup_steps=1"]
WORLD = dict(seed=1, n_train=24, n_val=4, n_test=8)


@pytest.fixture(scope="module")
def warm(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("warm") / "run"
    cfg = load_config(
        PretrainConfig,
        "configs/pretrain/shapes_tiny.yaml",
        [f"output_dir={out}", f"data.train=[{world['pretrain']}]", "model.queue_size=0", *TINY],
    )
    run_pretrain(cfg)
    return world, out


def _cfg(world, out, *extra):
    return load_config(
        PretrainConfig,
        "configs/pretrain/shapes_tiny.yaml",
        [f"output_dir={out}", f"data.train=[{world['pretrain']}]", *TINY, *extra],
    )


def test_init_from_loads_every_weight_twin_included(warm, tmp_path):
    world, run = warm
    # a queue of 16 where the warm-up run had none: the queue starts empty, everything else loads
    job = build_pretraining(_cfg(world, tmp_path / "b", f"init_from={run}", "model.queue_size=16"))
    from safetensors.torch import load_file

    saved = load_file(str(find_checkpoint(run) / "model.safetensors"))
    own = job.model.state_dict()
    compared = 0
    for k, v in saved.items():
        if k.startswith("queue.") or k not in own:
            continue
        torch.testing.assert_close(own[k], v, rtol=0, atol=0)
        compared += 1
    assert compared > 20
    # the momentum twin continues as saved (it lags the online weights)
    assert "momentum.twin.vision_proj.weight" in saved
    assert not torch.equal(saved["momentum.twin.vision_proj.weight"], saved["vision_proj.weight"])
    assert (own["queue.ids"] == -100).all()


def test_without_init_from_the_weights_are_fresh(warm, tmp_path):
    world, run = warm
    job = build_pretraining(_cfg(world, tmp_path / "c"))
    from safetensors.torch import load_file

    saved = load_file(str(find_checkpoint(run) / "model.safetensors"))
    assert not torch.equal(job.model.state_dict()["vision_proj.weight"], saved["vision_proj.weight"])


def test_init_from_a_missing_checkpoint_is_one_clear_error(warm, tmp_path):
    world, _ = warm
    with pytest.raises(CheckpointError, match="init_from.*nowhere"):
        build_pretraining(_cfg(world, tmp_path / "d", f"init_from={tmp_path / 'nowhere'}"))
