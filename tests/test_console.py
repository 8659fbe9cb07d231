"""Library code logs, the command line prints (vlp/console.py): a library call leaves log records on
the ``vlp`` logger's tree and writes nothing to stdout; ``vlp`` prints the same records as before,
bare, notes on stdout and warnings on stderr; ``VLP_LOG_LEVEL`` levels them."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data.test_img2dataset_shards import write_img2dataset
from tests.data.test_shard_counts import set_stats
from tests.helpers import ROOT
from vlp.cli import main
from vlp.console import ConsoleHandler, show_logs
from vlp.data.shard_counts import warn_empty
from vlp.models.vision import write_init_report

REPORT = {"init": "none", "arch": "vit_tiny", "source": None}
NOTE = "vision init: none (random weights, arch vit_tiny)"
WARNING = "vlp data: warning: a.tar: b.json lists no samples; the shard is left out"


@pytest.fixture(autouse=True)
def _library_default(library_logger) -> None:
    """Each test here starts from the library's default logger (the suite's others print as vlp does)."""


class _Tower:
    init_report = REPORT


class _Model:
    vision = _Tower()


def test_a_library_call_logs_on_the_vlp_logger_and_prints_nothing(tmp_path: Path, caplog, capsys) -> None:
    caplog.set_level(logging.INFO, logger="vlp")
    assert write_init_report(_Model(), tmp_path) == tmp_path / "vision_init_report.json"
    warn_empty("a.tar", "b.json")
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("vlp.models.vision", logging.INFO, NOTE),
        ("vlp.data.shard_counts", logging.WARNING, WARNING),
    ]
    assert capsys.readouterr() == ("", "")


#: a Python session that configures no logging: the warning on stderr (Python's last resort), no note;
#: then silenced by the vlp logger's level
SESSION = f"""
import logging, sys
from pathlib import Path
from types import SimpleNamespace
from vlp.data.shard_counts import warn_empty
from vlp.models.vision import write_init_report

write_init_report(SimpleNamespace(vision=SimpleNamespace(init_report={REPORT!r})), Path(sys.argv[1]))
warn_empty("a.tar", "b.json")
logging.getLogger("vlp").setLevel(logging.ERROR)
warn_empty("c.tar", "d.json")
assert logging.getLogger("vlp").handlers == []
"""


def test_without_logging_configured_python_shows_the_warnings_alone(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SESSION, str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (done.stdout, done.stderr) == ("", WARNING + "\n")


def test_the_console_prints_bare_lines_on_the_streams_of_each_level(monkeypatch) -> None:
    """INFO on stdout and WARNING+ on stderr, each stream looked up when the record comes (a stream
    replaced after the handler was made, as pytest's capture does, is written to)."""
    handler = show_logs("INFO")
    assert show_logs() is handler and logging.getLogger("vlp").handlers == [handler]  # added once
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    log = logging.getLogger("vlp.some.module")
    log.debug("hidden at INFO")
    log.info("a note")
    log.warning("warning: careful")
    log.error("vlp: error: stopped")
    assert out.getvalue() == "a note\n"
    assert err.getvalue() == "warning: careful\nvlp: error: stopped\n"
    assert isinstance(handler, ConsoleHandler)


def shard_folders(tmp_path: Path) -> tuple[Path, Path]:
    """Two img2dataset folders: ``a`` lists no samples for its last shard (a warning at start-up), ``b``
    has no _stats.json (a note: its shards are indexed)."""
    a = write_img2dataset(tmp_path / "a")
    set_stats(a, 3, 0)
    return a, write_img2dataset(tmp_path / "b", stats=False)


def test_the_command_line_prints_what_it_printed_before(tmp_path: Path, monkeypatch, capsys) -> None:
    a, b = shard_folders(tmp_path)
    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("VLP_LOG_LEVEL", raising=False)
    assert main(["data", "check", str(a), str(b)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"indexing 4 shard(s) without _stats.json (once; kept in {tmp_path / 'cache' / 'shard_index'})",
        f"{a}: 15 entries (img2dataset shards: 3 shards)",
        f"{b}: 20 entries (img2dataset shards: 4 shards)",
        "checked 2 files, 35 entries, 35 images: 0 errors, 0 warnings",
    ]
    assert (
        f"vlp data: warning: {a / '00003.tar'}: {a / '00003_stats.json'} lists no samples; the shard is left out\n"
        in err
    )
    assert "indexing" not in err


def test_vlp_log_level_levels_the_library_lines(tmp_path: Path, monkeypatch, capsys) -> None:
    a, b = shard_folders(tmp_path)
    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VLP_LOG_LEVEL", "warning")
    assert main(["data", "check", str(a), str(b)]) == 0
    out, err = capsys.readouterr()
    assert "indexing" not in out and out.startswith(f"{a}: 15 entries")  # what the command prints itself stays
    assert "lists no samples; the shard is left out" in err
    monkeypatch.setenv("VLP_LOG_LEVEL", "loud")
    assert main(["data", "check", str(a)]) == 2
    assert capsys.readouterr().err == (
        "vlp: error: VLP_LOG_LEVEL=loud: expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL\n"
    )


def test_an_experiment_script_prints_as_vlp_does() -> None:
    from vlp.train.preemption import exit_status

    assert exit_status(lambda: 0, "script.py") == 0
    assert [type(h) for h in logging.getLogger("vlp").handlers] == [ConsoleHandler]


@pytest.mark.parametrize("value", ["", None])
def test_the_console_level_is_info_by_default(monkeypatch, value) -> None:
    if value is None:
        monkeypatch.delenv("VLP_LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("VLP_LOG_LEVEL", value)
    show_logs()
    assert logging.getLogger("vlp").level == logging.INFO
