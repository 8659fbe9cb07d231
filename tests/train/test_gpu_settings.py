"""Settings that matter on GPUs and on other CPUs (issue 17): the process-group timeout key, TF32,
and the warning for bf16 on a CPU that emulates it."""

from __future__ import annotations

import warnings
from datetime import timedelta

import pytest

import vlp.hardware as hw
from vlp.config import TrainConfig
from vlp.errors import ConfigError
from vlp.train.setup import make_accelerator

XEON = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"
EPYC = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n"


def test_the_process_group_timeout_is_a_config_key_with_a_generous_default():
    assert make_accelerator(TrainConfig()).init_handler.timeout == timedelta(minutes=60)
    assert make_accelerator(TrainConfig(dist_timeout_minutes=7.5)).init_handler.timeout == timedelta(minutes=7.5)
    with pytest.raises(ConfigError, match="train.dist_timeout_minutes"):
        TrainConfig(dist_timeout_minutes=0)


def test_native_bf16_is_read_from_the_cpu_flags():
    assert hw.native_bf16(EPYC, "x86_64") and hw.native_bf16(GRAVITON, "aarch64")
    assert not hw.native_bf16(XEON, "x86_64")
    assert not hw.native_bf16("Features\t: fp asimd\n", "aarch64")


def test_bf16_on_a_cpu_that_emulates_it_warns(monkeypatch):
    monkeypatch.setattr(hw, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(UserWarning, match="without native bf16.*2.4-8.7x slower than fp32"):
        make_accelerator(TrainConfig(precision="bf16"))
    monkeypatch.setattr(hw, "cpu_has_native_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_accelerator(TrainConfig(precision="bf16"))
