"""Run logging: ``metrics.jsonl`` (one JSON object per logged step), the optional TensorBoard / W&B
sinks it forwards to (:mod:`vlp.train.loggers`), and ``run_info.json`` (the progress bar: :mod:`vlp.progress`)."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from vlp.errors import DataError


class MetricsLog:
    """Append-only JSON-lines log; every line is flushed so nothing is lost on a crash. ``sinks``
    (a :class:`vlp.train.loggers.Loggers`) receive every record too; ``with log:`` closes them."""

    def __init__(self, path: str | Path, sinks: Optional[Any] = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sinks = sinks

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")
        if self.sinks is not None:
            self.sinks.log(record)

    def truncate_after(self, step: int) -> None:
        """Drop the records of steps after ``step`` (a resumed run logs them again)."""
        if self.path.is_file():
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        if self.sinks is not None:
            self.sinks.truncate_after(step)

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``. A last line without its newline that does not parse was
    cut short by a killed run and is dropped; any other bad line is an error naming it."""
    text = Path(path).read_text()
    lines = text.split("\n")
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if n == len(lines):  # the unterminated last line
                break
            raise DataError(f"{path}, line {n}: not a JSON record ({e.msg}, column {e.colno})") from None
    return records


# ----------------------------------------------------------------------------- run_info.json


def git_revision(root: str | Path) -> Optional[dict[str, Any]]:
    """``{"commit", "dirty"}`` of the git checkout at ``root``, or None when it is not one. The
    commit is read from the ``.git`` files; ``dirty`` (None when it cannot be told) from a read-only
    ``git status`` that takes no lock."""
    git = Path(root) / ".git"
    if git.is_file():  # a worktree: "gitdir: PATH"
        text = git.read_text().strip()
        git = (Path(root) / text.partition("gitdir:")[2].strip()).resolve() if text.startswith("gitdir:") else git
    if not (git / "HEAD").is_file():
        return None
    try:
        head = (git / "HEAD").read_text().strip()
        commit = head
        if head.startswith("ref:"):
            ref = head[4:].strip()
            common = Path((git / "commondir").read_text().strip()) if (git / "commondir").is_file() else Path(".")
            common = common if common.is_absolute() else (git / common).resolve()
            commit = None
            for base in (git, common):
                if (base / ref).is_file():
                    commit = (base / ref).read_text().strip()
                    break
                if (base / "packed-refs").is_file():
                    for line in (base / "packed-refs").read_text().splitlines():
                        if line.endswith(" " + ref):
                            commit = line.split()[0]
                            break
                if commit:
                    break
    except OSError:
        return None
    dirty: Optional[bool] = None
    try:
        out = subprocess.run(
            ["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
        if out.returncode == 0:
            dirty = bool(out.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return {"commit": commit, "dirty": dirty}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_info() -> dict[str, Any]:
    """Where and with what a run (or a resume of it) started: versions, source revision, devices,
    processes, command line, host, UTC start time."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    from vlp.dist import launch_rank
    from vlp.version import __version__

    def ver(pkg: str) -> Optional[str]:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return None

    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    return {
        "vlp_version": __version__,
        "git": git_revision(Path(__file__).resolve().parents[2]),  # the checkout holding vlp/
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            **{p: ver(p) for p in ("timm", "transformers", "accelerate")},
        },
        "device": {"cpu": cpu_model(), "gpus": gpus},
        "processes": launch_rank()[1],
        "argv": list(sys.argv),
        "hostname": socket.gethostname(),
        "start_time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_run_info(
    run_dir: str | Path, resumed: bool = False, config_changes: Optional[dict[str, list[Any]]] = None
) -> Path:
    """``RUN/run_info.json``: the first start's :func:`run_info`; a resume appends its own to
    ``resumes``, with the ``config_changes`` it made (``{key: [old, new]}``)."""
    path = Path(run_dir) / "run_info.json"
    info = run_info()
    if config_changes is not None:
        info["config_changes"] = config_changes
    if resumed and path.is_file():
        first = json.loads(path.read_text())
        first.setdefault("resumes", []).append(info)
        info = first
    else:
        info["resumes"] = []
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    tmp.replace(path)
    return path
