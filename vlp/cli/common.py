"""What the command families of :mod:`vlp.cli` share: the errors shown to the user as a message, the
``wrote PATH`` line, calling a run function with the parsed options, and a Grad-CAM command's
``--layer`` errors."""

from __future__ import annotations

import argparse
import inspect
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, TypeVar

from vlp.errors import CalibrationError, CheckpointError, ConfigError, DataError, DownloadError

#: Errors of the user's input (config, data, checkpoint, download) and calibrations that refuse to answer:
#: ``vlp: error: ...``, exit status 2.
USER_ERRORS = (ConfigError, DataError, CheckpointError, DownloadError, CalibrationError)

T = TypeVar("T")


def wrote(path: Any) -> None:
    """Print ``wrote PATH``."""
    print(f"wrote {path}")


def call(func: Callable[..., T], a: argparse.Namespace, **given: Any) -> T:
    """``func`` called by keyword: with ``given`` (a parameter whose option has another name, or a
    value worked out from the options) and every other parameter of ``func`` that the parsed ``a``
    holds under the parameter's name. None (an option left out) is not passed to a parameter with a
    default, so ``func``'s own default applies: each option is named once, in the parser, and a
    default the parser does not give is written once, in ``func``. For a command whose every option
    named like a parameter of ``func`` is meant for that parameter."""
    params = inspect.signature(func).parameters
    kwargs = {**{k: v for k, v in vars(a).items() if k in params}, **given}  # a wrong given name: TypeError
    return func(**{k: v for k, v in kwargs.items() if v is not None or _required(params.get(k))})


def _required(param: Optional[inspect.Parameter]) -> bool:
    """Whether ``param`` has no default (None is passed to it as it is)."""
    return param is not None and param.default is inspect.Parameter.empty


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
