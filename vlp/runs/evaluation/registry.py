"""The evaluator of each kind, by kind name: :data:`EVALUATORS`.

An evaluator is ``(checkpoint, data, out, image_root=None, **options) -> metrics dict``: it
evaluates the checkpoint folder or run directory ``checkpoint`` on the annotation file ``data``
(relative image paths under ``image_root``, default the file's folder), writes ``out/metrics.json``
and returns what it wrote (the command prints it: :func:`vlp.metrics_table.format_metrics`);
``options`` are its own keywords (e.g. ``batch_size``). Each evaluation
module of :mod:`vlp.runs.evaluation` registers its evaluator where it is defined
(``@EVALUATORS.register(VQA)``); this module imports none of them, so outside code registers its own
the same way (``EVALUATORS.register("toy", recipe.evaluate)``).
:func:`vlp.runs.evaluation.by_kind.run_evaluate` runs a checkpoint's, and ``vlp evaluate NAME``
offers each one that has no command of its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from vlp.registry import Registry

PathLike = str | Path


#: ``(checkpoint, data, out, image_root=None, **options) -> metrics dict`` (module doc)
Evaluator = Callable[..., dict[str, Any]]


#: the evaluator of each kind, by kind name (a checkpoint's ``state.json`` "task")
EVALUATORS: Registry[Evaluator] = Registry("evaluator")


def write_metrics(out: PathLike, metrics: dict[str, Any]) -> dict[str, Any]:
    """``out/metrics.json`` (the folder made if needed); returns ``metrics``."""
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics
