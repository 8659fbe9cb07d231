"""``vlp evaluate grounding``: weakly supervised visual grounding of a checkpoint by Grad-CAM (ALBEF's
RefCOCO+ protocol, ``Grounding.py`` with ``gradcam_mode=itm``).

1. each entry's grounding map: the Grad-CAM of the ITM match logit over the cross-attention of one
   fusion layer, averaged over the expression's tokens (:func:`vlp.api.grounding_maps`,
   :mod:`vlp.models.gradcam`);
2. every candidate box is scored by ALBEF's rule (:func:`vlp.eval.grounding.box_scores`: the map
   upsampled bicubically to the image, summed inside the box, divided by sqrt(area)) and the best
   one is chosen;
3. accuracy = % of chosen boxes with IoU >= 0.5 with the target, beside two baselines: the expected
   accuracy of a random candidate, and (given a training file) the best fixed position fitted on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from PIL import Image

from vlp.data.grounding import Box, GroundingEntry, read_grounding_file
from vlp.data.image_checks import check_image_paths
from vlp.errors import DataError
from vlp.eval.grounding import (
    box_scores,
    fixed_position_prior,
    grounding_accuracy,
    paired_iou,
    prior_accuracy,
    random_candidate_accuracy,
)
from vlp.kinds import GROUNDING
from vlp.models.gradcam import fusion_encoder
from vlp.pictures import RunStep
from vlp.progress import progress
from vlp.runs.evaluation.registry import EVALUATORS

METRICS, PREDICTIONS, EXAMPLES = "metrics.json", "predictions.json", "grounding_examples.png"


def entry_size(entry: GroundingEntry) -> tuple[int, int]:
    """The original image's (W, H): the entry's ``image_size``, else read from the image file's header."""
    if entry.image_size is not None:
        return entry.image_size
    try:
        with Image.open(entry.image) as im:
            return im.size
    except OSError as e:
        raise DataError(f"{entry.origin}: cannot read the size of image {entry.image}: {e}") from e


def choose_boxes(
    maps: torch.Tensor, candidates: Sequence[Sequence[Sequence[float]]], sizes: Sequence[tuple[int, int]]
) -> tuple[list[int], list[list[float]]]:
    """For each grounding map of ``maps`` [N, h, w], the index of its best candidate box (argmax of
    :func:`vlp.eval.grounding.box_scores`, the first on ties) among ``candidates[i]`` [M_i, 4] on an
    image of ``sizes[i]`` (W, H), and every candidate's score."""
    if not len(maps) == len(candidates) == len(sizes):
        raise ValueError(f"{len(maps)} maps, {len(candidates)} candidate lists and {len(sizes)} image sizes")
    scores = [box_scores(m, c, s) for m, c, s in zip(maps, candidates, sizes)]
    return [int(s.argmax()) for s in scores], [s.tolist() for s in scores]


def _eval_boxes(entries: Sequence[GroundingEntry], what: str) -> None:
    bad = [e.origin for e in entries if e.bbox is None or not e.candidates]
    if bad:
        raise DataError(f"{bad[0]}: {what} needs 'bbox' and 'candidates' in every entry ({len(bad)} without)")


def position_baseline(
    train_entries: Sequence[GroundingEntry], entries: Sequence[GroundingEntry], sizes: Sequence[tuple[int, int]]
) -> dict[str, Any]:
    """The fixed-position baseline fitted on ``train_entries`` (with boxes) and scored on ``entries``
    (images of ``sizes`` (W, H)): the point, its accuracy (%) on the training entries and on ``entries``."""
    _eval_boxes(train_entries, "the fixed-position baseline")
    fit = fixed_position_prior(
        [e.candidates for e in train_entries], [e.bbox for e in train_entries], [entry_size(e) for e in train_entries]
    )
    acc = prior_accuracy(fit.point, [e.candidates for e in entries], [e.bbox for e in entries], sizes)
    return {"point": list(fit.point), "train_accuracy": fit.train_accuracy, "accuracy": acc}


def _prior(train: str | Path, image_root: Optional[str | Path], entries, sizes) -> dict[str, Any]:
    """The fixed-position baseline fitted on the ``train`` file, scored on ``entries``."""
    return {**position_baseline(read_grounding_file(train, image_root, "train"), entries, sizes), "train": str(train)}


def grounding_maps(
    vm, entries: Sequence[GroundingEntry], layer: Optional[int], batch_size: int, words_only: bool, show_progress: bool
) -> torch.Tensor:
    """The Grad-CAM grounding map [N, h, w] of every entry (its image and text) with the loaded
    :class:`vlp.api.VLPModel`, ``batch_size`` pairs at a time."""
    from vlp.api.gradcam import grounding_maps as pair_maps

    out = []
    with progress(len(entries), GROUNDING, show_progress) as bar:
        for s in range(0, len(entries), batch_size):
            chunk = entries[s : s + batch_size]
            out.append(pair_maps(vm, [e.image for e in chunk], [e.text for e in chunk], layer, batch_size, words_only))
            bar.update(len(chunk))
    return torch.cat(out)


@dataclass
class Grounded:
    """What the model chose for N entries: their grounding maps [N, h, w], the chosen candidate of
    each, every candidate's score, the chosen boxes and their IoU with the targets (float64 [N])."""

    maps: torch.Tensor
    chosen: list[int]
    scores: list[list[float]]
    boxes: list[Box]
    iou: torch.Tensor


def ground(
    vm,
    entries: Sequence[GroundingEntry],
    sizes: Sequence[tuple[int, int]],
    layer: int,
    batch_size: int,
    words_only: bool,
    show_progress: bool = False,
) -> Grounded:
    """Score every candidate box of ``entries`` (images of ``sizes`` (W, H)) by the Grad-CAM map of
    fusion layer ``layer`` of the :class:`vlp.api.VLPModel` ``vm`` and choose the best one: the
    scoring of ``vlp evaluate grounding`` and of ``vlp finetune grounding``'s validation."""
    maps = grounding_maps(vm, entries, layer, batch_size, words_only, show_progress)
    chosen, scores = choose_boxes(maps, [e.candidates for e in entries], sizes)
    boxes = [e.candidates[c] for e, c in zip(entries, chosen)]
    iou = paired_iou(boxes, [e.bbox for e in entries])
    return Grounded(maps, chosen, scores, boxes, iou)


def split_metrics(entries: Sequence[GroundingEntry], chosen: Sequence[int]) -> dict[str, Any]:
    """Accuracy (%) of the ``chosen`` candidate of each entry (IoU >= 0.5 with its target), the
    random-candidate baseline and the number of entries."""
    targets = [e.bbox for e in entries]
    return {
        "accuracy": grounding_accuracy([e.candidates[c] for e, c in zip(entries, chosen)], targets),
        "random_candidate": random_candidate_accuracy([e.candidates for e in entries], targets),
        "n": len(entries),
    }


def example_indices(n: int, n_examples: int) -> list[int]:
    """``n_examples`` entries of ``n`` evenly spread, first and last included (fewer when n is smaller)."""
    return sorted({round(i * (n - 1) / max(1, n_examples - 1)) for i in range(min(n_examples, n))})


def plot_examples(
    entries: Sequence[GroundingEntry],
    shown: Sequence[int],
    maps: torch.Tensor,
    boxes: Sequence[Box],
    path: Path,
    shows: Optional[RunStep] = None,
) -> None:
    """The examples picture: entries ``shown`` with their heat maps ``maps`` [len(shown), h, w], the
    chosen boxes ``boxes`` (one per shown entry) and the targets; titled with ``shows`` (the run
    and step of the checkpoint)."""
    from vlp.heat_pictures import plot_grounding_examples

    rows = [
        {
            "image": entries[i].image,
            "text": entries[i].text,
            "heatmap": m,
            "chosen": b,
            "target": entries[i].bbox,
            "hit": float(paired_iou([b], [entries[i].bbox])[0]) >= 0.5,
        }
        for i, m, b in zip(shown, maps, boxes)
    ]
    if rows:
        plot_grounding_examples(rows, path, shows=shows)


@EVALUATORS.register(GROUNDING)
def run_evaluate_grounding(
    checkpoint: str | Path,
    data: str | Path,
    out: str | Path,
    train: Optional[str | Path] = None,
    layer: Optional[int] = None,
    batch_size: int = 32,
    image_root: Optional[str | Path] = None,
    words_only: bool = False,
    device: Optional[str] = None,
    show_progress: bool = True,
    n_examples: int = 8,
) -> dict[str, Any]:
    """Grounding accuracy of a checkpoint (pretrain, helper or retrieval, with a fusion encoder) on
    the eval grounding file ``data`` (module docstring); ``layer``: the fusion layer (default the
    middle one), ``words_only``: average the token maps without [CLS] and [SEP] (ALBEF averages
    all). ``train`` (a grounding train file with boxes) adds the fixed-position baseline.

    Writes ``out/metrics.json`` (the returned record), ``out/predictions.json`` (per entry: the
    chosen candidate, its IoU with the target, every candidate's score) and
    ``out/grounding_examples.png`` (``n_examples`` entries: heat map, chosen and target box)."""
    from vlp.api import VLPModel, gradcam_layer

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    entries = read_grounding_file(data, image_root, "eval")
    check_image_paths([e.image for e in entries], str(data))
    sizes = [entry_size(e) for e in entries]
    prior = _prior(train, image_root, entries, sizes) if train is not None else None
    vm = VLPModel.from_pretrained(checkpoint, device=device, batch_size=batch_size)
    used_layer = gradcam_layer(vm, layer)
    got = ground(vm, entries, sizes, used_layer, batch_size, words_only, show_progress)
    metrics = split_metrics(entries, got.chosen)
    record: dict[str, Any] = {
        "accuracy": metrics["accuracy"],
        "random_candidate": metrics["random_candidate"],
        "fixed_position": prior,
        "layer": used_layer,
        "n_fusion_layers": len(fusion_encoder(vm.model).layer),
        "words_only": words_only,
        "grid": list(got.maps.shape[1:]),
        "n": len(entries),
        "data": str(data),
        "checkpoint": vm.source.get("checkpoint", str(checkpoint)),
        "checkpoint_kind": vm.kind,
    }
    predictions = [
        {
            "ref_id": e.ref_id,
            "text": e.text,
            "image": e.image,
            "chosen": c,
            "target": e.target_index,
            "iou": float(v),
            "hit": bool(v >= 0.5),
            "scores": s,
        }
        for e, c, v, s in zip(entries, got.chosen, got.iou.tolist(), got.scores)
    ]
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / METRICS).write_text(json.dumps(record, indent=2) + "\n")
    (outdir / PREDICTIONS).write_text("[\n" + ",\n".join(json.dumps(p) for p in predictions) + "\n]\n")
    shown = example_indices(len(entries), n_examples)
    shows = RunStep.of_checkpoint(record["checkpoint"])
    plot_examples(entries, shown, got.maps[shown], [got.boxes[i] for i in shown], outdir / EXAMPLES, shows)
    return record
