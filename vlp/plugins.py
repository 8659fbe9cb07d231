"""Outside code that extends vlp: its modules imported once, before the ``vlp`` command builds its
parser, so that what they register (a kind, its model builder, runner and evaluator, a contrastive
loss, a preset) is there for the command line as for the built-ins.

Two ways in (``docs/architecture.md``, "Plugins"):

- an installed package's entry points in the group ``vlp.plugins`` (``pyproject.toml``:
  ``[project.entry-points."vlp.plugins"] toy = "toy_vlp"``); an entry point that names a callable
  (``"toy_vlp:register"``) is called with no arguments after its module is imported;
- ``VLP_PLUGINS``: module names separated by commas (``VLP_PLUGINS=toy_vlp,lab.losses``), imported
  from ``sys.path`` in that order after the entry points.

A module that cannot be imported is one :class:`PluginError` naming it and where it was named.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points
from typing import Optional

from vlp.errors import ConfigError

#: the entry-point group and the environment variable read by :func:`load_plugins`
GROUP = "vlp.plugins"
ENV = "VLP_PLUGINS"

_loaded: list[str] = []


class PluginError(ConfigError):
    """A plugin module that could not be imported (or whose entry point failed); the message names
    the module, where it was named and the error."""


def _import(module: str, named_in: str) -> None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = f"no module {e.name!r}" if e.name and e.name != module else "not found on sys.path"
        raise PluginError(f"plugin {module!r} (named in {named_in}): {missing}") from e
    except Exception as e:  # the plugin's own error: named, with its type
        raise PluginError(f"plugin {module!r} (named in {named_in}) failed on import: {type(e).__name__}: {e}") from e


def load_plugins(environ: Optional[dict[str, str]] = None) -> tuple[str, ...]:
    """Import every plugin named by the entry-point group :data:`GROUP` and by :data:`ENV` in
    ``environ`` (default ``os.environ``), each once per process; returns the names loaded so far
    (entry points as ``group:name``). Raises :class:`PluginError` naming the first that fails."""
    env = os.environ if environ is None else environ
    for ep in entry_points(group=GROUP):
        tag = f"{GROUP}:{ep.name}"
        if tag in _loaded:
            continue
        where = f"entry point {ep.name!r} = {ep.value!r} of group {GROUP!r}"
        _import(ep.module, where)
        try:
            target = ep.load()
            if ep.attr and callable(target):
                target()
        except Exception as e:
            raise PluginError(f"plugin {ep.value!r} ({where}) failed: {type(e).__name__}: {e}") from e
        _loaded.append(tag)
    for module in (m.strip() for m in env.get(ENV, "").split(",")):
        if module and module not in _loaded:
            _import(module, f"{ENV}={env[ENV]!r}")
            _loaded.append(module)
    return tuple(_loaded)
