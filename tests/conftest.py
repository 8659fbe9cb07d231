"""What every test shares: the NaN-JSON check below, the ``vlp`` logger as the library leaves it, and the fixtures of a module's shapes world and of
a checkpoint pretrained on it (plain helpers and override lists are in ``tests/helpers.py``).

No JSON that vlp writes may hold NaN or Infinity (issue 31, item 4): Python's ``json`` writes them as
``NaN``/``Infinity``, which is not JSON, and other readers refuse the file. While the suite runs,
every ``json.dump``/``json.dumps`` called from vlp's own code is checked (serialised once more with
``allow_nan=False``); the session fails at the end, naming each call site that wrote one. Processes
the tests launch (multi-process runs) are not watched.

Every test starts with the ``vlp`` logger as the ``vlp`` command sets it (:func:`vlp.console.show_logs`:
INFO lines on stdout, warnings on stderr, bare), restored afterwards: the suite reads what library
code logs with capsys/capfd as a user of the command sees it. A test of the library's own default (no
handler: records only, Python's last resort for warnings) asks for ``library_logger``
(``tests/test_console.py``)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.helpers import pretrain

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


# ------------------------------------------------------------------ the vlp logger


@pytest.fixture()
def library_logger() -> None:
    """The ``vlp`` logger as the library leaves it in a Python session: no handler, no level."""
    log = logging.getLogger("vlp")
    log.handlers.clear()
    log.setLevel(logging.NOTSET)


@pytest.fixture(autouse=True)
def console() -> Any:
    """vlp's log records printed as the ``vlp`` command prints them (:func:`vlp.console.show_logs`:
    INFO on stdout, warnings on stderr) during every test; the logger restored afterwards. Returns the
    handler."""
    from vlp.console import show_logs

    log = logging.getLogger("vlp")
    saved = (log.handlers[:], log.level)
    log.handlers.clear()
    yield show_logs("INFO")
    log.handlers[:] = saved[0]
    log.setLevel(saved[1])


# ------------------------------------------------------------------ shared fixtures


@pytest.fixture(scope="session")
def make_world(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[str, Path]]:
    """``make_world(name="world", **kwargs)``: ``generate_world`` in a new temporary folder, without
    progress bars; the paths it wrote."""
    from vlp.world import generate_world

    def make(name: str = "world", **kwargs: Any) -> dict[str, Path]:
        return generate_world(tmp_path_factory.mktemp(name), progress=False, **kwargs)

    return make


@pytest.fixture(scope="module")
def world(request: pytest.FixtureRequest, make_world: Callable[..., dict[str, Path]]) -> dict[str, Path]:
    """The module's shapes world: ``generate_world`` with the arguments of the module's ``WORLD`` dict."""
    return make_world(**request.module.WORLD)


@pytest.fixture(scope="module")
def pretrained(
    request: pytest.FixtureRequest, world: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A run folder of ``vlp pretrain`` (configs/pretrain/shapes_tiny.yaml) on ``world``'s pretraining
    pairs, with the module's ``PRETRAIN`` overrides."""
    out = tmp_path_factory.mktemp("pre")
    assert pretrain(out, world["pretrain"], *request.module.PRETRAIN) == 0
    return out


@pytest.fixture(scope="session")
def jpeg_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ALBEF annotation file of 8 photo-like 320x240 JPEGs (``vlp bench --loader-only``'s test
    images) with two captions each: at 64 px with crop_scale [0.5, 1.0] every crop decodes at 1/2 or
    less in JPEG draft mode. Returns the file (the images are beside it)."""
    from vlp.runs.bench.loader import write_test_jpegs

    folder = tmp_path_factory.mktemp("jpegs")
    paths = write_test_jpegs(folder, 8, (320, 240))
    entries = [{"image": p.name, "caption": [f"photo {i}", f"picture {i}"], "image_id": i} for i, p in enumerate(paths)]
    (folder / "ann.json").write_text(json.dumps(entries))
    return folder / "ann.json"
