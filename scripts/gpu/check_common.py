"""Shared parts of ``make gpu-check`` (``check.py``): the sizes each section runs at (:class:`Plan`),
the section context and the worker-side helpers (device, timing, memory, config)."""

from __future__ import annotations

import gc
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "pretrain" / "shapes_tiny.yaml"
SECTIONS = (
    "world",
    "itc",
    "resume",
    "collectives",
    "bench",
    "loader",
    "zero2",
    "gloo2",
    "retrieval",
    "compile_64",
    "compile_128",
)
#: the two commands of a loan (issue 44), each under 5 minutes on an H100: ``--part eager`` (``make gpu-check``)
#: and ``--part compile`` (``make gpu-check-compile``); retrieval runs only when named (``--sections``)
PARTS = {
    "eager": ("world", "itc", "resume", "collectives", "bench", "loader", "zero2", "gloo2"),
    "compile": ("world", "compile_64", "compile_128"),
}
#: each part's results: OUT/NAME.json and OUT/NAME.md, and its worker logs OUT/PREFIX-N.log
PART_FILES = {"eager": ("gpu_check", "worker"), "compile": ("gpu_check_compile", "worker-compile")}
ITC_TOLERANCE = 1e-4

# Dense bf16 peak TFLOP/s per GPU (no sparsity); TF32 is half of it on these devices.
PEAK_BF16_TFLOPS = {"H100 SXM": 989.0, "H100 PCIe": 756.0, "H200": 989.0, "A100": 312.0}


def peak_bf16_tflops(name: str) -> tuple[Optional[float], Optional[str]]:
    """(dense bf16 peak, table entry) for a CUDA device name, (None, None) when unknown."""
    n = name.upper()
    if "H200" in n:
        key = "H200"
    elif "H100" in n and "PCIE" in n:
        key = "H100 PCIe"
    elif "H100" in n and ("SXM" in n or "HBM3" in n):  # "NVIDIA H100 80GB HBM3" is the SXM part
        key = "H100 SXM"
    elif "A100" in n:
        key = "A100"
    else:
        return None, None
    return PEAK_BF16_TFLOPS[key], key


# ----------------------------------------------------------------------------- sizes


BASE_MODEL = ["model.vision.preset=base", "model.text.preset=base", "model.text.init=random"]
TINY_SHRINK = ["model.vision.depth=1", "model.vision.img_size=32", "model.text.layers=1", "model.text.fusion_layers=1"]
#: ALBEF's training augmentation, decoded and augmented on the device (the loader section)
LOADER_AUG = [
    "data.image.crop_scale=[0.2,1.0]",
    "data.image.hflip=true",
    "data.image.randaugment=true",
    "data.image.decode=device",
    "data.image.uint8=true",
]


@dataclass
class Plan:
    """What each section runs, on CUDA or (``--cpu``) at tiny sizes."""

    cpu: bool
    world_args: list[str]
    test_images: int
    workers: int
    resume_model: list[str]
    resume_batch: int
    resume_steps: int
    base_model: list[str]  # "base" rows (on CPU: the tiny model shrunk further, same keys otherwise)
    base_batches: tuple[int, int]  # the bench's and the compile sections' batches (ALBEF's 64, and 128)
    base_steps: tuple[int, int]  # warmup, timed
    profile_steps: int  # the bench's steps under torch.profiler (launches and syncs per step)
    compile_steps: tuple[int, int]  # warmup (compilation included, reported apart), timed
    compile_backend: str
    retrieval_size: int  # image resolution of the retrieval section
    k_test: int
    itc_batch: int
    itc_queue: int
    itc_dim: int
    loader: list[str]  # the loader section's config overrides (after its CONFIG)
    loader_sizes: tuple[tuple[int, int], ...]  # generated JPEGs' sizes, one bench each
    loader_images: int
    loader_rounds: int
    budgets: dict[str, float] = field(default_factory=dict)


def make_plan(cpu: bool) -> Plan:
    if cpu:
        return Plan(
            cpu=True,
            world_args=["--images", "48", "--val-images", "0", "--test-images", "20", "--image-size", "32"],
            test_images=20,
            workers=0,
            resume_model=TINY_SHRINK,
            resume_batch=4,
            resume_steps=4,
            base_model=TINY_SHRINK,
            base_batches=(4, 8),
            base_steps=(0, 1),
            profile_steps=1,
            compile_steps=(1, 1),
            compile_backend="eager",
            retrieval_size=32,
            k_test=4,
            itc_batch=16,
            itc_queue=64,
            itc_dim=128,
            loader=[*LOADER_AUG, "data.batch_size=4"],
            loader_sizes=((200, 150),),
            loader_images=8,
            loader_rounds=1,
            budgets=dict(
                world=60,
                itc=60,
                resume=150,
                collectives=60,
                bench=150,
                loader=90,
                zero2=180,
                gloo2=90,
                retrieval=120,
                compile_64=150,
                compile_128=150,
            ),
        )
    workers = max(1, min(8, (os.cpu_count() or 2) // 2))
    return Plan(
        cpu=False,
        world_args=["--images", "1000", "--val-images", "0", "--test-images", "1000", "--image-size", "64"],
        test_images=1000,
        workers=workers,
        resume_model=[],
        resume_batch=32,
        resume_steps=12,
        base_model=BASE_MODEL,
        base_batches=(64, 128),
        base_steps=(3, 10),
        profile_steps=3,
        compile_steps=(3, 10),
        compile_backend="inductor",
        retrieval_size=384,
        k_test=128,
        itc_batch=64,
        itc_queue=65536,
        itc_dim=256,
        loader=[*LOADER_AUG, "model.vision.img_size=256", "data.batch_size=64"],
        loader_sizes=((500, 375), (1280, 960)),
        loader_images=128,
        loader_rounds=3,
        # estimates from the 2026-11-23 H100 loan (docs/performance.md) until measured; each part's deadline is 270 s
        budgets=dict(
            world=30,
            itc=30,
            resume=60,
            collectives=30,
            bench=60,
            loader=90,
            zero2=90,
            gloo2=45,
            retrieval=210,
            compile_64=150,
            compile_128=130,
        ),
    )


# ----------------------------------------------------------------------------- helpers (worker side)


class CheckFailed(Exception):
    """A section ran but a check did not hold (the message says which)."""


@dataclass
class Context:
    plan: Plan
    work: Path
    out: Path

    @property
    def world(self) -> Path:
        w = self.work / "world"
        if not (w / "pretrain.json").is_file():
            raise CheckFailed(f"no world at {w}: the world section did not run or failed")
        return w


def device():
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def sync() -> float:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def release() -> None:
    """Free the previous run's GPU memory before the next one (on the CPU: nothing to do)."""
    import torch

    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_memory() -> tuple[float, str]:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20, "max CUDA memory allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "peak RSS of the worker process"


def pretrain_args(ctx: Context, model: list[str], *extra: str) -> list[str]:
    return [
        f"data.train=[{ctx.world / 'pretrain.json'}]",
        *model,
        f"data.num_workers={ctx.plan.workers}",
        "train.progress=false",
        *extra,
    ]


def load_cfg(overrides: list[str]):
    from vlp.config import PretrainConfig, load_config

    return load_config(PretrainConfig, CONFIG, overrides)
