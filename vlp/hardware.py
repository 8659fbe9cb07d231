"""Facts of the machine that change what a setting costs (no vlp imports: any layer may use it)."""

from __future__ import annotations

import functools
import platform
import sys
import warnings
from pathlib import Path

import torch


def native_bf16(cpuinfo: str, machine: str) -> bool:
    """Whether a CPU with this ``/proc/cpuinfo`` text and ``platform.machine()`` computes bf16
    natively: x86 ``avx512_bf16`` or AMX ``amx_bf16``, Arm ``bf16``."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    if machine.lower() in ("aarch64", "arm64"):
        return "bf16" in flags
    return bool(flags & {"avx512_bf16", "amx_bf16"})


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """:func:`native_bf16` of this machine, read from /proc/cpuinfo on Linux; elsewhere (macOS,
    Windows) assumed native: no warning on what cannot be checked."""
    info = Path("/proc/cpuinfo")
    if sys.platform == "darwin" or not info.is_file():
        return True
    return native_bf16(info.read_text(errors="replace"), platform.machine())


def warn_if_bf16_is_emulated(setting: str) -> bool:
    """Warn (once per call site) when bf16 is asked for on a CPU without native bf16, where
    autocast emulates it: a pretraining step took 2.4x (tiny) to 3.3x (base) longer than in fp32 on
    an Intel Xeon with AVX-512 but no avx512_bf16, and the tiny helper's step 8.7x on an AMD EPYC with
    AVX2 only (docs/performance.md). Returns whether it warned."""
    if cpu_has_native_bf16():
        return False
    warnings.warn(
        f"{setting} on a CPU without native bf16 ({platform.processor() or platform.machine()}, no "
        "avx512_bf16/amx_bf16 in /proc/cpuinfo): bf16 is emulated there, and a step ran 2.4-8.7x slower than fp32 on the CPUs measured; "
        "use fp32 on this machine (docs/performance.md)",
        stacklevel=3,
    )
    return True


def default_device() -> torch.device:
    """The device inference and evaluation commands use when none is given: CUDA if available."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
