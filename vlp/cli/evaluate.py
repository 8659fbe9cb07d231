"""The evaluation commands: ``vlp evaluate retrieval|classification|grounding`` (each with its own
options), ``vlp evaluate NAME`` for every other task of ``vlp finetune`` (``vqa``, ``nlvr2``, ``ve``, a
plugin's: ``--checkpoint``, ``--data``, ``--out``, ``--image-root``; its evaluator, in
:data:`vlp.runs.evaluation.registry.EVALUATORS`, looked up when the command runs)
and ``vlp explain`` (:mod:`vlp.runs.evaluation.image_text_retrieval`,
:mod:`~vlp.runs.evaluation.zero_shot_classification`, :mod:`~vlp.runs.evaluation.gradcam_grounding`,
:mod:`~vlp.runs.evaluation.by_kind`, :mod:`~vlp.runs.evaluation.explain`)."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import Any

from vlp.cli.common import add_family, add_overrides, call, naming_layer, wrote
from vlp.cli.train import finetune_commands
from vlp.kinds import GROUNDING, RETRIEVAL
from vlp.metrics_table import format_metrics

#: the zero-shot classification evaluation (a command of its own, no kind)
CLASSIFICATION = "classification"
#: the evaluations with a command of their own options; every other evaluator has the generic one
OWN_COMMANDS = (RETRIEVAL, CLASSIFICATION, GROUNDING)


def _evaluate_retrieval(a: argparse.Namespace) -> None:
    from vlp.dist import rank
    from vlp.runs.evaluation.image_text_retrieval import run_evaluate_retrieval

    res = call(run_evaluate_retrieval, a)
    if rank() == 0:  # launched as several processes (docs/evaluation.md): every rank has the same metrics
        print(format_metrics(res.metrics))
        wrote(Path(a.out) / "metrics.json")


def _evaluate_classification(a: argparse.Namespace) -> None:
    from vlp.runs.evaluation.zero_shot_classification import run_evaluate_classification

    print(format_metrics(call(run_evaluate_classification, a)))
    wrote(Path(a.out) / "metrics.json")


def _evaluate_grounding(a: argparse.Namespace) -> None:
    from vlp.runs.evaluation.gradcam_grounding import run_evaluate_grounding

    with naming_layer(a.layer):
        record = call(run_evaluate_grounding, a)
    print(format_metrics(record))
    wrote(Path(a.out) / "metrics.json")


def _evaluate_task(a: argparse.Namespace) -> None:
    """``vlp evaluate NAME``: the evaluator registered as NAME on the checkpoint; prints its metrics.
    A task without one: :class:`~vlp.registry.UnknownName` naming those that have one."""
    from vlp.dist import rank
    from vlp.runs.evaluation.by_kind import run_evaluate

    metrics = run_evaluate(a.checkpoint, a.data, a.out, task=a.what, image_root=a.image_root)
    if rank() == 0:
        print(format_metrics(metrics))
        wrote(Path(a.out) / "metrics.json")


def _explain(a: argparse.Namespace) -> None:
    from vlp.runs.evaluation.explain import run_explain

    with naming_layer(a.layer):
        call(run_explain, a)  # prints what it wrote


def _add_retrieval(ev: Any) -> None:
    """``vlp evaluate retrieval``."""
    r = ev.add_parser(RETRIEVAL, help="zero-shot image-text retrieval (ITC + top-k ITM re-rank)")
    r.add_argument("--checkpoint", required=True, help="checkpoint folder or run directory (newest checkpoint)")
    r.add_argument("--data", required=True, help="Karpathy-style val/test JSON (one entry per image)")
    r.add_argument("--relevance", help="vlp relevance JSON for relevance-aware metrics")
    r.add_argument(
        "--graded-relevance", help="graded relevance .npy [texts, images] for the text->image nDCG (needs --relevance)"
    )
    r.add_argument("--image-root", help="folder for relative image paths (default: the JSON's folder)")
    r.add_argument(
        "--caption-groups",
        help="caption groups JSON (a shapes world's caption_kinds_test.json): also the text->image metrics of "
        "each group of query captions, keyed <metric>@<group>",
    )
    r.add_argument("--out", required=True, help="output folder for metrics.json and plots")
    r.add_argument(
        "--preset",
        choices=["zero-shot", "albef-flickr"],
        help="zero-shot: a raw pretrained checkpoint at its pretraining resolution; albef-flickr: the ALBEF "
        "protocol (COCO-fine-tuned checkpoint on Flickr30k, k_test 128). Both re-rank with ITM",
    )
    add_overrides(r, "eval.k_test=32 eval.score=itm+itc eval.precision=bf16 eval.itm_batch_size=256")
    r.set_defaults(func=_evaluate_retrieval)


def _add_classification(ev: Any) -> None:
    """``vlp evaluate classification``."""
    c = ev.add_parser(
        CLASSIFICATION,
        help="zero-shot classification: class names x prompt templates (prompt ensembles), optional ITM re-rank",
    )
    c.add_argument("--checkpoint", required=True, help="checkpoint folder or run directory")
    c.add_argument(
        "--data", required=True, help="ImageFolder-style directory (one folder per class) or JSON [{image, label}]"
    )
    c.add_argument("--classes", help="class names: .txt (one per line) or JSON list (default: folders / labels)")
    c.add_argument("--templates", help="prompt templates with {} once: .txt or JSON list (default: {})")
    c.add_argument("--image-root", help="folder for relative image paths of a JSON list (default: its folder)")
    c.add_argument("--rerank-k", type=int, default=0, help="re-rank each image's top k classes by ITM (0: off)")
    c.add_argument("--batch-size", type=int, default=64)
    c.add_argument("--out", required=True, help="output folder: metrics.json, predictions.json, confusion.png")
    c.set_defaults(func=_evaluate_classification)


def _add_grounding(ev: Any) -> None:
    """``vlp evaluate grounding``."""
    c = ev.add_parser(
        GROUNDING,
        help="weakly supervised grounding: Grad-CAM of the ITM score over a fusion layer's cross-attention picks a box",
    )
    c.add_argument("--checkpoint", required=True, help="checkpoint folder or run directory (with a fusion encoder)")
    c.add_argument("--data", required=True, help="grounding eval file (refcoco+_val.json, grounding_test.json)")
    c.add_argument("--train", help="grounding train file: fits the fixed-position baseline reported beside")
    c.add_argument("--layer", type=int, help="fusion layer of the Grad-CAM (default: the middle one)")
    c.add_argument("--words-only", action="store_true", help="average the maps over words, not [CLS]/[SEP]")
    c.add_argument("--image-root", help="folder for relative image paths (default: the file's folder)")
    c.add_argument("--batch-size", type=int, default=32)
    c.add_argument("--out", required=True, help="output folder: metrics.json, predictions.json, examples")
    c.set_defaults(func=_evaluate_grounding)


def generic_evaluations() -> list[tuple[str, str]]:
    """``vlp evaluate NAME`` of the generic kind: each task of ``vlp finetune``
    (:func:`~vlp.cli.train.finetune_commands`) without a command of its own (not in
    :data:`OWN_COMMANDS`), with its help line. Read when the parser is built, from the kinds alone (no
    torch): a plugin's task registers before. Its evaluator, in
    :data:`~vlp.runs.evaluation.registry.EVALUATORS`, is looked up when the command runs (the built-in
    tasks each have one: ``tests/test_cli_light.py``)."""
    return [(name, about) for name, about in finetune_commands() if name not in OWN_COMMANDS]


def _add_generic(ev: Any, name: str, about: str) -> None:
    """``vlp evaluate NAME``: a checkpoint, an annotation file, the output folder."""
    c = ev.add_parser(
        name, help=f"evaluate a {name} checkpoint on an annotation file" + (f": {about}" if about else "")
    )
    c.add_argument("--checkpoint", required=True, help="checkpoint folder or run directory (newest checkpoint)")
    c.add_argument("--data", required=True, help=f"{name} annotation file (with labels / answers)")
    c.add_argument("--image-root", help="folder for relative image paths (default: the file's folder)")
    c.add_argument("--out", required=True, help="output folder for metrics.json")
    c.set_defaults(func=_evaluate_task)


def _add_evaluate(sub: Any) -> None:
    """``vlp evaluate retrieval|classification|grounding|NAME``."""
    generic = [partial(_add_generic, name=name, about=about) for name, about in generic_evaluations()]
    add_family(
        sub, "evaluate", "evaluate a checkpoint", (_add_retrieval, _add_classification, _add_grounding, *generic)
    )


def _add_explain(sub: Any) -> None:
    """``vlp explain``."""
    s = sub.add_parser("explain", help="per-word Grad-CAM heat maps of one image and text (one PNG grid)")
    s.add_argument("--checkpoint", required=True, help="checkpoint folder or run directory (with a fusion encoder)")
    s.add_argument("--image", required=True)
    s.add_argument("--text", required=True)
    s.add_argument("--layer", type=int, help="fusion layer (default: the middle one)")
    s.add_argument("--out", required=True, help="output folder: explain.png, explain.json")
    s.set_defaults(func=_explain)


#: This family's commands, each with the function that adds it to ``vlp``'s subparsers.
COMMANDS = {"evaluate": _add_evaluate, "explain": _add_explain}
