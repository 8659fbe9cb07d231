"""What vlp says while it works, as log records, and the console that prints them for a program.

Library code never prints (``scripts/lint/habits.py`` holds every module but the command line and
the progress bar to it): each module logs on ``logging.getLogger(__name__)``, a child of the
:data:`LOGGER` (``vlp``) logger, notes at INFO and warnings at WARNING, with the text a line on the
console has. The library installs no handler: a Python session that configures no logging gets
Python's own last resort, which shows WARNING and above on stderr (the warnings, bare, as vlp
printed them before) and nothing of INFO; its own logging configuration decides otherwise.

A program (``vlp``, the experiment scripts through :func:`vlp.train.preemption.exit_status`) calls
:func:`show_logs`: one :class:`ConsoleHandler` on the ``vlp`` logger, writing each record's bare
message (no level or logger name) with **one rule for the stream: INFO and below to stdout,
WARNING and above to stderr**, at the level of :data:`LEVEL_ENV` (``VLP_LOG_LEVEL``, default INFO).
Depends on nothing in vlp but :mod:`vlp.errors`, so any layer may use it."""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional

from vlp.errors import ConfigError

__all__ = ["LEVELS", "LEVEL_ENV", "LOGGER", "ConsoleHandler", "console_level", "show_logs"]

#: the logger every vlp module's logger descends from
LOGGER = "vlp"
#: the environment variable that sets the console's level (a name of :data:`LEVELS`)
LEVEL_ENV = "VLP_LOG_LEVEL"
#: the level names :data:`LEVEL_ENV` takes
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ConsoleHandler(logging.Handler):
    """A record's bare message (and a traceback when it carries one) as one line: on ``sys.stderr``
    at WARNING and above, else on ``sys.stdout``, each looked up when the record comes (so a stream
    replaced later, pytest's capture among them, is the one written to), flushed at once."""

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``record`` to its stream (above)."""
        try:
            stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


def console_level(value: Optional[str] = None) -> int:
    """The level ``value`` names (one of :data:`LEVELS`, any case); None: :data:`LEVEL_ENV`'s
    value, INFO when unset or empty. Anything else is a :class:`ConfigError` naming the variable."""
    given = os.environ.get(LEVEL_ENV, "") if value is None else value
    name = given.strip().upper() or "INFO"
    if name not in LEVELS:
        raise ConfigError(f"{LEVEL_ENV}={given}: expected one of {', '.join(LEVELS)}")
    return int(getattr(logging, name))


def show_logs(level: Optional[str] = None) -> ConsoleHandler:
    """Print vlp's log records from here on as a program does: the ``vlp`` logger at
    :func:`console_level` of ``level`` and one :class:`ConsoleHandler` on it (added once: a second
    call only sets the level). Returns the handler."""
    log = logging.getLogger(LOGGER)
    log.setLevel(console_level(level))
    for h in log.handlers:
        if isinstance(h, ConsoleHandler):
            return h
    handler = ConsoleHandler()
    log.addHandler(handler)
    return handler
