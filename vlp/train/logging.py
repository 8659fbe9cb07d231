"""Run logging: ``metrics.jsonl`` (one JSON object per logged step, always written), the optional
sinks it forwards to (TensorBoard and Weights & Biases, ``train.loggers``), and ``run_info.json``.

Each sink's backend is imported when a run starts and only if it is asked for; a missing package is
one error naming the ``pip install`` that fixes it. Backends exist on the main process only (the
other ranks get an empty :class:`Loggers`). The progress bar is :mod:`vlp.progress`.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import os
import platform
import secrets
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Protocol

from vlp.errors import ConfigError, DataError
from vlp.remote.url_credentials import redacted

#: the prefix of the keys of a periodic zero-shot evaluation's records in ``metrics.jsonl`` and the
#: sinks (``eval/txt_r1``: pretraining's ``train.eval_every``, :mod:`vlp.train.validation`)
EVAL_PREFIX = "eval/"


class MetricsLog:
    """Append-only JSON-lines log; every line is flushed so nothing is lost on a crash. ``sinks``
    (a :class:`Loggers`) receive every record too; ``with log:`` closes them."""

    def __init__(self, path: str | Path, sinks: Optional[Any] = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sinks = sinks

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one JSON line (non-finite floats as ``null``) and pass it, as given, to the sinks."""
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
        """Close the sinks (the log file itself is opened per record)."""
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


# ----------------------------------------------------------------------------- sinks: TensorBoard, W&B

#: logger name -> (module that must be importable, the package that provides it)
BACKENDS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}


class Logger(Protocol):
    """What :class:`Loggers` asks of a backend (TensorBoard, W&B)."""

    def log(self, record: dict[str, Any], step: int) -> None:
        """Record the numbers of ``record`` at ``step``."""
        ...

    def truncate_after(self, step: int) -> None:
        """Forget what was logged after ``step`` (a resumed run logs those steps again)."""
        ...

    def close(self) -> None:
        """Flush and release the backend."""
        ...


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The finite numeric entries of a record (``step`` and non-numbers left out)."""
    return {
        k: float(v)
        for k, v in record.items()
        if k != "step" and isinstance(v, (int, float)) and math.isfinite(float(v))
    }


class TensorBoardLogger:
    """Scalars into ``RUN/tb/`` (``torch.utils.tensorboard.SummaryWriter``). The writer is opened at
    the first record; after a resume (:meth:`truncate_after`) it purges the events of later steps
    an earlier run wrote, as ``metrics.jsonl`` drops them."""

    def __init__(self, run_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self._cls, self.log_dir, self.purge_step, self.writer = SummaryWriter, Path(run_dir) / "tb", None, None

    def truncate_after(self, step: int) -> None:
        """Have the writer, when it opens, purge the events of steps after ``step``."""
        self.purge_step = step + 1

    def log(self, record: dict[str, Any], step: int) -> None:
        """Write the :func:`scalars` of ``record`` at ``step`` and flush (opening the writer at the first record)."""
        if self.writer is None:
            self.writer = self._cls(str(self.log_dir), purge_step=self.purge_step)
        for k, v in scalars(record).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        """Close the writer, if one was opened."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class WandbLogger:
    """A Weights & Biases run (``wandb.init(project, dir=RUN, config, mode)``), opened at the first
    record. Its id is kept in ``RUN/wandb_run_id`` so that a resumed run continues the same W&B run
    (W&B ignores records of steps it already has). ``mode``: ``online``/``offline``/``disabled``;
    None: W&B's own default (``WANDB_MODE``)."""

    def __init__(
        self,
        run_dir: str | Path,
        project: Optional[str],
        config: Optional[dict[str, Any]] = None,
        mode: Optional[str] = None,
    ) -> None:
        import wandb

        self.wandb, self.run_dir, self.project, self.config, self.mode = wandb, Path(run_dir), project, config, mode
        self.run = None

    def truncate_after(self, step: int) -> None:
        """Nothing: W&B keeps the steps it has and ignores records of them."""
        pass

    def log(self, record: dict[str, Any], step: int) -> None:
        """Log the :func:`scalars` of ``record`` at ``step``; the first record starts (or resumes) the
        W&B run whose id ``RUN/wandb_run_id`` keeps."""
        if self.run is None:
            id_file = self.run_dir / "wandb_run_id"
            run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
            self.run = self.wandb.init(
                project=self.project or "vlp",
                dir=str(self.run_dir),
                config=self.config,
                mode=self.mode,
                id=run_id,
                resume="allow",
                name=self.run_dir.name,
            )
            id_file.write_text(run_id + "\n")
        self.run.log(scalars(record), step=step)

    def close(self) -> None:
        """Finish the W&B run, if one was started."""
        if self.run is not None:
            self.run.finish()
            self.run = None


class Loggers:
    """Every configured backend behind one ``log``/``close`` (empty: does nothing)."""

    def __init__(self, backends: list[Logger]) -> None:
        self.backends = backends

    def log(self, record: dict[str, Any], step: Optional[int] = None, prefix: str = "") -> None:
        """Pass ``record`` (without its ``step``, each key prefixed with ``prefix``) to every backend at
        ``step`` (default: the record's ``step``, a ``KeyError`` when it has none)."""
        step = int(record["step"] if step is None else step)
        for b in self.backends:
            b.log({f"{prefix}{k}": v for k, v in record.items() if k != "step"}, step)

    def truncate_after(self, step: int) -> None:
        """Every backend's ``truncate_after(step)`` (a resumed run logs the later steps again)."""
        for b in self.backends:
            b.truncate_after(step)

    def close(self) -> None:
        """Close every backend."""
        for b in self.backends:
            b.close()


def check_loggers(names: list[str]) -> None:
    """Every rank, at the start of a run: unknown names and missing packages are one error."""
    for name in names:
        if name not in BACKENDS:
            raise ConfigError(f"config key 'train.loggers': got {name!r}, expected one of {list(BACKENDS)}")
        module, package = BACKENDS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"config key 'train.loggers': {name} needs the {package} package: "
                f"pip install {package} (or pip install 'vlp[logging]')"
            )


def open_loggers(
    names: list[str],
    run_dir: str | Path,
    main: bool = True,
    project: Optional[str] = None,
    config: Optional[dict[str, Any]] = None,
    wandb_mode: Optional[str] = None,
) -> Loggers:
    """The backends of ``train.loggers`` (checked on every rank; created on the main process)."""
    check_loggers(names)
    if not main:
        return Loggers([])
    backends: list[Logger] = []
    for name in dict.fromkeys(names):
        if name == "tensorboard":
            backends.append(TensorBoardLogger(run_dir))
        else:
            backends.append(WandbLogger(run_dir, project, config, wandb_mode or os.environ.get("WANDB_MODE")))
    return Loggers(backends)


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
    """The CPU's model name (``/proc/cpuinfo``'s ``model name``), else ``platform.processor()`` or the machine type."""
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
        "argv": [redacted(a) for a in sys.argv],  # no URL credential (vlp.remote.url_credentials)
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
