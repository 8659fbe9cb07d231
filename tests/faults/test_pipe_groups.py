"""Issue 52, item 9: a ``pipe:`` command's processes die with it. The command runs in a process group
of its own, killed whole at a deadline, when its reader stops early, and when its reader dies without
a word (SIGKILL, as the stop watchdog kills loader workers); before, only the shell was killed and the
pipeline's other processes lived on under PID 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vlp.data.shard_format import ShardFault, ShardInfo, iter_shard
from vlp.remote.shard_urls import open_url
from vlp.remote.url_deadlines import UrlTimeouts

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def grandchild_pipe(pidfile: Path) -> str:
    """A pipe: entry whose pipeline holds a grandchild (``sleep 1000``, its pid written to ``pidfile``)
    and writes nothing."""
    return f"pipe:(sleep 1000 & echo $! > {pidfile}; wait) | cat"


@pytest.fixture
def pidfile(tmp_path: Path):
    f = tmp_path / "grandchild.pid"
    yield f
    if f.exists() and f.read_text().strip() and alive(int(f.read_text())):  # the test failed: end its sleep
        os.kill(int(f.read_text()), signal.SIGKILL)


def wait_for(f: Path, seconds: float = 10) -> int:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if f.exists() and f.read_text().strip():
            return int(f.read_text())
        time.sleep(0.02)
    raise AssertionError(f"{f} never written")


def test_a_pipe_past_its_read_deadline_is_killed_with_its_children(pidfile: Path) -> None:
    entry = grandchild_pipe(pidfile)
    errors: list = []
    samples = list(iter_shard(ShardInfo(entry, 5, 5, 0, "img2dataset"), errors=errors, timeouts=UrlTimeouts(0.5)))
    assert samples == [] and [type(e) for e in errors] == [ShardFault]
    assert str(errors[0]) == f"{entry}: cannot read shard: no byte for 0.5 s"
    assert gone_within(wait_for(pidfile), 2.0)


def test_a_pipe_read_only_in_part_is_killed_with_its_children(pidfile: Path, tmp_path: Path) -> None:
    """The reader stops early (an error in its consumer, a generator closed mid-shard)."""
    entry = f"pipe:(sleep 1000 & echo $! > {pidfile}; head -c 70000 /dev/zero; wait) | cat"
    with pytest.raises(RuntimeError, match="the consumer stopped"):
        with open_url(entry, UrlTimeouts(5.0)) as f:
            assert len(f.read(1000)) == 1000
            raise RuntimeError("the consumer stopped")
    assert gone_within(wait_for(pidfile), 2.0)


def test_a_pipe_whose_reader_is_killed_dies_with_it(pidfile: Path) -> None:
    """The reader's process ends by SIGKILL (as the stop watchdog kills loader workers): no code of
    its own runs, and its command's processes end all the same."""
    script = (
        "import sys; from vlp.remote.shard_urls import open_url; from vlp.remote.url_deadlines import UrlTimeouts\n"
        "with open_url(sys.argv[1], UrlTimeouts(600.0)) as f:\n    f.read(1)\n"
    )
    reader = subprocess.Popen([sys.executable, "-c", script, grandchild_pipe(pidfile)], cwd=ROOT)
    try:
        pid = wait_for(pidfile)
        time.sleep(0.2)
        assert alive(pid)
        reader.kill()
        reader.wait(10)
        assert gone_within(pid, 3.0)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()


def test_a_pipe_that_ends_normally_keeps_its_status(tmp_path: Path) -> None:
    with open_url("pipe:printf abc", UrlTimeouts(5.0)) as f:
        assert f.read() == b"abc"
    with pytest.raises(OSError, match="`exit 3` exited with status 3"):
        with open_url("pipe:exit 3", UrlTimeouts(5.0)) as f:
            f.read()
