"""Optional metric sinks next to ``metrics.jsonl`` (which is always written): TensorBoard and
Weights & Biases (``train.loggers``). Each backend is imported when a run starts and only if it is
asked for; a missing package is one error naming the ``pip install`` that fixes it. Backends exist on
the main process only (the other ranks get an empty :class:`Loggers`)."""

from __future__ import annotations

import importlib.util
import math
import os
import secrets
from pathlib import Path
from typing import Any, Optional, Protocol

from vlp.errors import ConfigError

#: logger name -> (module that must be importable, the package that provides it)
BACKENDS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}


class Logger(Protocol):
    def log(self, record: dict[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


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
        self.purge_step = step + 1

    def log(self, record: dict[str, Any], step: int) -> None:
        if self.writer is None:
            self.writer = self._cls(str(self.log_dir), purge_step=self.purge_step)
        for k, v in scalars(record).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
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

    def truncate_after(self, step: int) -> None:  # W&B keeps the steps it has; nothing to purge
        pass

    def log(self, record: dict[str, Any], step: int) -> None:
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
        if self.run is not None:
            self.run.finish()
            self.run = None


class Loggers:
    """Every configured backend behind one ``log``/``close`` (empty: does nothing)."""

    def __init__(self, backends: list[Any]) -> None:
        self.backends = backends

    def log(self, record: dict[str, Any], step: Optional[int] = None, prefix: str = "") -> None:
        step = int(record["step"] if step is None else step)
        for b in self.backends:
            b.log({f"{prefix}{k}": v for k, v in record.items() if k != "step"}, step)

    def truncate_after(self, step: int) -> None:
        for b in self.backends:
            b.truncate_after(step)

    def close(self) -> None:
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
    backends: list[Any] = []
    for name in dict.fromkeys(names):
        if name == "tensorboard":
            backends.append(TensorBoardLogger(run_dir))
        else:
            backends.append(WandbLogger(run_dir, project, config, wandb_mode or os.environ.get("WANDB_MODE")))
    return Loggers(backends)
