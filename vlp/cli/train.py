"""The training commands: ``vlp pretrain``, ``pretrain nlvr-ta``, ``finetune TASK`` (every fine-tuning
task of :data:`vlp.kinds.KINDS` with a help line; its runner, in
:data:`vlp.runs.training.finetune.registry.RUNNERS`, is looked up when the command runs) and
``train-helper``. Each reads a YAML config, dotted overrides and ``--resume``, and runs its family's
module of :mod:`vlp.runs`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from vlp.cli.common import add_overrides, wrote
from vlp.config import PretrainConfig, load_config, load_finetune_config
from vlp.kinds import KINDS, NLVR_TA, PRETRAIN
from vlp.metrics_table import format_metrics


def _pretrain(a: argparse.Namespace) -> None:
    from vlp.dist import rank
    from vlp.runs.training.pretrain import run_pretrain

    run_dir = run_pretrain(load_config(PretrainConfig, a.config, a.overrides))
    if rank() == 0:
        print(f"done: {run_dir}")


def _train_helper(a: argparse.Namespace) -> None:
    from vlp.runs.training.pretrain import run_train_helper

    print(f"done: {run_train_helper(load_config(PretrainConfig, a.config, a.overrides))}")


def _finetune(a: argparse.Namespace) -> None:
    """``vlp finetune TASK``: the run's results as a table (rounded; ``results.json`` keeps every digit)."""
    from vlp.runs.training.finetune import run_finetune

    cfg = load_finetune_config(a.task, a.config, a.overrides)
    print(format_metrics(run_finetune(cfg)))
    wrote(Path(cfg.output_dir) / "results.json")


def _nlvr_ta(a: argparse.Namespace) -> None:
    from vlp.runs.training.finetune import run_finetune

    print(f"done: {run_finetune(load_finetune_config(NLVR_TA, a.config, a.overrides))['checkpoint']}")


def add_resume(s: argparse.ArgumentParser) -> None:
    """``--resume auto|CHECKPOINT`` of the training commands: the same as the override ``train.resume=...``
    (:func:`vlp.cli.main` appends it to the overrides)."""
    s.add_argument(
        "--resume",
        metavar="auto|CHECKPOINT",
        help="continue a run: 'auto' = the newest valid checkpoint of its output_dir, or a checkpoint folder "
        "(= train.resume=...; docs/training.md, Runs that survive)",
    )


def add_report_to(s: argparse.ArgumentParser) -> None:
    """``--report-to tensorboard wandb|none`` of the training commands: the override
    ``train.report_to=[...]`` (:func:`vlp.cli.main` appends it)."""
    s.add_argument(
        "--report-to",
        nargs="+",
        metavar="tensorboard|wandb|none",
        help="metric sinks next to metrics.jsonl (always written): tensorboard (RUN/tb/), wandb, or none "
        "(= train.report_to=[...]; docs/training.md)",
    )


def _add_config_command(
    sub: Any, name: str, text: str, example: str, overrides: str, func: Callable[[argparse.Namespace], None]
) -> None:
    """A training command: ``--config`` YAML, dotted overrides and ``--resume``."""
    s = sub.add_parser(name, help=text)
    s.add_argument("--config", required=True, help=f"YAML config (e.g. {example})")
    add_overrides(s, overrides)
    add_resume(s)
    add_report_to(s)
    s.set_defaults(func=func)


def _add_pretrain(sub: Any) -> None:
    """``vlp pretrain``."""
    _add_config_command(
        sub,
        PRETRAIN,
        "pretrain ITC + ITM + MLM",
        "configs/pretrain/shapes_tiny.yaml",
        "train.steps=50 model.vision.depth=2",
        _pretrain,
    )


def _add_nlvr_ta(sub: Any) -> None:
    """``vlp pretrain-nlvr-ta``: :func:`vlp.cli.main` rewrites ``vlp pretrain nlvr-ta ...`` to it."""
    _add_config_command(
        sub,
        "pretrain-nlvr-ta",
        "= `vlp pretrain nlvr-ta`: text-assignment pre-training of the doubled NLVR2 fusion layers",
        "configs/finetune/shapes_nlvr_ta.yaml",
        "train.epochs=1",
        _nlvr_ta,
    )


def finetune_commands() -> list[tuple[str, str]]:
    """``vlp finetune TASK``: each fine-tuning task (:attr:`vlp.kinds.Kind.finetuned`, which has a
    runner in :data:`~vlp.runs.training.finetune.registry.RUNNERS`) whose kind has a help line
    (:attr:`vlp.kinds.Kind.about`), with it, in the order of the kinds. Read when the parser is built,
    from the kinds alone (no torch): a plugin's kind registers before. The runner is looked up when
    the command runs."""
    return [(name, k.about) for name, k in KINDS.items() if k.finetuned and k.about]


def _add_finetune(sub: Any) -> None:
    """``vlp finetune TASK``."""
    s = sub.add_parser("finetune", help="fine-tune a pretrained checkpoint on a downstream task")
    ft = s.add_subparsers(dest="task", required=True)
    for task, text in finetune_commands():
        _add_config_command(
            ft, task, text, f"configs/finetune/shapes_{task}.yaml", "pretrained=runs/pretrain train.epochs=1", _finetune
        )


def _add_train_helper(sub: Any) -> None:
    """``vlp train-helper``."""
    _add_config_command(
        sub,
        "train-helper",
        "train the frozen SRCL helper (ITC-only InfoNCE on clean captions)",
        "configs/helper/shapes_tiny.yaml",
        "train.steps=50",
        _train_helper,
    )


#: This family's commands, each with the function that adds it to ``vlp``'s subparsers.
COMMANDS = {
    PRETRAIN: _add_pretrain,
    "pretrain-nlvr-ta": _add_nlvr_ta,
    "finetune": _add_finetune,
    "train-helper": _add_train_helper,
}
