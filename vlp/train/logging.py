"""Run logging: ``metrics.jsonl`` (one JSON object per logged step) and a tqdm progress bar."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm


class MetricsLog:
    """Append-only JSON-lines log; every line is flushed so nothing is lost on a crash."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop the records of steps after ``step`` (a resumed run logs them again)."""
        if self.path.is_file():
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def progress(total: int, desc: str, enabled: bool = True) -> tqdm:
    return tqdm(total=total, desc=desc, disable=not enabled, dynamic_ncols=True, mininterval=1.0)
