"""The contrastive-loss registry: a loss registered from here (its module and nothing else under
vlp/) pretrains and runs ``vlp analyze cocos`` end to end; unknown names and bad hyperparameters
fail as config errors naming the key."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from tests.helpers import QUICK, TINY_ALBEF, pretrain
from vlp.cli import main
from vlp.config import ContrastiveConfig, PretrainConfig, load_config
from vlp.errors import ConfigError
from vlp.losses import LOSSES, CocosInputs, ContrastiveInputs, ContrastiveLoss, Stats, build_loss
from vlp.losses.cocos import cocos_infonce
from vlp.losses.contrastive import infonce
from vlp.runs.training.pretrain import run_pretrain
from vlp.train.logging import read_metrics

WORLD = dict(seed=3, n_train=24, n_val=4, n_test=12)
TOY = "toy_scaled_infonce"
TOY_RUN = [*TINY_ALBEF, *QUICK, "train.steps=2", "train.log_every=1", "loss.distill=false"]


@dataclass(frozen=True)
class ScaledParams:
    scale: float  # no default: loss.contrastive.params.scale must be set
    note: Optional[str] = None


class ScaledInfoNCE(ContrastiveLoss):
    """``scale`` x InfoNCE (the learned or fixed temperature), without distillation or log-weights."""

    Params = ScaledParams
    uses_tau = True
    scales_seen: list[float] = []  # every forward's scale: what reached the loss from the config

    def forward(self, x: ContrastiveInputs) -> torch.Tensor:
        assert x.tau is not None
        self.scales_seen.append(self.params.scale)
        return self.params.scale * 0.5 * (infonce(x.sim_i2t, x.pos_i2t, x.tau) + infonce(x.sim_t2i, x.pos_t2i, x.tau))

    def cocos(self, x: CocosInputs) -> Stats:
        stats = cocos_infonce(x.sim, x.positives, x.tau, x.threshold)
        stats["scale"] = self.params.scale
        return stats


@pytest.fixture
def toy():
    """The toy loss registered as ``TOY`` for one test."""
    ScaledInfoNCE.scales_seen.clear()
    with LOSSES.registered(TOY, ScaledInfoNCE) as cls:
        yield cls
    assert TOY not in LOSSES


def test_toy_loss_is_registered_built_and_called_by_name(toy):
    assert LOSSES.names()[:4] == ("infonce", "triplet", "triplet_sh", "smoothap") and TOY in LOSSES
    loss = build_loss(ContrastiveConfig(name=TOY, params={"scale": 2}))
    assert (
        isinstance(loss, ScaledInfoNCE) and loss.params == ScaledParams(2.0) and loss.hyperparameters()["scale"] == 2.0
    )
    assert loss.name == TOY
    g = torch.Generator().manual_seed(0)
    sim, pos = torch.randn(4, 6, generator=g), torch.eye(4, 6, dtype=torch.bool)
    ref = build_loss(ContrastiveConfig())(ContrastiveInputs(sim, pos, sim.T, pos.T, tau=0.1))
    assert loss(ContrastiveInputs(sim, pos, sim.T, pos.T, tau=0.1)).item() == pytest.approx(2 * ref.item(), rel=1e-6)
    with pytest.raises(ValueError, match="log_weights"):
        loss(ContrastiveInputs(sim, pos, sim.T, pos.T, tau=0.1, log_weights_i2t=torch.zeros(4, 6)))
    with pytest.raises(ValueError, match="needs a temperature"):
        loss(ContrastiveInputs(sim, pos, sim.T, pos.T))
    with pytest.raises(ValueError, match="registered already"):
        with LOSSES.registered("infonce", ScaledInfoNCE):
            pass
    with pytest.raises(ConfigError, match="'loss.contrastive.params.scale' is not set"):
        build_loss(ContrastiveConfig(name=TOY))
    assert loss.cocos(CocosInputs(sim, pos, tau=0.1))["scale"] == 2.0


def test_params_must_be_a_dataclass():
    with pytest.raises(TypeError, match="Params must be a dataclass"):

        class Bad(ScaledInfoNCE):
            Params = dict


def test_unknown_name_and_bad_params_are_config_errors_naming_the_key(toy):
    with pytest.raises(
        ConfigError,
        match=r"'loss.contrastive.name': unknown contrastive loss 'nope'; known: \['infonce'.*'toy_scaled_infonce'\]",
    ):
        load_config(PretrainConfig, None, ["loss.contrastive.name=nope"])
    base = [f"loss.contrastive.name={TOY}", "loss.distill=false"]
    cases = {
        "loss.contrastive.params.scale=two": r"'loss.contrastive.params.scale': got 'two', expected float",
        "loss.contrastive.params.scale=true": r"'loss.contrastive.params.scale': got True, expected float",
        "loss.contrastive.params.scael=2": r"'loss.contrastive.params.scael': toy_scaled_infonce has no such hyperparameter, expected one of \['note', 'scale'\]",
        "loss.contrastive.params.note=3": r"'loss.contrastive.params.note': got 3, expected str",
        "loss.contrastive.tau=0.1": r"'loss.contrastive.params.scale' is not set: toy_scaled_infonce needs it \(float\)",
        "loss.contrastive.margin=0.3": r"'loss.contrastive.margin'",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_config(PretrainConfig, None, [*base, override])
    with pytest.raises(ConfigError, match="momentum distillation applies to InfoNCE, not toy_scaled_infonce"):
        load_config(PretrainConfig, None, [f"loss.contrastive.name={TOY}", "loss.contrastive.params.scale=2"])
    cfg = load_config(
        PretrainConfig, None, [*base, "loss.contrastive.params.scale=2", "loss.contrastive.params.note=x"]
    )
    assert build_loss(cfg.loss.contrastive).params == ScaledParams(2.0, "x")
    with pytest.raises(ConfigError, match="'loss.contrastive.params.scale': triplet has no such hyperparameter"):
        build_loss(ContrastiveConfig(name="triplet", params={"scale": 2.0}))


def test_a_bad_name_fails_before_training_starts(toy, world, tmp_path, capsys):
    assert pretrain(tmp_path / "a", world["pretrain"], *TOY_RUN, "loss.contrastive.name=nope") == 2
    assert "loss.contrastive.name" in capsys.readouterr().err and not (tmp_path / "a").exists()
    # a config loaded while the loss was registered, run after it was not: the build refuses it
    overrides = [*TOY_RUN, f"loss.contrastive.name={TOY}", "loss.contrastive.params.scale=2"]
    cfg = load_config(PretrainConfig, "configs/pretrain/shapes_tiny.yaml", overrides)
    cfg.output_dir, cfg.data.train = str(tmp_path / "b"), [str(world["pretrain"])]
    LOSSES.unregister(TOY)
    try:
        with pytest.raises(ConfigError, match="unknown contrastive loss 'toy_scaled_infonce'"):
            run_pretrain(cfg)
    finally:
        LOSSES.register(TOY, ScaledInfoNCE)
    assert not (tmp_path / "b").exists()


def test_toy_loss_pretrains_and_runs_analyze_cocos_end_to_end(toy, world, tmp_path):
    run = tmp_path / "run"
    params = [f"loss.contrastive.name={TOY}", "loss.contrastive.params.scale=2.0"]
    assert pretrain(run, world["pretrain"], *TOY_RUN, *params) == 0
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all(r["itc"] > 0 for r in rows)
    assert ScaledInfoNCE.scales_seen and set(ScaledInfoNCE.scales_seen) == {2.0}  # the config's scale
    out = tmp_path / "cocos"
    args = ["analyze", "cocos", "--checkpoint", str(run), "--data", str(world["pretrain"]), "--loss", TOY]
    assert main([*args, "--out", str(out), "--batches", "2", "loss.contrastive.params.scale=3"]) == 0
    rec = json.loads((out / "cocos.json").read_text())
    assert rec["loss"] == TOY and rec["batches"] == 2 and rec["hyperparameters"] == {"scale": 3.0, "note": None}
    assert rec["stats"]["i2t_scale"]["mean"] == 3.0 and 0.0 < rec["stats"]["t2i_one_minus_p_pos"]["mean"] < 1.0
    assert (out / "cocos.png").stat().st_size > 0
