"""Command line: ``vlp pretrain [nlvr-ta] | finetune TASK | train-helper |
cache-helper-features | make-targets | make-shards | data check | prepare | analyze | evaluate |
make-world | bench | demo | convert | export | explain | index | search | serve | zoo | plot``.

Only parsing and dispatch, one module per command family: :mod:`~vlp.cli.train`,
:mod:`~vlp.cli.evaluate`, :mod:`~vlp.cli.data`, :mod:`~vlp.cli.prepare`, :mod:`~vlp.cli.world`,
:mod:`~vlp.cli.convert` (and the zoo), :mod:`~vlp.cli.export` (ONNX), :mod:`~vlp.cli.lab` (analyses
and plots), :mod:`~vlp.cli.demo_bench`, :mod:`~vlp.cli.search` (``vlp index``, ``vlp search``). Each
command is one call into its family's module of :mod:`vlp.runs` or :mod:`vlp.lab` (or into a data,
world, conversion, export, plotting or search tool: :mod:`vlp.search`), and prints what
that call returns, tables formatted there. Those modules are imported inside the handlers, when their
command runs, and so is :mod:`vlp.dist`: building the parser reads light facts only (the kinds of
:data:`vlp.kinds.KINDS`, a plugin's among them), so ``vlp --help``, ``vlp COMMAND --help`` and an
argument error import no torch, transformers, timm or open_clip (``tests/test_cli_light.py``).

What the library says while a command runs comes as log records of the ``vlp`` logger;
:func:`main` prints them first of all (:func:`vlp.console.show_logs`): each bare, INFO on stdout and
warnings on stderr, at the level of ``VLP_LOG_LEVEL`` (default INFO).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Optional, Sequence

from vlp.cli import convert, data, demo_bench, evaluate, export, lab, prepare, search, train, world
from vlp.cli.common import USER_ERRORS
from vlp.config.load import refuse_repeated_keys
from vlp.console import show_logs
from vlp.errors import ConfigError, NonFiniteError
from vlp.kinds import NLVR_TA, PRETRAIN
from vlp.plugins import PluginError, load_plugins
from vlp.remote.url_credentials import redacted

__all__ = ["MULTI_PROCESS", "USER_ERRORS", "build_parser", "main"]

#: The commands in the order of ``vlp --help``.
ORDER = (
    PRETRAIN,
    "pretrain-nlvr-ta",
    "finetune",
    "train-helper",
    "cache-helper-features",
    "make-targets",
    "make-shards",
    "data",
    "prepare",
    "analyze",
    "evaluate",
    "make-world",
    "bench",
    "demo",
    "convert",
    "export",
    "explain",
    "index",
    "search",
    "serve",
    "zoo",
    "plot",
)

#: Commands that split their work over the processes of a launch (torchrun, accelerate launch);
#: the others (make-world, make-shards, make-targets, cache-helper-features, analyze, plot, demo, export,
#: index, search) run on rank 0 only.
MULTI_PROCESS = frozenset({PRETRAIN, "pretrain-nlvr-ta", "train-helper", "finetune", "evaluate", "bench"})


def build_parser() -> argparse.ArgumentParser:
    """``vlp`` and every command of every family, in :data:`ORDER`."""
    adders: dict[str, Callable[[Any], None]] = {}
    for family in (train, data, prepare, lab, evaluate, world, demo_bench, convert, export, search):
        adders.update(family.COMMANDS)
    if set(adders) != set(ORDER):
        raise AssertionError(f"vlp.cli.ORDER and the families' commands differ: {sorted(set(adders) ^ set(ORDER))}")
    p = argparse.ArgumentParser(prog="vlp", description="ALBEF-style vision-language pretraining.")
    sub = p.add_subparsers(dest="command", required=True)
    for name in ORDER:
        adders[name](sub)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one ``vlp`` command; its exit status: 2 for a user error (config, data, checkpoint,
    download), 1 for a run that went non-finite or a data check that found errors, else 0."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == [PRETRAIN, NLVR_TA]:
        argv = ["pretrain-nlvr-ta", *argv[2:]]
    try:
        show_logs()  # vlp's log records printed: INFO on stdout, warnings on stderr (VLP_LOG_LEVEL)
        load_plugins()  # before the parser: what plugins register is among its choices
    except (PluginError, ConfigError) as e:
        print(f"vlp: error: {redacted(str(e))}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    if getattr(args, "resume", None):
        args.overrides = [*args.overrides, f"train.resume={args.resume}"]
    if getattr(args, "report_to", None):
        args.overrides = [*args.overrides, f"train.report_to=[{','.join(args.report_to)}]"]
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command ``args``; its exit status (see :func:`main`). What imports torch
    (:mod:`vlp.dist`, the preemption stop, the command's handler) is imported from here on, after
    the parser has answered ``--help`` and argument errors."""
    from vlp.dist import OtherRankDone, launch_rank
    from vlp.train.preemption import Preempted

    if args.command not in MULTI_PROCESS and launch_rank()[0] != 0:
        return 0  # launched as several processes: this command's files are made by rank 0 alone
    try:
        refuse_repeated_keys(getattr(args, "overrides", None) or [])  # a key given twice: the last would win
        status = args.func(args)  # None, or an exit status (data check: 1 when it found errors)
    except OtherRankDone:
        return 0
    except Preempted as e:
        if launch_rank()[0] == 0:
            print(f"vlp: {redacted(str(e))}", file=sys.stderr)
        return 0
    except USER_ERRORS as e:  # any URL credential in the message blotted out (vlp.remote.url_credentials)
        print(f"vlp: error: {redacted(str(e))}", file=sys.stderr)
        return 2
    except NonFiniteError as e:  # the run's own numbers, not its input: status 1
        print(f"vlp: error: {redacted(str(e))}", file=sys.stderr)
        return 1
    return int(status or 0)
