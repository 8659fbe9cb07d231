"""What a resumed run may change: the new config against the one the run was started with.

A resume continues the saved run step for step only if the config that shapes it is the same.
:func:`resume_changes` compares the two as dotted keys. A change to a key in :data:`HARMLESS` is
accepted: it only touches logging, checkpoint cadence, speed or memory knobs, or the evaluation
(during and after training). Any other change (batch size, seed, model shape, text length, losses,
learning rate, steps, training data) is refused with one :class:`ConfigError` listing every such
key, old and new value, unless the user names the key, or a section above it, in
``train.resume_allow_changes``.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

from vlp.errors import ConfigError

__all__ = ["HARMLESS", "flatten", "resume_changes"]

#: keys (or sections, ending in ".") whose change leaves the training itself as it was
HARMLESS = (
    "output_dir",  # where the run lives (a run directory moved or copied elsewhere), not what it does
    "train.progress",
    "train.loggers",
    "train.report_to",
    "train.wandb_project",
    "train.log_every",
    "train.ckpt_every",
    "train.keep_last",
    "train.max_nonfinite_steps",
    "train.stop_grace_s",
    "train.dist_timeout_minutes",
    # speed and memory knobs: the same computation, to rounding
    "train.compile",
    "train.compile_backend",
    "train.cuda_graphs",
    "train.grad_checkpointing",
    "train.tf32",
    # the evaluation during and after training, not the training
    "train.eval_every",
    "data.eval",
    "data.relevance",
    "data.graded_relevance",
    "eval.",
)
#: how the resume itself is asked for: never a change
REQUEST = ("train.resume", "train.resume_allow_changes")
#: harmless only for JSON data: a shard stream is split over (processes x loader workers) readers
WORKERS = "data.num_workers"


def flatten(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, leaf value) of a nested mapping; lists are leaves."""
    for k, v in tree.items():
        if isinstance(v, Mapping) and v:
            yield from flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _covered(key: str, names: Sequence[str]) -> bool:
    """Whether ``key`` is one of ``names`` or lies in a section named there (``model.text``,
    ``eval.``)."""
    return any(key == n or key.startswith(n if n.endswith(".") else n + ".") for n in names)


def resume_changes(
    saved: Mapping[str, Any], new: Mapping[str, Any], allowed: Sequence[str], source: str
) -> dict[str, tuple[Any, Any]]:
    """The keys whose value differs between the ``saved`` config (as written to ``config.yaml``)
    and the ``new`` one, as ``{key: (old, new)}``. Keys the saved config lacks (added to vlp since)
    are not changes. Raises :class:`ConfigError` for an ``allowed`` name that is no config key, and
    one listing every change that alters the run and is neither harmless nor ``allowed``;
    ``source`` names the saved config in it."""
    old, now = dict(flatten(saved)), dict(flatten(new))
    unknown = [n for n in allowed if not any(_covered(k, [n]) for k in now)]
    if unknown:
        raise ConfigError(f"config key 'train.resume_allow_changes': no such config key or section: {unknown}")
    changes = {k: (old[k], v) for k, v in now.items() if k in old and old[k] != v and k not in REQUEST}
    harmless = list(HARMLESS) + ([WORKERS] if now.get("data.format") != "webdataset" else [])
    refused = [k for k in changes if not _covered(k, harmless) and not _covered(k, allowed)]
    if refused:
        listed = "; ".join(f"{k}: {changes[k][0]!r} -> {changes[k][1]!r}" for k in refused)
        raise ConfigError(
            f"config key 'train.resume': the resumed run was trained with {source}, and this config changes "
            f"{len(refused)} key(s) that alter the run: {listed}. Resume with the saved values, or accept "
            f"the change with train.resume_allow_changes=[{','.join(refused)}] (the run then differs from "
            "an uninterrupted one)"
        )
    return changes
