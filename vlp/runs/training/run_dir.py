"""The run directory: created and held for the run (one run per folder), or refused when it already
holds a run; on resume, the config compared with the one the resumed checkpoint was trained with
(:func:`prepare_run_dir`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional, Union

from vlp.config import FinetuneConfig, PretrainConfig, to_dict, to_yaml
from vlp.config.load import migrated
from vlp.config.resume import resume_changes
from vlp.dist import launch_rank
from vlp.errors import CheckpointError, ConfigError, DataError
from vlp.locks import lock_folder
from vlp.weights import find_checkpoint, read_state

logger = logging.getLogger(__name__)


def prepare_run_dir(cfg: Union[PretrainConfig, FinetuneConfig]) -> Path:
    """Create the run directory and hold it for this run (:func:`vlp.locks.lock_folder` on
    ``output_dir/.lock``, rank 0 for the launch: another run there is refused, naming it); refuse one
    that already holds a run (nothing written is lost) unless the run resumes (``train.resume``).
    Rank 0 writes ``config.yaml`` and ``run_info.json``: the other ranks write nothing here before the
    process group forms, which the ranks of a refused launch never reach."""
    run_dir = Path(cfg.output_dir)
    main = launch_rank()[0] == 0
    if cfg.train.resume and not run_dir.is_dir():
        raise DataError(
            f"config key 'train.resume': output_dir {run_dir} does not exist; resume into the "
            "directory of the run that wrote the checkpoint"
        )
    if main:
        lock_folder(run_dir, "output_dir")
    if cfg.train.resume:
        changes = compare_with_saved(cfg, run_dir)
    elif (run_dir / "metrics.jsonl").exists() or any((run_dir / "checkpoints").glob("step_*")):
        fresh = (
            ""
            if any((run_dir / "checkpoints").glob("step_*"))
            else " (it has no checkpoint yet: --resume auto starts it again from step 0)"
        )
        raise DataError(
            f"config key 'output_dir': {run_dir} already holds a run (metrics.jsonl or "
            f"checkpoints/); choose another output_dir, move that run away, or continue it with --resume auto{fresh}"
        )
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    if main:  # versions, revision, devices, command line; a resume appends to "resumes"
        from vlp.train.logging import write_run_info

        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        write_run_info(run_dir, resumed=bool(cfg.train.resume), config_changes=changes if cfg.train.resume else None)
    return run_dir


def saved_config(resume: str, run_dir: Path) -> Optional[Path]:
    """The ``config.yaml`` the run being resumed was started with: that of the run directory holding
    the checkpoint ``resume`` names (``RUN/checkpoints/step_N``), else ``run_dir``'s; None if neither exists."""
    named = Path(resume)
    candidates = [named.parent.parent / "config.yaml"] if named.parent.name == "checkpoints" else []
    candidates += [named / "config.yaml"] if resume != "auto" else []
    return next((p for p in [*candidates, run_dir / "config.yaml"] if p.is_file()), None)


def trained_config(resume: str, run_dir: Path) -> Optional[tuple[dict[str, Any], Path]]:
    """The config the checkpoint ``resume`` names (``auto``: ``run_dir``'s newest valid one) was
    trained with, from its ``state.json``, and that file; None when there is no such checkpoint (a
    run killed before its first one) or it records no config (older vlp)."""
    try:
        ckpt = find_checkpoint(run_dir if resume == "auto" else resume)
        state = read_state(ckpt)
    except CheckpointError:  # no usable checkpoint: the loader says so when it loads
        return None
    config = state.get("config")
    return (config, ckpt / "state.json") if isinstance(config, dict) else None


def compare_with_saved(cfg: Union[PretrainConfig, FinetuneConfig], run_dir: Path) -> dict[str, list[Any]]:
    """The changes ``cfg`` makes to the config of the run it resumes (``{key: [old, new]}``);
    :class:`ConfigError` for those that alter the run and are not in ``train.resume_allow_changes``
    (:func:`vlp.config.resume.resume_changes`). Compared with the config the resumed checkpoint was
    trained with (its ``state.json``), which editing or deleting the run's ``config.yaml`` does not
    change; with ``config.yaml`` only when the checkpoint records none; not at all (a warning) when
    neither exists."""
    from omegaconf import OmegaConf

    assert cfg.train.resume
    trained = trained_config(cfg.train.resume, run_dir)
    saved: Any
    if trained is not None:
        saved, path = trained
    else:
        yaml = saved_config(cfg.train.resume, run_dir)
        if yaml is None:
            logger.warning(f"vlp: warning: no config.yaml of the resumed run in {run_dir}: the config is not compared")
            return {}
        try:
            saved, path = OmegaConf.to_container(OmegaConf.load(yaml)), yaml
        except Exception as e:  # yaml errors and friends
            raise ConfigError(f"{yaml}: the resumed run's config is not readable YAML ({e})") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: the resumed run's config is not a mapping of config keys")
    changes = resume_changes(
        migrated({str(k): v for k, v in saved.items()}), to_dict(cfg), cfg.train.resume_allow_changes, str(path)
    )
    return {k: list(v) for k, v in changes.items()}
