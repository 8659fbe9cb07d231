"""A run's length is set once (issue 31, item 1): fine-tuning takes ``train.steps`` or
``train.epochs``, and both set, in the file or on the command line, is one error naming both;
pretraining refuses ``train.epochs``, which it would ignore."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlp.config import ConfigError, PretrainConfig, load_finetune_config
from vlp.config.load import load_config

SHAPES_VE = Path(__file__).parent.parent / "configs" / "finetune" / "shapes_ve.yaml"


def test_steps_on_the_command_line_with_epochs_in_the_file_is_one_error_naming_both() -> None:
    with pytest.raises(ConfigError) as e:
        load_finetune_config("ve", str(SHAPES_VE), ["train.steps=20"])
    msg = str(e.value)
    assert "'train.steps'/'train.epochs'" in msg and "train.steps=20 (command line)" in msg
    assert f"train.epochs=3 ({SHAPES_VE})" in msg and "train.epochs=null" in msg


def test_one_of_them_is_fine() -> None:
    assert load_finetune_config("ve", str(SHAPES_VE), []).train.epochs == 3
    cfg = load_finetune_config("ve", str(SHAPES_VE), ["train.steps=20", "train.epochs=null"])
    assert (cfg.train.steps, cfg.train.epochs) == (20, None)


def test_pretraining_refuses_epochs_it_would_ignore() -> None:
    with pytest.raises(ConfigError, match=r"train.epochs=2 \(fine-tuning only: pretraining runs train.steps\)"):
        load_config(PretrainConfig, None, ["train.epochs=2"])
