#!/usr/bin/env python3
"""The type check of `make lint`: mypy over vlp/, held to a baseline that only tightens.

The strict modules (``[[tool.mypy.overrides]]`` in pyproject.toml: losses, eval/metrics, config and
the neutral floor) must have no error at all. Every other file may have at most the number of
errors recorded for it in ``mypy-baseline.json``; a file not listed there, none. A file with fewer
errors than its baseline passes and is reported, so that the next ``--update`` records the gain.

    python scripts/lint/mypy_baseline.py            # check (exit 1 on a regression)
    python scripts/lint/mypy_baseline.py --update   # write the current counts (never raises one)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "mypy-baseline.json"
ERROR = re.compile(r"^(?P<file>[^:]+\.py):\d+: error: ")


def current_counts() -> tuple[Counter[str], str]:
    """Errors per file of ``mypy vlp`` (config from pyproject.toml), and mypy's full output."""
    res = subprocess.run([sys.executable, "-m", "mypy", "vlp"], cwd=ROOT, capture_output=True, text=True)
    if res.returncode not in (0, 1):  # 2: mypy itself failed (bad config, crash)
        sys.exit(f"mypy failed to run (exit {res.returncode}):\n{res.stdout}{res.stderr}")
    counts = Counter(m["file"] for line in res.stdout.splitlines() if (m := ERROR.match(line)))
    return counts, res.stdout


def strict_files() -> list[str]:
    """Path prefixes of the strict modules (the ``[[tool.mypy.overrides]]`` with strict flags)."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    modules = [
        m for o in cfg["tool"]["mypy"].get("overrides", []) if o.get("disallow_untyped_defs") for m in o["module"]
    ]
    return [m.removesuffix(".*").replace(".", "/") + ("/" if m.endswith(".*") else ".py") for m in modules]


def judge(
    counts: dict[str, int], baseline: dict[str, int], strict: list[str]
) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """Files above what they may have (``file -> (errors, allowed)``; a strict file may have none, any
    other its baseline count, a file missing from the baseline none) and files below their baseline
    (``file -> (errors, baseline)``)."""
    allowed = {f: 0 if f.startswith(tuple(strict)) else baseline.get(f, 0) for f in counts}
    worse = {f: (n, allowed[f]) for f, n in counts.items() if n > allowed[f]}
    better = {f: (counts.get(f, 0), n) for f, n in baseline.items() if counts.get(f, 0) < n}
    return worse, better


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--update",
        action="store_true",
        help="record the current counts (only lowers an existing baseline; the first run creates it)",
    )
    a = p.parse_args()
    counts, output = current_counts()
    baseline: dict[str, int] = json.loads(BASELINE.read_text()) if BASELINE.is_file() else {}
    strict = strict_files()
    worse, better = judge(counts, baseline, strict)
    if a.update:
        if worse and (BASELINE.is_file() or any(f.startswith(tuple(strict)) for f in worse)):
            print(f"refusing to raise the baseline; new errors in {sorted(worse)}", file=sys.stderr)
            return 1
        else:
            BASELINE.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")
            print(f"wrote {BASELINE.name}: {sum(counts.values())} errors in {len(counts)} files")
            return 0
    for f, (n, was) in sorted(better.items()):
        print(f"mypy: {f}: {n} errors, baseline {was} (run `python scripts/lint/mypy_baseline.py --update`)")
    if worse:
        print(output, end="")
        for f, (n, was) in sorted(worse.items()):
            print(f"mypy: {f}: {n} errors, more than its baseline of {was}", file=sys.stderr)
        return 1
    print(
        f"mypy: {sum(counts.values())} errors in {len(counts)} files, none above the baseline "
        f"({sum(baseline.values())} recorded)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
