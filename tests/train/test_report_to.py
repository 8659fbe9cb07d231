"""``train.report_to`` (issue 30, part 6): the name Hugging Face and accelerate users know for the
metric sinks; ``train.loggers`` stays as its older name."""

import pytest

from vlp.cli import main
from vlp.config import TrainConfig
from vlp.errors import ConfigError


@pytest.mark.parametrize(
    "report_to, loggers",
    [(["tensorboard"], ["tensorboard"]), (["tensorboard", "wandb"], ["tensorboard", "wandb"]), (["none"], [])],
)
def test_report_to_sets_the_sinks(report_to, loggers):
    assert TrainConfig(report_to=report_to).loggers == loggers


def test_the_older_name_still_works_and_both_must_agree():
    assert TrainConfig(loggers=["wandb"]).loggers == ["wandb"]
    assert TrainConfig(loggers=["wandb"], report_to=["wandb"]).loggers == ["wandb"]
    with pytest.raises(
        ConfigError, match=r"'train.report_to'/'train.loggers': \['tensorboard'\] and \['wandb'\] disagree"
    ):
        TrainConfig(loggers=["wandb"], report_to=["tensorboard"])


@pytest.mark.parametrize("bad", [["comet"], ["none", "wandb"], []])
def test_a_bad_report_to_names_the_key(bad):
    with pytest.raises(ConfigError, match="train.report_to"):
        TrainConfig(report_to=bad)


class Stop(Exception):
    pass


def test_the_command_line_flag_is_the_override(monkeypatch):
    import vlp.runs.training.pretrain

    seen = {}

    def run_pretrain(cfg):
        seen["loggers"], seen["report_to"] = cfg.train.loggers, cfg.train.report_to
        raise Stop

    monkeypatch.setattr(vlp.runs.training.pretrain, "run_pretrain", run_pretrain)
    with pytest.raises(Stop):
        main(["pretrain", "--config", "configs/pretrain/shapes_tiny.yaml", "--report-to", "tensorboard", "wandb"])
    assert seen == {"loggers": ["tensorboard", "wandb"], "report_to": ["tensorboard", "wandb"]}
