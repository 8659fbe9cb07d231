"""``vlp analyze probes``: linear suppression probes on a checkpoint's frozen caption embeddings of a
shapes world's held-out captions: can the embedding still tell each attribute apart?

A probe per attribute (:func:`run_probes`) against the majority-class baseline. The probe metrics
take tensors, never models; they are computed on the CPU in float64 and are deterministic: the
probe is a multinomial logistic regression fitted full-batch by L-BFGS from zero weights.

Models are loaded through :class:`vlp.api.VLPModel` (any checkpoint kind with ITC projections:
ALBEF or the dual encoder), so captions and images are prepared exactly as in evaluation; the
minimal pairs (:mod:`vlp.lab.minimal_pairs`) load and record the same way. Each command writes a
JSON file and a bar plot into ``out``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

from vlp.errors import DataError
from vlp.lab.attributes import attribute_value
from vlp.pictures import RunStep

__all__ = [
    "PROBE_ATTRIBUTES",
    "grouped_split",
    "standardize",
    "fit_linear_probe",
    "probe_accuracy",
    "majority_accuracy",
    "run_probes",
    "format_probes",
]

PROBE_ATTRIBUTES: tuple[str, ...] = ("shape", "color", "size", "cell", "count", "relation")
#: fewest probe rows per half; an attribute with fewer (or one class) is reported as skipped
MIN_PROBE_ROWS = 4


def world_split(world_root: str | Path, split: str = "test") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``scenes.json`` of a shapes world (without its splits) and the records of ``split``."""
    path = Path(world_root) / "scenes.json"
    if not path.is_file():
        raise DataError(f"{path}: not found; the probes need a shapes world (`vlp make-world --out DIR`)")
    data = json.loads(path.read_text())
    if split not in data["splits"]:
        raise DataError(f"{path}: no split {split!r} (has {sorted(data['splits'])})")
    return {k: v for k, v in data.items() if k != "splits"}, data["splits"][split]


def load_model(run: str | Path, device: Optional[str], batch_size: int):
    """The checkpoint (run directory or checkpoint folder) as a :class:`vlp.api.VLPModel`."""
    from vlp.api import VLPModel

    return VLPModel.from_pretrained(run, device=device, batch_size=batch_size)


def record_head(model: Any, run: str | Path, world_root: str | Path, split: str, n_captions: int) -> dict[str, Any]:
    """The head of a probes / minimal-pairs record: what was measured on which world split."""
    return {
        "checkpoint": model.source.get("checkpoint", str(run)),
        "world": str(world_root),
        "split": split,
        "n_captions": n_captions,
    }


def write_record(out: Path, name: str, record: dict[str, Any]) -> Path:
    """``record`` as ``out/<name>.json``."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


# ----------------------------------------------------------------------------- probe metrics


def grouped_split(groups: torch.Tensor, test_fraction: float = 0.5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Split rows into train and test by group: ``groups`` [N] long -> (train rows, test rows), each
    sorted [N_train] / [N_test] long. The distinct groups are shuffled by ``seed`` and the first
    ``round(test_fraction * n_groups)`` go to the test half, so no group is in both halves."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    uniq, inverse = torch.unique(groups.cpu(), return_inverse=True)
    order = torch.randperm(len(uniq), generator=torch.Generator().manual_seed(seed))
    is_test = torch.zeros(len(uniq), dtype=torch.bool)
    is_test[order[: round(test_fraction * len(uniq))]] = True
    rows = torch.arange(len(groups))
    return rows[~is_test[inverse]], rows[is_test[inverse]]


def standardize(x_train: torch.Tensor, x_test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both [N, E] -> float64, centred and scaled per dimension by the training rows' mean and
    standard deviation (a constant dimension is left at 0)."""
    x_train, x_test = x_train.detach().double().cpu(), x_test.detach().double().cpu()
    mean, std = x_train.mean(0), x_train.std(0, unbiased=False)
    std = torch.where(std > 1e-12, std, torch.ones_like(std))
    return (x_train - mean) / std, (x_test - mean) / std


def fit_linear_probe(
    x: torch.Tensor, y: torch.Tensor, n_classes: int, weight_decay: float = 1e-2, max_iter: int = 200
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multinomial logistic regression: ``x`` [N, E] (float64), ``y`` [N] long in [0, n_classes) ->
    weights [E, C], bias [C] minimising ``mean CE(x W + b, y) + weight_decay / 2 * ||W||^2``
    (bias not decayed), full-batch L-BFGS (strong Wolfe line search) from zero."""
    w = torch.zeros(x.shape[1], n_classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, tolerance_grad=1e-9, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(x @ w + b, y) + 0.5 * weight_decay * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def probe_accuracy(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    weight_decay: float = 1e-2,
    max_iter: int = 200,
) -> float:
    """Test accuracy of a linear probe: ``x_train`` [N, E], ``y_train`` [N] long, ``x_test`` [M, E],
    ``y_test`` [M] long. Features are standardised by the training rows (:func:`standardize`), the
    probe fitted by :func:`fit_linear_probe` on the training rows, and the share of test rows whose
    arg-max class is their label returned (ties: the lowest class index)."""
    if len(x_train) == 0 or len(x_test) == 0:
        raise ValueError("probe_accuracy needs training and test rows")
    xtr, xte = standardize(x_train, x_test)
    y_train, y_test = y_train.long().cpu(), y_test.long().cpu()
    n_classes = int(max(y_train.max(), y_test.max())) + 1
    w, b = fit_linear_probe(xtr, y_train, n_classes, weight_decay, max_iter)
    return float(((xte @ w + b).argmax(1) == y_test).double().mean())


def majority_accuracy(y_train: torch.Tensor, y_test: torch.Tensor) -> float:
    """The majority-class baseline: the share of ``y_test`` [M] equal to the most frequent label of
    ``y_train`` [N] (ties: the lowest label)."""
    majority = torch.bincount(y_train.long().cpu()).argmax()
    return float((y_test.long().cpu() == majority).double().mean())


# ----------------------------------------------------------------------------- probes


def attribute_probe(
    feats: torch.Tensor, labels: Sequence[Optional[str]], test_fraction: float, seed: int, weight_decay: float
) -> dict[str, Any]:
    """Probe one attribute: ``feats`` [N, E] of distinct captions, ``labels`` [N] (None: the caption
    does not determine the attribute) -> accuracy, majority baseline, row and class counts."""
    rows = [i for i, v in enumerate(labels) if v is not None]
    present = [str(labels[i]) for i in rows]
    values = sorted(set(present))
    y = torch.tensor([values.index(v) for v in present], dtype=torch.long)
    train, test = grouped_split(torch.arange(len(rows)), test_fraction, seed)  # one text per group
    out: dict[str, Any] = {"n_train": len(train), "n_test": len(test), "values": values}
    if min(len(train), len(test)) < MIN_PROBE_ROWS or len(torch.unique(y[train])) < 2:
        return {**out, "skipped": f"too few captions or classes ({len(rows)} captions, {len(values)} values)"}
    x = feats[rows]
    acc = probe_accuracy(x[train], y[train], x[test], y[test], weight_decay=weight_decay)
    return {**out, "accuracy": acc, "majority": majority_accuracy(y[train], y[test])}


def run_probes(
    run: str | Path,
    world_root: str | Path,
    out: str | Path,
    split: str = "test",
    attributes: Sequence[str] = PROBE_ATTRIBUTES,
    test_fraction: float = 0.5,
    seed: int = 0,
    weight_decay: float = 1e-2,
    batch_size: int = 256,
    device: Optional[str] = None,
) -> dict[str, Any]:
    """Linear suppression probes on the frozen caption embeddings of a checkpoint (run directory or
    checkpoint folder).

    The distinct caption texts of the world's ``split`` are embedded (the normalised ITC feature);
    for each attribute, the captions that determine its value (:func:`attribute_value`) are split
    into probe-train and probe-test halves by ``seed`` (each text in one half only) and a
    multinomial logistic regression is fitted (:func:`probe_accuracy`). Writes
    ``out/probes.json`` (the returned record) and ``out/probes.png`` (accuracy vs majority)."""
    from vlp.viz import plot_attribute_bars

    _, records = world_split(world_root, split)
    preds = {c["text"]: c["predicate"] for r in records for c in r["captions"]}  # distinct texts, in order
    texts = list(preds)
    model = load_model(run, device, batch_size)
    feats = model.encode_text(texts).float()
    results = {
        a: attribute_probe(feats, [attribute_value(preds[t], a) for t in texts], test_fraction, seed, weight_decay)
        for a in attributes
    }
    record = {
        **record_head(model, run, world_root, split, len(texts)),
        "test_fraction": test_fraction,
        "seed": seed,
        "weight_decay": weight_decay,
        "attributes": results,
    }
    out = Path(out)
    write_record(out, "probes", record)
    done = {a: r for a, r in results.items() if "accuracy" in r}
    if done:
        plot_attribute_bars(
            {a: r["accuracy"] for a, r in done.items()},
            out / "probes.png",
            title="linear probes on caption embeddings",
            ylabel="probe accuracy",
            reference={a: r["majority"] for a, r in done.items()},
            reference_label="majority class",
            shows=RunStep.of_checkpoint(record["checkpoint"]),
        )
    return record


def format_probes(report: dict[str, Any]) -> str:
    """The table ``vlp analyze probes`` prints of a report of :func:`run_probes`: each attribute's
    probe accuracy beside its majority class, or why it was not probed."""
    lines = []
    for name, v in report["attributes"].items():
        if "accuracy" in v:
            lines.append(
                f"  {name:10s} probe accuracy {100 * v['accuracy']:5.1f}%  (majority class {100 * v['majority']:5.1f}%)"
            )
        else:
            lines.append(f"  {name:10s} {v.get('skipped', 'not probed')}")
    return "\n".join(lines)
