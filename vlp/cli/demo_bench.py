"""``vlp demo [--full]`` (the whole pipeline on the shapes world, on CPU: :mod:`vlp.runs.bench.demo`) and
``vlp bench`` (timing pretraining steps or the image pipeline: :mod:`vlp.runs.bench.step`,
:mod:`~vlp.runs.bench.loader`)."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any, Sequence

from vlp.cli.common import call, wrote
from vlp.config import PretrainConfig, load_config
from vlp.errors import ConfigError

#: ``vlp bench``'s options read by its handler: the config, the mode, and ``--loader-only``'s options
#: (:func:`_loader_bench`).
_BENCH_OPTIONS = ("config", "overrides", "count_ops", "loader_only", "images", "workers", "n_images", "source_size")


def _bench(a: argparse.Namespace) -> None:
    if a.loader_only:
        _loader_bench(a)
        return
    from vlp.dist import rank
    from vlp.runs.bench.step import format_bench, format_count_ops, run_bench, run_count_ops

    cfg = load_config(PretrainConfig, a.config, a.overrides)
    if a.count_ops:
        if a.profile:
            raise ConfigError("vlp bench: --count-ops and --profile are separate counts: give one")
        # --steps and --peak-tflops are the timing's (run_bench): counting reads neither, as before
        counted = call(run_count_ops, a, used=(*_BENCH_OPTIONS, "steps", "peak_tflops", "profile"), cfg=cfg)
        if rank() == 0:
            print(format_count_ops(counted))
        return
    result = call(run_bench, a, used=_BENCH_OPTIONS, cfg=cfg)
    if rank() == 0:
        print(format_bench(result))
        if a.out:
            wrote(a.out)


def _loader_bench(a: argparse.Namespace) -> None:
    """``vlp bench --loader-only`` (its own warm-up: ``--warmup`` is the training steps')."""
    from vlp.runs.bench.loader import format_loader_bench, parse_size, run_loader_bench

    if a.count_ops:
        raise ConfigError("vlp bench: --loader-only and --count-ops are separate benchmarks: give one")
    if a.images and a.source_size:
        raise ConfigError("vlp bench --loader-only: --source-size applies to generated images, not to --images")
    cfg = load_config(PretrainConfig, a.config, a.overrides)
    bench = partial(run_loader_bench, cfg, a.images, a.n_images, a.workers, out=a.out)
    print(format_loader_bench(bench(size=parse_size(a.source_size)) if a.source_size else bench()))
    if a.out:
        wrote(a.out)


#: how ``vlp demo`` continues a stopped demo (its stop messages say so); ``make demo`` passes it
DEMO_RESUME = "run the same command with --resume auto (`make demo` passes it: run make demo again)"


def _demo(a: argparse.Namespace) -> int:
    """``vlp demo``: 0, or 128 + the signal's number when a stop signal ended it before its table
    (``make demo`` then fails); its stop messages advise ``--resume auto`` (:data:`DEMO_RESUME`)."""
    from vlp.runs.bench.demo import run_demo, run_demo_full
    from vlp.train.preemption import Preempted, resume_advice

    resume = a.demo_resume == "auto"
    with resume_advice(DEMO_RESUME):
        try:
            if a.full:
                stages = _stage_overrides(a.overrides)
                full = ("full", "images", "overrides", "demo_resume")
                call(run_demo_full, a, used=full, n_train=a.images, stage_overrides=stages, resume=resume)
            else:  # --nlvr-ta and --reuse are --full's
                one = ("full", "images", "nlvr_ta", "reuse", "demo_resume")
                call(run_demo, a, used=one, n_train=a.images, resume=resume)
        except Preempted as e:
            print(f"vlp: {e}", file=sys.stderr)
            return 128 + e.signum
    return 0


def _stage_overrides(items: Sequence[str]) -> dict[str, list[str]]:
    """``vlp demo --full``'s ``STAGE:key=value`` overrides, by stage."""
    stages: dict[str, list[str]] = {}
    for item in items:
        name, _, override = item.partition(":")
        if not override:
            raise ConfigError(f"vlp demo --full override {item!r}: expected STAGE:key=value, e.g. vqa:train.epochs=1")
        stages.setdefault(name, []).append(override)
    return stages


def _add_bench(sub: Any) -> None:
    """``vlp bench``."""
    s = sub.add_parser(
        "bench", help="time pretraining steps of a config: pairs/s, ms per phase, peak memory, FLOP per pair, MFU"
    )
    s.add_argument("--config", required=True, help="pretraining YAML (its data.train is read)")
    s.add_argument("--steps", type=int, default=20, help="timed steps")
    s.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    s.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="device peak per process for MFU, e.g. 989 (H100 SXM dense bf16)",
    )
    s.add_argument(
        "--count-ops",
        action="store_true",
        help="count one training step after the warm-up at the dispatcher instead of timing: kernel-launching "
        "ops, casts, device syncs, module calls per forward (the CPU proxies of GPU host time)",
    )
    s.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the timed steps, N more under torch.profiler: kernel launches, CUDA-graph launches, "
        "copies and host syncs per step as CUDA saw them (on the CPU: the aten ops only)",
    )
    s.add_argument(
        "--loader-only",
        action="store_true",
        help="time the training image pipeline instead (open, decode, training transform) in loader "
        "workers: images/s per worker, full and JPEG draft-mode decoding, and decoding on the device "
        "(data.image.decode=device: the loader's share, and the device's on CUDA or the CPU); data.train is not read",
    )
    s.add_argument(
        "--images",
        nargs="+",
        default=None,
        metavar="PATH",
        help="--loader-only: image files or folders of .jpg/.jpeg/.png (default: generated photo-like JPEGs)",
    )
    s.add_argument("--workers", type=int, default=1, help="--loader-only: loader worker processes (0: in-process)")
    s.add_argument(
        "--n-images",
        type=int,
        default=None,
        help="--loader-only: images to generate (default 200), or the first N of --images (default all)",
    )
    s.add_argument(
        "--source-size", default=None, metavar="WxH", help="--loader-only: generated images' size (default 500x375)"
    )
    s.add_argument("--out", default=None, help="also write the result as JSON here")
    s.add_argument("overrides", nargs="*", help="config overrides, e.g. data.batch_size=64")
    s.set_defaults(func=_bench)


def _add_demo(sub: Any) -> None:
    """``vlp demo [--full]``."""
    s = sub.add_parser("demo", help="world -> pretrain tiny model -> zero-shot retrieval, on CPU")
    s.add_argument("--out", default="demo_out", help="folder of the world, the runs and the results table")
    s.add_argument("--seed", type=int, default=0, help="seed of the world and of every run")
    s.add_argument("--images", type=int, default=4000, help="training images")
    s.add_argument(
        "--full",
        action="store_true",
        help="pretrain -> zero-shot retrieval and classification, fine-tuned retrieval, VQA, NLVR2, SNLI-VE, "
        "grounding -> one table (`make demo-full`)",
    )
    s.add_argument("--nlvr-ta", action="store_true", help="with --full: run NLVR2 text-assignment pre-training first")
    s.add_argument(
        "--resume",
        dest="demo_resume",
        choices=["auto"],
        default=None,
        metavar="auto",
        help="continue the demo under --out: an interrupted run from its checkpoint, finished stages kept (a "
        "finished run is evaluated again); none there yet: start. Without it a folder holding a checkpoint is "
        "refused, never deleted",
    )
    s.add_argument("--reuse", action="store_true", help="with --full: the same as --resume auto (its older name)")
    s.add_argument(
        "overrides",
        nargs="*",
        help="config overrides, e.g. train.steps=100; with --full prefixed by the "
        "stage: pretrain:train.steps=100 vqa:train.epochs=1 (stages: pretrain zero_shot retrieval vqa nlvr_ta nlvr2 "
        "nlvr2_text_only ve ve_hypothesis_only grounding classification)",
    )
    s.set_defaults(func=_demo)


#: This family's commands, each with the function that adds it to ``vlp``'s subparsers.
COMMANDS = {"bench": _add_bench, "demo": _add_demo}
