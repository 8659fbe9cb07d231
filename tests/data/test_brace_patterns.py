"""Issue 52, item 4: a brace pattern's size is counted before it is expanded (braceexpand's grammar:
``{a..b}`` and ``{a..b..step}`` ranges of integers or letters, ``{x,y}`` lists, nesting, ``\\``
escapes), and a pattern of more shards than the cap is refused in one line naming the pattern and
its count, before anything is expanded or requested."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import braceexpand
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlp.data.shard_format import read_sizes
from vlp.errors import DataError
from vlp.remote.brace_patterns import MAX_PATTERN_SHARDS, expand, pattern_size
from vlp.remote.shard_urls import shard_urls

ROOT = Path(__file__).resolve().parents[2]
PATTERNS = [
    "a.tar",
    "{00000..00041}.tar",
    "s3://b/cc/{00000..01242}.tar",
    "{a,b}{1..3}",
    "python{2.{5..7},3.{2,3}}",
    "{07..10}",
    "{a..g..2}",
    "{4..1}",
    "{2..-1}",
    "{1..10..-3}",
    "{Z..a}",
    "{z..A..5}",
    "{0..0}",
    "{,}",
    "{a}",
    "{}x",
    "{a,}{,b}{c}",
    r"{1\{2,3}",
    r"\{1..3\}",
    "{a,{b,{c,d}}}{1..2}",
    "{{1..3},{x,y}z}",
    "{1..3..0}",
    "x{a..c}{1,2}{}{,}",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_patterns_size_is_braceexpands_count(pattern: str) -> None:
    assert pattern_size(pattern) == len(list(braceexpand.braceexpand(pattern)))


PIECES = st.sampled_from(["{", "}", ",", "..", "a", "Z", "0", "07", "1", "-1", "12", "..2", "\\", "x", "/"])


@settings(max_examples=400, deadline=None)
@given(st.lists(PIECES, max_size=12).map("".join))
def test_any_pattern_is_counted_as_braceexpand_expands_it(pattern: str) -> None:
    try:
        n = len(list(braceexpand.braceexpand(pattern)))
    except braceexpand.UnbalancedBracesError:
        with pytest.raises(DataError, match="unbalanced braces"):
            pattern_size(pattern)
        return
    assert pattern_size(pattern) == n


HUGE = "{000000000..099999999}.tar"  # 10**8 shards


@pytest.mark.parametrize("base", ["http://h", "s3://bucket/cc", "pipe:cat /data", "LOCAL"])
def test_a_pattern_over_the_cap_is_refused_in_one_line_before_it_is_expanded(base: str, tmp_path: Path) -> None:
    entry = f"{tmp_path if base == 'LOCAL' else base}/{HUGE}"
    t0 = time.monotonic()
    with pytest.raises(DataError) as e:
        shard_urls(entry) if base != "LOCAL" else read_sizes([entry])
    assert time.monotonic() - t0 < 1.0
    assert str(e.value) == (
        f"data.train entry {entry!r} names 100,000,000 shards, over the cap of {MAX_PATTERN_SHARDS:,} a pattern "
        "(vlp.remote.brace_patterns.MAX_PATTERN_SHARDS): split it into several entries"
    )


def test_at_the_cap_a_pattern_is_expanded(tmp_path: Path) -> None:
    last = MAX_PATTERN_SHARDS - 1
    urls = expand(f"http://h/{{0..{last}}}.tar", "data.train entry")
    assert len(urls) == MAX_PATTERN_SHARDS and urls[-1] == f"http://h/{last}.tar"
    with pytest.raises(DataError, match=f"names {MAX_PATTERN_SHARDS + 1:,} shards"):
        expand(f"http://h/{{0..{last + 1}}}.tar", "data.train entry")


def test_a_patterns_credentials_are_not_printed_in_its_refusal() -> None:
    with pytest.raises(DataError) as e:
        expand("http://h/x.tar?token=SECRET{000000000..099999999}", "data.train entry")
    assert "SECRET" not in str(e.value) and "100,000,000" in str(e.value)


def rss(pid: int) -> int:
    """Resident bytes of process ``pid`` (0 once it has ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    line = next((x for x in status.splitlines() if x.startswith("VmRSS:")), "VmRSS: 0 kB")
    return int(line.split()[1]) << 10


def test_vlp_data_check_of_a_huge_pattern_is_one_line_in_bounded_memory(tmp_path: Path) -> None:
    """The attack as run: `vlp data check 'http://h/{000000000..099999999}.tar'`, its memory watched
    and the command killed past 2 GiB (before: 13 GB in 2 minutes, then a MemoryError traceback)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0, peak = time.monotonic(), 0
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vlp", "data", "check", f"http://h/{HUGE}"], stdout=o, stderr=e, cwd=ROOT, env=env
        )
        while proc.poll() is None and time.monotonic() - t0 < 120:
            peak = max(peak, rss(proc.pid))
            if peak > 2 << 30:
                proc.kill()
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    lines = [line for line in (out.read_text() + err.read_text()).splitlines() if line.strip()]
    assert peak < 2 << 30 and proc.returncode == 2 and len(lines) == 1, (peak, out.read_text() + err.read_text())
    assert lines[0].startswith("vlp: error: data.train entry 'http://h/{000000000..099999999}.tar' names 100,000,000")
