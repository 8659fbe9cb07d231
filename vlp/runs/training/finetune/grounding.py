"""``vlp finetune grounding``: ITC + ITM on referring expressions, validated by Grad-CAM grounding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from vlp.config import FinetuneConfig
from vlp.data.formats import Sample
from vlp.dist import gather_rows, rank, shard_bounds, world_size
from vlp.errors import ConfigError
from vlp.eval.mode import evaluating
from vlp.kinds import GROUNDING
from vlp.pictures import RunStep
from vlp.runs.training.finetune.recipe import finetune_job, fit, load_best, shown_run, write_results
from vlp.runs.training.finetune.registry import RUNNERS
from vlp.runs.training.finetune.retrieval import contrastive_task
from vlp.runs.training.job import Job


def grounding_model(job: Job):
    """The job's in-training model as a :class:`vlp.api.VLPModel` with the evaluation preprocessing
    a saved checkpoint of the run loads with (:meth:`Job.preprocessor`, its ``preprocessor.json``:
    resolution, mean/std, ``data.max_len``), so that
    validation scores exactly what ``vlp evaluate grounding`` scores on that checkpoint. The
    constructor puts the model in eval mode: build it inside :func:`vlp.eval.mode.evaluating`."""
    from vlp.api import VLPModel

    d = cast(FinetuneConfig, job.cfg).data
    return VLPModel(job.model, job.kind, job.model_cfg, job.tokenizer, job.preprocessor(), batch_size=d.eval_batch_size)


def grounding_layer(job: Job) -> int:
    """The fusion layer of ``grounding.layer`` (None: the middle one); one the model lacks raises
    :class:`ConfigError` before any training."""
    from vlp.models.gradcam import fusion_layer_index

    try:
        return fusion_layer_index(job.model, cast(FinetuneConfig, job.cfg).grounding.layer)
    except ValueError as e:
        raise ConfigError(f"config key 'grounding.layer': {e}") from e


@RUNNERS.register(GROUNDING)
def run_finetune_grounding(cfg: FinetuneConfig) -> dict:
    """ALBEF's weakly supervised grounding (``Grounding.py``): ITC (every expression of one image
    shares its id: positives by image) + ITM on (image, referring expression) pairs, no MLM, as
    retrieval (:func:`contrastive_task`); validation = grounding accuracy on ``data.val`` (Grad-CAM
    of the ITM score over fusion layer ``grounding.layer``, :func:`vlp.runs.evaluation.gradcam_grounding.ground`, the
    scoring of ``vlp evaluate grounding``), best checkpoint by accuracy; at the end val and test with
    the best checkpoint beside the random-candidate and the fixed-position baseline (fitted on the
    training files' boxes, when every training entry has them). The checkpoints are of kind
    ``retrieval`` (the model is the retrieval ALBEF)."""
    from vlp.data.grounding import GroundingEntry, read_grounding_file
    from vlp.runs.evaluation.gradcam_grounding import (
        EXAMPLES,
        entry_size,
        example_indices,
        ground,
        plot_examples,
        position_baseline,
        split_metrics,
    )

    d, g = cfg.data, cfg.grounding
    train_entries = [e for path in d.train for e in read_grounding_file(path, d.image_root, "train")]
    evals = {s: read_grounding_file(getattr(d, s), d.image_root, "eval") for s in ("val", "test") if getattr(d, s)}
    sizes = {s: [entry_size(e) for e in entries] for s, entries in evals.items()}
    job = finetune_job(cfg)  # a retrieval checkpoint (the entry's checkpoint_kind)
    layer = grounding_layer(job)
    samples = [Sample(e.image, (e.text,), e.image, e.origin) for e in train_entries]  # image id = the image
    run_dir, task = contrastive_task(job, samples)

    def choose(name: str, show: bool = False) -> list[int]:
        """Every rank grounds its contiguous shard of the split; the chosen candidate of every entry."""
        entries, bounds = evals[name], shard_bounds(len(evals[name]), world_size())
        lo, hi = bounds[rank()], bounds[rank() + 1]
        chosen: list[int] = []
        if hi > lo:
            with evaluating(job.model):
                vm = grounding_model(job)
                chosen = ground(
                    vm, entries[lo:hi], sizes[name][lo:hi], layer, d.eval_batch_size, g.words_only, show
                ).chosen
        return gather_rows(torch.tensor(chosen, dtype=torch.long, device=job.device), bounds).tolist()

    def examples(
        entries: list[GroundingEntry], split_sizes: list[tuple[int, int]], chosen: list[int], path: Path, shows: RunStep
    ) -> None:
        """The examples picture: 8 entries spread over the split, their maps and ``chosen`` boxes."""
        shown = example_indices(len(entries), 8)
        with evaluating(job.model):
            picked = [entries[i] for i in shown]
            maps = ground(grounding_model(job), picked, [split_sizes[i] for i in shown], layer, 8, g.words_only).maps
        plot_examples(entries, shown, maps, [entries[i].candidates[chosen[i]] for i in shown], path, shows)

    def validate(_task: nn.Module, _step: int) -> dict[str, float]:
        return {"acc": split_metrics(evals["val"], choose("val"))["accuracy"]}

    fit(job, task, validate if "val" in evals else None, "acc")
    with_boxes = all(e.bbox is not None and e.candidates for e in train_entries)
    best = load_best(job)
    results: dict[str, Any] = {"task": cfg.task, "layer": layer, "words_only": g.words_only, "best": str(best)}
    for name, entries in evals.items():  # every rank grounds its shard; rank 0 writes
        chosen = choose(name, show=cfg.train.progress and rank() == 0)
        prior = position_baseline(train_entries, entries, sizes[name]) if with_boxes else None
        results[name] = {**split_metrics(entries, chosen), "fixed_position": prior}
        if rank() == 0:
            out = run_dir / name
            out.mkdir(exist_ok=True)
            (out / "metrics.json").write_text(json.dumps(results[name], indent=2))
            examples(entries, sizes[name], chosen, out / EXAMPLES, shown_run(job, best))
    return write_results(job, results)
