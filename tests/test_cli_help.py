"""``vlp --help`` and every subcommand's help keep their commands and options (issue 30, the CLI package).

``tests/cli_help_golden.json`` was written by this file (``python tests/test_cli_help.py --write``) from
the single-module ``vlp/cli.py``, before it became the package ``vlp/cli/``. It holds, for every command
path (``""`` for ``vlp`` itself, ``"data check"``, ``"analyze helper"``, ...), its subcommands in the
order of its help (and the attribute that names the one given), and each argument's option strings (or, for a positional, its name) with its
default, ``nargs``, choices and whether it is required: what the parser accepts, not the wording of its
help.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from vlp.cli import build_parser

GOLDEN = Path(__file__).with_name("cli_help_golden.json")

#: Defaults that depend on the machine (``data check --workers``: the CPUs this process may use).
MACHINE_DEFAULTS = {("data check", "workers")}


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser under ``parser``, depth first, with its command path (``"finetune vqa"``)."""
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from walk(child, (*path, name))


def _json_value(value: Any) -> Any:
    """A default or choices as JSON: itself where JSON holds it, else its ``repr``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, frozenset, set)):
        return [_json_value(v) for v in value]
    return repr(value)


def describe(parser: argparse.ArgumentParser, path: str) -> dict[str, Any]:
    """One parser's subcommands and arguments (see the module's docstring)."""
    commands: list[str] = []
    command_dest = None
    arguments: dict[str, dict[str, Any]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands += list(action.choices)
            command_dest = action.dest
            continue
        name = " ".join(action.option_strings) or action.dest
        default = "<machine>" if (path, action.dest) in MACHINE_DEFAULTS else _json_value(action.default)
        arguments[name] = {
            "dest": action.dest,
            "default": default,
            "nargs": _json_value(action.nargs),
            "choices": _json_value(action.choices),
            "required": action.required,
            "metavar": _json_value(action.metavar),
        }
    return {"commands": commands, "command_dest": command_dest, "arguments": arguments}


def snapshot() -> dict[str, dict[str, Any]]:
    """Every command path of ``vlp`` -> :func:`describe` of its parser."""
    return {path: describe(p, path) for path, p in walk(build_parser())}


def test_every_command_path_is_there() -> None:
    want, got = json.loads(GOLDEN.read_text()), snapshot()
    assert sorted(got) == sorted(want)
    assert len(got) > 50  # vlp, its commands and their subcommands (prepare's datasets too)


def test_every_command_keeps_its_subcommands_options_and_positionals() -> None:
    want, got = json.loads(GOLDEN.read_text()), snapshot()
    for path, w in want.items():
        g = got[path]
        assert g["commands"] == w["commands"], path  # in the same order in the help
        assert g["command_dest"] == w["command_dest"], path  # the handlers read args.command, .what, .task
        assert set(g["arguments"]) == set(w["arguments"]), path
        for name, spec in w["arguments"].items():
            assert g["arguments"][name] == spec, (path, name)


def test_the_options_have_help_and_the_help_renders() -> None:
    for path, p in walk(build_parser()):
        text = p.format_help()
        assert text.startswith("usage: vlp"), path
        for action in p._actions:
            for option in action.option_strings:
                assert option in text, (path, option)


if __name__ == "__main__":
    if "--write" not in sys.argv:
        sys.exit("python tests/test_cli_help.py --write   (rewrites the golden commands and options)")
    GOLDEN.write_text(json.dumps(snapshot(), indent=1) + "\n")
    print(f"wrote {GOLDEN}")


def test_a_gradcam_error_names_layer_only_when_one_was_given() -> None:
    from vlp.cli.common import naming_layer
    from vlp.errors import ConfigError

    for layer, expected in ((None, "^a fusion encoder with 0 layers"), (7, "^--layer 7: a fusion encoder")):
        with pytest.raises(ConfigError, match=expected):
            with naming_layer(layer):
                raise ValueError("a fusion encoder with 0 layers has no cross-attention")


def test_demo_help_names_every_stage_and_option() -> None:
    from vlp.cli import build_parser
    from vlp.runs.bench.demo import FULL_STAGES

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    demo = sub.choices["demo"]
    stages = " ".join(demo.format_help().split()).split("stages:")[1]
    assert all(stage in stages for stage in FULL_STAGES), stages
    assert all(a.help for a in demo._actions if a.option_strings), "every demo option has a help text"
