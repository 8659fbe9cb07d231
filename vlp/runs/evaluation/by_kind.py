"""Evaluating a checkpoint with its kind's evaluator: :func:`run_evaluate`, and the evaluators of
the built-in kinds the other evaluation modules do not provide (:attr:`vlp.kinds.Kind.evaluate`).

Every evaluator is ``(checkpoint, data, out, image_root=None) -> metrics dict``: it evaluates the
checkpoint folder or run directory ``checkpoint`` on the annotation file ``data`` (relative image
paths under ``image_root``, default the file's folder), writes ``out/metrics.json`` and returns
what it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch

from vlp.checkpoint import open_checkpoint
from vlp.kinds import kind

PathLike = str | Path


def run_evaluate(
    checkpoint: PathLike, data: PathLike, out: PathLike, task: Optional[str] = None, image_root: Optional[str] = None
) -> dict[str, Any]:
    """Evaluate ``checkpoint`` on ``data`` with the evaluator of ``task`` (default: the checkpoint's
    own kind, read from its ``state.json``); returns the metrics (also in ``out/metrics.json``). A
    kind without an evaluator raises :class:`vlp.kinds.UnknownKind` naming those that have one."""
    name = task or open_checkpoint(checkpoint, load=False).kind
    return kind(name).evaluator()(checkpoint, data, out, image_root=image_root)


def write_metrics(out: PathLike, metrics: dict[str, Any]) -> dict[str, Any]:
    """``out/metrics.json`` (the folder made if needed); returns ``metrics``."""
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics


def evaluate_retrieval(
    checkpoint: PathLike, data: PathLike, out: PathLike, image_root: Optional[str] = None
) -> dict[str, Any]:
    """Zero-shot retrieval on a Karpathy-style split (:func:`vlp.runs.evaluation.image_text_retrieval.run_evaluate_retrieval`,
    no relevance file); its metrics."""
    from vlp.runs.evaluation.image_text_retrieval import run_evaluate_retrieval

    return dict(run_evaluate_retrieval(checkpoint, data, None, out, image_root, show_progress=False).metrics)


def evaluate_vqa(checkpoint: PathLike, data: PathLike, out: PathLike, image_root: Optional[str] = None) -> dict:
    """VQA accuracy (ALBEF's and the official one) of the checkpoint's ranked answers
    (:meth:`vlp.api.VLPModel.answer`, its stored answer list) on a VQA file with answers."""
    from vlp.api import VLPModel
    from vlp.data.downstream_formats import load_vqa
    from vlp.eval.vqa import mean_vqa_accuracy

    questions = load_vqa([data], image_root)
    preds = VLPModel.from_pretrained(checkpoint).answer([q.image for q in questions], [q.question for q in questions])
    raw = [q.raw_answers for q in questions]
    return write_metrics(
        out,
        {
            "acc": mean_vqa_accuracy(preds, raw),
            "acc_official": mean_vqa_accuracy(preds, raw, official=True),
            "n": len(questions),
        },
    )


def _accuracy(right: list[bool]) -> dict[str, Any]:
    """``{"acc": percent right, "n": items}``."""
    return {"acc": 100.0 * sum(right) / len(right) if right else 0.0, "n": len(right)}


def evaluate_nlvr(checkpoint: PathLike, data: PathLike, out: PathLike, image_root: Optional[str] = None) -> dict:
    """NLVR2 accuracy (:meth:`vlp.api.VLPModel.nlvr` > 0.5 is True) on an NLVR2 file."""
    from vlp.api import VLPModel
    from vlp.data.downstream_formats import load_nlvr

    items = load_nlvr(data, image_root)
    vm = VLPModel.from_pretrained(checkpoint)
    prob = vm.nlvr([it.images[0] for it in items], [it.images[1] for it in items], [it.sentence for it in items])
    true = torch.as_tensor(prob).reshape(-1) > 0.5  # a list of sentences: a tensor [N]
    return write_metrics(out, _accuracy([bool(t) == bool(it.label) for t, it in zip(true, items)]))


def evaluate_ve(checkpoint: PathLike, data: PathLike, out: PathLike, image_root: Optional[str] = None) -> dict:
    """SNLI-VE accuracy (argmax of :meth:`vlp.api.VLPModel.entailment`) on a VE file."""
    from vlp.api import VLPModel
    from vlp.data.downstream_formats import load_ve

    items = load_ve(data, image_root)
    probs = VLPModel.from_pretrained(checkpoint).entailment([it.image for it in items], [it.sentence for it in items])
    return write_metrics(out, _accuracy([int(p.argmax()) == it.label for p, it in zip(probs, items)]))
