"""The one table vlp prints numbers in (``vlp evaluate``, ``vlp finetune``, ``vlp demo``): Markdown
columns padded to line up, so that a terminal shows them aligned and a ``.md`` file renders them
(``vlp demo --full``'s ``results.md``); numbers right-aligned and rounded the same way everywhere.
A float has :data:`DECIMALS` decimals (the recalls and accuracies are percentages: ``50.00``), a
whole number has thousands separators (``1,000``). Only what is printed is rounded: the files the
commands write (``metrics.json``, ``results.json``) keep every digit.

- :func:`format_table`: rows under a header;
- :func:`format_metrics`: a metrics or results dict: its numbers in a ``value`` column, each dict
  entry (a split: ``val``, ``test``; a baseline) a column of its own beside it (a dict inside one
  flattened to ``outer.inner``), its text entries (a path, a task name) on a line above; lists are
  left out.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

#: decimals of every float in a printed table
DECIMALS = 2


def is_number(value: Any) -> bool:
    """Whether ``value`` is a number a table right-aligns (a bool is not)."""
    return isinstance(value, Real) and not isinstance(value, bool)


def cell(value: Any) -> str:
    """``value`` as a table shows it: a float to :data:`DECIMALS` decimals, a whole number with
    thousands separators, None empty, anything else as ``str`` gives it."""
    if value is None:
        return ""
    if isinstance(value, Integral) and not isinstance(value, bool):
        return f"{int(value):,}"
    if is_number(value):
        v = float(value)
        return f"{v:.{DECIMALS}f}" if math.isfinite(v) else str(v)
    return str(value)


def format_table(header: Sequence[str], rows: Iterable[Sequence[Any]], right: Optional[Sequence[bool]] = None) -> str:
    """``rows`` under ``header`` as a Markdown table padded to line up. Each value goes through
    :func:`cell`; a column is right-aligned (``---:``) when ``right`` says so, by default when
    every value it holds is a number (:func:`is_number`; empty cells aside)."""
    raw = [list(row) for row in rows]
    if any(len(row) != len(header) for row in raw):
        raise ValueError(f"every row needs {len(header)} values, one per column of {list(header)}")
    cells = [[cell(v) for v in row] for row in raw]
    if right is None:
        right = [
            any(row[j] is not None for row in raw) and all(row[j] is None or is_number(row[j]) for row in raw)
            for j in range(len(header))
        ]
    widths = [max([3, len(h), *(len(row[j]) for row in cells)]) for j, h in enumerate(header)]

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right)) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" if r else "-" * (w + 2) for w, r in zip(widths, right)) + "|"
    return "\n".join([line(header), rule, *(line(row) for row in cells)])


def flat_items(metrics: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of ``metrics``, a dict inside it flattened to ``outer.inner``; lists and
    tuples (per-class values, a confusion matrix, class names) left out."""
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            yield from flat_items(value, f"{prefix}{key}.")
        elif not isinstance(value, (list, tuple)):
            yield f"{prefix}{key}", value


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """What a command prints of a metrics or results dict (module doc): a line of its text entries
    (``key: value``, ", "-separated; None left out), then a ``| metric | value | <dict entries...> |`` table of its
    numbers, one row per name (a row no column has a value for left out). The ``value`` column
    holds the top-level numbers and is left out when there are none."""
    text = [
        (k, v)
        for k, v in metrics.items()
        if v is not None and not isinstance(v, (Mapping, list, tuple)) and not is_number(v)
    ]
    numbers = {k: v for k, v in metrics.items() if is_number(v)}
    columns = {"value": numbers} if numbers or not any(isinstance(v, Mapping) for v in metrics.values()) else {}
    columns |= {k: dict(flat_items(v)) for k, v in metrics.items() if isinstance(v, Mapping)}
    names = list(dict.fromkeys(name for col in columns.values() for name in col))
    rows = [[name, *(col.get(name) for col in columns.values())] for name in names]
    rows = [row for row in rows if any(v is not None for v in row[1:])]
    lines = [", ".join(f"{k}: {cell(v)}" for k, v in text)] if text else []
    return "\n".join([*lines, format_table(["metric", *columns], rows)])
