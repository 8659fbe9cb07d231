"""What every test shares.

No JSON that vlp writes may hold NaN or Infinity (issue 31, item 4): Python's ``json`` writes them as
``NaN``/``Infinity``, which is not JSON, and other readers refuse the file. While the suite runs,
every ``json.dump``/``json.dumps`` called from vlp's own code is checked (serialised once more with
``allow_nan=False``); the session fails at the end, naming each call site that wrote one. Processes
the tests launch (multi-process runs) are not watched."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

VLP = str(Path(__file__).resolve().parent.parent / "vlp")
_dumps, _dump = json.dumps, json.dump
NAN_WRITERS: dict[str, str] = {}  # "file:line" -> what was refused


def _check(obj: Any, kwargs: dict[str, Any]) -> None:
    caller = sys._getframe(2)
    where = caller.f_code.co_filename
    if not where.startswith(VLP) or kwargs.get("allow_nan") is False:
        return
    try:
        _dumps(obj, allow_nan=False, default=kwargs.get("default"), cls=kwargs.get("cls"), sort_keys=False)
    except ValueError as e:
        if "Out of range float" in str(e):
            NAN_WRITERS.setdefault(f"{where.removeprefix(VLP + '/')}:{caller.f_lineno}", str(e))
    except TypeError:  # not serialisable at all: the call itself raises it
        pass


def _checked_dumps(obj: Any, *args: Any, **kwargs: Any) -> str:
    _check(obj, kwargs)
    return _dumps(obj, *args, **kwargs)


def _checked_dump(obj: Any, fp: Any, *args: Any, **kwargs: Any) -> None:
    _check(obj, kwargs)
    _dump(obj, fp, *args, **kwargs)


json.dumps, json.dump = _checked_dumps, _checked_dump  # type: ignore[assignment]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if NAN_WRITERS:
        lines = "\n".join(f"  vlp/{site}: {why}" for site, why in sorted(NAN_WRITERS.items()))
        print(f"\nvlp wrote JSON with NaN or Infinity (not JSON) at:\n{lines}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
