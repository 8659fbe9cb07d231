"""``train.precision`` rules over ``accelerate launch``'s ``mixed_precision`` (issue 31, item 2): a
launch config that says otherwise gets one warning naming both; the shipped launch configs say
``'no'``, which never warns."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from vlp.config import TrainConfig
from vlp.train.setup import LAUNCH_PRECISION, make_accelerator, warn_if_launch_precision_differs

LAUNCH_CONFIGS = Path(__file__).parent.parent.parent / "configs" / "accelerate"


def test_a_launch_precision_other_than_the_configs_warns_and_the_config_wins(monkeypatch) -> None:
    monkeypatch.setenv(LAUNCH_PRECISION, "bf16")
    with pytest.warns(
        UserWarning, match=r"mixed_precision=bf16 .* differs from train.precision=fp32; train.precision rules"
    ):
        acc = make_accelerator(TrainConfig(precision="fp32"))
    assert acc.mixed_precision == "no"


@pytest.mark.parametrize("launched, precision", [("no", "fp32"), ("no", "bf16"), ("bf16", "bf16"), (None, "fp32")])
def test_agreeing_or_unset_launch_precisions_do_not_warn(monkeypatch, launched, precision) -> None:
    if launched is None:
        monkeypatch.delenv(LAUNCH_PRECISION, raising=False)
    else:
        monkeypatch.setenv(LAUNCH_PRECISION, launched)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_launch_precision_differs(TrainConfig(precision=precision)) is None


def test_the_shipped_launch_configs_leave_the_precision_to_vlp() -> None:
    found = {p.name: yaml.safe_load(p.read_text()).get("mixed_precision", "no") for p in LAUNCH_CONFIGS.glob("*.yaml")}
    assert len(found) == 4 and set(found.values()) == {"no"}, found
