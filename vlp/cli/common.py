"""What the command families of :mod:`vlp.cli` share: the errors shown to the user as a message, the
``wrote PATH`` line, calling a run function with the parsed options (each checked to reach something),
and a Grad-CAM command's ``--layer`` errors."""

from __future__ import annotations

import argparse
import inspect
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

from vlp.errors import CalibrationError, CheckpointError, ConfigError, DataError, DownloadError

#: Errors of the user's input (config, data, checkpoint, download) and calibrations that refuse to answer:
#: ``vlp: error: ...``, exit status 2.
USER_ERRORS = (ConfigError, DataError, CheckpointError, DownloadError, CalibrationError)

T = TypeVar("T")


def wrote(path: Any) -> None:
    """Print ``wrote PATH``."""
    print(f"wrote {path}")


#: The parsed options that ``vlp``'s dispatch reads itself, not a command: the subcommand names (the
#: ``dest`` of ``vlp``'s subparsers, ``command``, and of a family's nested subparsers, ``what``), the
#: handler ``func`` that ``set_defaults`` sets, and the options :func:`vlp.cli.main` folds into the
#: ``overrides`` (``resume``, ``report_to``).
DISPATCH_OPTIONS = frozenset({"command", "what", "func", "resume", "report_to"})


class UnboundOptionError(RuntimeError):
    """A parsed option of a command that reaches nothing (a flag that would do nothing: a parameter of
    the run function renamed, or an option the handler stopped reading), or a name in ``used=`` that is
    no option of the command. A programming error of :mod:`vlp.cli`, not a user error: :func:`vlp.cli.main`
    does not turn it into ``vlp: error:``."""


def call(func: Callable[..., T], a: argparse.Namespace, *, used: Iterable[str] = (), **given: Any) -> T:
    """What ``func`` returns, called by keyword: with ``given`` (a parameter whose option has another
    name, or a value worked out from the options) and every other parameter of ``func`` that the parsed
    ``a`` holds under the parameter's name. None (an option left out) is not passed to a parameter with a
    default, so ``func``'s own default applies: each option is named once, in the parser, and a
    default the parser does not give is written once, in ``func``.

    Every option of ``a`` must reach something, whatever its value: a parameter of ``func``, a name in
    ``used`` (the options the command's handler, or a helper of it, reads itself, e.g. ``out`` for
    ``out_dir=a.out``), or :data:`DISPATCH_OPTIONS`. Checked before ``func`` runs: an option that reaches
    nothing, or a name in ``used`` that is no option of ``a``, raises :class:`UnboundOptionError` (a
    ``RuntimeError``) naming the flag and ``func``."""
    params = inspect.signature(func).parameters
    _check_bound(func, a, params, frozenset(used))
    kwargs = {**{k: v for k, v in vars(a).items() if k in params}, **given}  # a wrong given name: TypeError
    return func(**{k: v for k, v in kwargs.items() if v is not None or _required(params.get(k))})


def _check_bound(func: Callable[..., Any], a: argparse.Namespace, params: Iterable[str], used: frozenset[str]) -> None:
    """Returns None when every option of ``a`` reaches a parameter in ``params``, a name in ``used`` or
    :data:`DISPATCH_OPTIONS` and every name in ``used`` is an option of ``a``; else raises
    :class:`UnboundOptionError` naming the flags."""
    options = set(vars(a))
    unbound = sorted(options - set(params) - used - DISPATCH_OPTIONS)
    stale = sorted(used - options)
    if not unbound and not stale:
        return
    command = " ".join(str(getattr(a, k)) for k in ("command", "what") if getattr(a, k, None) is not None)
    target = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"
    problems = [f"{_flag(k)} reaches no parameter of {target} and is not in used=" for k in unbound]
    problems += [f"used= names {_flag(k)}, which is no option of the command" for k in stale]
    raise UnboundOptionError(f"vlp {command}: " + "; ".join(problems))


def _flag(option: str) -> str:
    """``--some-flag`` for the parsed option ``some_flag`` (a positional argument's name the same way)."""
    return "--" + option.replace("_", "-")


def _required(param: Optional[inspect.Parameter]) -> bool:
    """Whether ``param`` has no default (None is passed to it as it is)."""
    return param is not None and param.default is inspect.Parameter.empty


def add_overrides(parser: argparse.ArgumentParser, example: str) -> None:
    """The positional ``overrides`` of a command that reads a config: dotted ``key=value`` overrides
    (``example``: a few, for the help)."""
    parser.add_argument("overrides", nargs="*", help=f"dotted overrides, e.g. {example}")


def add_family(sub: Any, name: str, text: str, adders: Iterable[Callable[[Any], None]]) -> Any:
    """``vlp NAME WHAT``: the command ``name`` (help ``text``) of ``vlp``'s subparsers ``sub``, whose
    subcommands (the parsed ``what``, required) each of ``adders`` adds; returns its subparsers."""
    s = sub.add_parser(name, help=text)
    family = s.add_subparsers(dest="what", required=True)
    for add in adders:
        add(family)
    return family


@contextmanager
def naming_layer(layer: Optional[int]) -> Iterator[None]:
    """A plain ``ValueError`` from a Grad-CAM command (a ``--layer`` the model does not have, or a
    model without cross-attention) becomes a :class:`ConfigError`, naming ``--layer`` when one was
    given; the user errors (a missing image, a bad checkpoint)
    keep their own message."""
    try:
        yield
    except USER_ERRORS:
        raise
    except ValueError as e:
        raise ConfigError(f"--layer {layer}: {e}" if layer is not None else str(e)) from None
