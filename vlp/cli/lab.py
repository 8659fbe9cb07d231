"""The lab's commands: ``vlp analyze cocos|helper|false-negatives|probes|minimal-pairs|ltd-floor``
(analyses of a trained model, its helper or its data, each a module of :mod:`vlp.lab`) and ``vlp plot
losses|trajectories|retrieval|srcl-weights`` (plots of a run, :mod:`vlp.viz`; the SRCL weights of a
checkpoint, :mod:`vlp.lab.srcl_weights`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vlp.cli.common import add_family, call, naming_layer, wrote
from vlp.config import PretrainConfig, load_config
from vlp.errors import ConfigError, DataError
from vlp.kinds import RETRIEVAL


def _cocos(a: argparse.Namespace) -> None:
    from vlp.lab.cocos import format_cocos, run_cocos
    from vlp.losses import LOSSES

    LOSSES.get(a.loss)  # an unknown loss: one error listing the registered ones, before the checkpoint loads
    print(format_cocos(call(run_cocos, a)))
    print(f"wrote {Path(a.out) / 'cocos.json'} and cocos.png")


def _helper_settings_of_run(a: argparse.Namespace) -> None:
    """With ``--config``: the run's own helper cache, data, batch, queue and weight settings where
    the command line gives none."""
    cfg = load_config(PretrainConfig, a.config, a.overrides)
    a.cache = a.cache or cfg.loss.srcl.helper_features
    a.data = a.data or list(cfg.data.train)
    helper = cfg.loss.srcl.helper
    if not a.cache and helper:  # a helper the run would encode itself: its features must be cached first
        raise ConfigError(
            f"vlp analyze helper --config {a.config}: the run's helper (loss.srcl.helper={helper}) has no feature "
            f"cache to calibrate on; write one first, `vlp cache-helper-features --helper {helper} --data "
            f"{' '.join(map(str, a.data))} --out CACHE`, then pass --cache CACHE (and loss.srcl.helper_features=CACHE "
            "to the run)"
        )
    a.image_root = a.image_root or cfg.data.image_root
    a.batch_size = a.batch_size or cfg.data.batch_size
    a.queue = cfg.model.queue_size if a.queue is None else a.queue
    a.mode, a.tau_w = a.mode or cfg.loss.srcl.norm, a.tau_w or cfg.loss.srcl.tau_w
    a.itc_positives = a.itc_positives or cfg.loss.itc_positives


#: ``vlp analyze helper``'s options read by its handler (and :func:`_helper_settings_of_run`).
_HELPER_OPTIONS = ("config", "overrides", "world", "queue", "student")
#: ... and the calibration's options that the ground-truth report (``--world``) has no parameter for.
_CALIBRATION_ONLY = (
    "image_root",
    "mode",
    "rule",
    "reference",
    "force",
    "itc_positives",
    "min_same_image_auc",
    "student_cache",
    "student_temperature",
)


def _student_cache(a: argparse.Namespace) -> dict[str, Any]:
    """``--student CHECKPOINT``: its features of the data (and ``--reference``) cached under
    ``OUT/student_cache`` (reused when they are there) -> ``{"student_cache": folder}``; else nothing."""
    if a.student_temperature is not None and not (a.student or a.student_cache):
        raise ConfigError("vlp analyze helper: --student-temperature needs --student or --student-cache")
    if not a.student:
        return {}
    from vlp.lab.helper_student import STUDENT_CACHE, cache_student

    folder = Path(a.out) / STUDENT_CACHE
    if not folder.exists():
        print(f"caching the student's features ({a.student}) in {folder}")
    data = [*a.data, *([a.reference] if a.reference else [])]
    return {"student_cache": cache_student(a.student, data, folder, a.image_root)}


def _helper_diagnostics(a: argparse.Namespace) -> None:
    """``vlp analyze helper``: the calibration on real data, or with ``--world`` the ground-truth
    report. Options neither given nor in ``--config`` take the run function's defaults."""
    if a.config is not None:
        _helper_settings_of_run(a)
    if not a.cache or not a.data:
        raise ConfigError("vlp analyze helper: give --cache and --data, or --config RUN.yaml naming them")
    if a.world is None:
        from vlp.lab.calibration import calibration_summary, run_helper_calibration

        student = _student_cache(a)
        r = call(run_helper_calibration, a, used=_HELPER_OPTIONS, queue_size=a.queue, **student)
        print(calibration_summary(r))
    else:
        from vlp.lab.diagnostics import diagnostics_summary, run_helper_diagnostics

        options = (
            ("--rule", a.rule),
            ("--reference", a.reference),
            ("--force", a.force or None),
            ("--itc-positives", a.itc_positives),
            ("--min-same-image-auc", a.min_same_image_auc),
            ("--student", a.student),
            ("--student-cache", a.student_cache),
            ("--student-temperature", a.student_temperature),
        )
        given = [o for o, v in options if v is not None]
        if given:
            raise ConfigError(
                f"vlp analyze helper --world: {', '.join(given)} belong to the calibration without ground truth "
                "(leave out --world)"
            )

        if a.mode not in (None, "softmax"):
            raise ConfigError("vlp analyze helper --world: the ground-truth report is for the softmax norm")
        used = (*_HELPER_OPTIONS, *_CALIBRATION_ONLY, "data")
        r = call(run_helper_diagnostics, a, used=used, world_root=a.world, data_file=a.data, queue_size=a.queue)
        print(diagnostics_summary(r))
    wrote(Path(a.out) / "helper_diagnostics.json")


def _false_negatives(a: argparse.Namespace) -> None:
    from vlp.lab.false_negatives import format_false_negatives, run_false_negatives

    rows = call(
        run_false_negatives,
        a,
        used=("data", "world", "queue"),
        data_file=a.data,
        world_root=a.world,
        queue_sizes=a.queue,
    )
    print(format_false_negatives(rows))
    if a.out:
        wrote(a.out)


def _probes(a: argparse.Namespace) -> None:
    from vlp.lab.probes import format_probes, run_probes

    print(format_probes(call(run_probes, a, used=("checkpoint", "world"), run=a.checkpoint, world_root=a.world)))
    wrote(Path(a.out) / "probes.json")


def _minimal_pairs(a: argparse.Namespace) -> None:
    from vlp.lab.minimal_pairs import format_minimal_pairs, run_minimal_pairs

    used = ("checkpoint", "world", "captions")
    r = call(run_minimal_pairs, a, used=used, run=a.checkpoint, world_root=a.world, n_captions=a.captions)
    print(format_minimal_pairs(r))
    wrote(Path(a.out) / "minimal_pairs.json")


def _ltd_floor(a: argparse.Namespace) -> None:
    from vlp.lab.ltd_floor import run_ltd_floor

    call(run_ltd_floor, a, used=("targets", "data"), targets_file=a.targets, data_files=a.data)
    wrote(Path(a.out) / "ltd_floor.json")


def _run_metrics(run: str) -> Path:
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise DataError(f"{run}: no metrics.jsonl (expected a run directory)")
    return path


def _plot(a: argparse.Namespace) -> None:
    """``vlp plot losses|trajectories|retrieval`` (plots of a run's files, :mod:`vlp.viz`) and
    ``srcl-weights`` (an analysis of a checkpoint)."""
    if a.what == "srcl-weights":
        from vlp.lab.srcl_weights import run_srcl_weight_plots

        for p in call(run_srcl_weight_plots, a).values():
            wrote(p)
        return
    from vlp import viz

    if a.what == "losses":
        wrote(viz.plot_losses(_run_metrics(a.run), a.out or Path(a.run) / "loss_curves.png"))
    elif a.what == "trajectories":
        wrote(viz.plot_trajectories(_run_metrics(a.run), a.out or Path(a.run) / "trajectories.png"))
    elif not a.gradcam:
        wrote(viz.replot_retrieval(a.dir, a.out))
    else:
        from vlp.runs.evaluation.explain import run_retrieval_gradcam

        with naming_layer(a.layer):
            written = call(run_retrieval_gradcam, a, used=("dir", "gradcam"), run_or_eval_dir=a.dir)
        for p in written:
            wrote(p)


def _add_cocos(an: Any) -> None:
    """``vlp analyze cocos``."""
    c = an.add_parser("cocos", help="count candidates contributing to each query's gradient (COCOS)")
    c.add_argument("--checkpoint", required=True, help="checkpoint folder or run directory")
    c.add_argument("--data", required=True, nargs="+", help="training annotation file(s)")
    c.add_argument(
        "--loss",
        required=True,
        metavar="NAME",
        help="a registered contrastive loss (vlp.losses.LOSSES: the built-ins of vlp/losses/zoo.py, e.g. infonce, "
        "and a plugin's; an unknown name is refused with the list)",
    )
    c.add_argument("--out", required=True, help="output folder for cocos.json and cocos.png")
    c.add_argument("--threshold", type=float, default=0.01, help="weight threshold for infonce and smoothap")
    c.add_argument("--batches", type=int, help="stop after this many batches (default: one pass)")
    c.add_argument(
        "--smoothap-inv-tau",
        action="store_true",
        help="smoothap: count the true gradient magnitude G(1-G)/tau/R^2 instead of ECIR's G(1-G)/R^2",
    )
    c.add_argument(
        "overrides", nargs="*", help="e.g. data.batch_size=128 data.captions_per_image=5 loss.contrastive.tau=0.1"
    )
    c.set_defaults(func=_cocos)


def _add_helper(an: Any) -> None:
    """``vlp analyze helper``."""
    c = an.add_parser(
        "helper",
        help="SRCL helper diagnostics: calibrate delta on real data (same-image captions as the known false "
        "negatives), or with --world against a shapes world's ground truth (ROC-AUC too)",
    )
    c.add_argument("--cache", help="helper feature cache (vlp cache-helper-features; learned, open_clip or oracle)")
    c.add_argument("--data", nargs="+", help="pretraining annotation file(s) the cache covers")
    c.add_argument("--out", required=True, help="folder for helper_diagnostics.json and weight histograms")
    c.add_argument("--config", help="a pretraining config: its helper_features, data, batch, queue and norm by default")
    c.add_argument("--world", help="a shapes world the data belongs to: the ground-truth report instead")
    c.add_argument("--image-root", help="folder for relative image paths (default: each file's folder)")
    c.add_argument("--batch-size", type=int, help="per-process batch of the run (default 64)")
    c.add_argument("--queue", type=int, help="ITC queue size of the run: negatives beyond the batch (default 0)")
    c.add_argument("--batches", type=int, default=20)
    c.add_argument(
        "--target-weight",
        type=float,
        default=0.12,
        help="median weight of the known false negatives delta aims at (the paper's example: 0.12)",
    )
    c.add_argument("--delta", type=float, help="also report the weights at this delta")
    c.add_argument("--mode", choices=["softmax", "mean"], help="weight norm (loss.srcl.norm; default softmax)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--tau-w", type=float, help="temperature inside s = exp(sim / tau_w) (default 1)")
    c.add_argument(
        "--rule",
        choices=["probes", "20pct"],
        help="how delta is chosen: probes (default: the same-image captions' median weight at --target-weight) or "
        "20pct (the paper's 20%% of negatives below 0.7; for one-caption data without --reference)",
    )
    c.add_argument(
        "--reference",
        help="for data where no image has a second caption (CC3M, SBU, LAION): a multi-caption annotation file the "
        "cache also covers (e.g. COCO's Karpathy train captions) whose batches are calibrated on instead",
    )
    c.add_argument(
        "--min-same-image-auc",
        type=float,
        help="refuse a helper whose same-image AUC is below this (default: vlp.lab.calibration.MIN_SAME_IMAGE_AUC)",
    )
    c.add_argument(
        "--force", action="store_true", help="write the override even for a helper below --min-same-image-auc"
    )
    c.add_argument(
        "--itc-positives",
        choices=["pair", "image"],
        help="the run's loss.itc_positives (default pair; image: retrieval fine-tuning, where an image's other "
        "captions are positives and only --rule 20pct applies)",
    )
    student = c.add_mutually_exclusive_group()
    student.add_argument(
        "--student",
        metavar="CHECKPOINT",
        help="also measure the helper against this student (a run directory or checkpoint, e.g. after a warm-up): "
        "its features are cached in OUT/student_cache first (reused when there); report against_student",
    )
    student.add_argument(
        "--student-cache", metavar="DIR", help="as --student, from a cache of the student's features already written"
    )
    c.add_argument(
        "--student-temperature",
        type=float,
        metavar="T",
        help="the student's ITC temperature (default: the checkpoint's loss.contrastive.tau, else its learned temp)",
    )
    c.add_argument("overrides", nargs="*", help="with --config: dotted overrides, e.g. data.batch_size=32")
    c.set_defaults(func=_helper_diagnostics)


def _add_false_negatives(an: Any) -> None:
    """``vlp analyze false-negatives``."""
    c = an.add_parser("false-negatives", help="share of true false negatives among a training batch's negatives")
    c.add_argument("--world", required=True, help="the shapes world the data file belongs to")
    c.add_argument("--data", required=True, help="pretraining annotation file over the world's images")
    c.add_argument("--batch-size", type=int, default=64)
    c.add_argument("--queue", type=int, nargs="+", default=[0], help="queue sizes to measure")
    c.add_argument("--batches", type=int, default=50)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", help="also write the measurements as JSON here")
    c.set_defaults(func=_false_negatives)


def _add_probes(an: Any) -> None:
    """``vlp analyze probes`` and ``minimal-pairs`` (LTD, on a shapes world)."""
    c = an.add_parser("probes", help="LTD: linear attribute probes on frozen caption embeddings (shapes world)")
    c.add_argument("--checkpoint", required=True, help="checkpoint folder or run directory")
    c.add_argument("--world", required=True, help="the shapes world whose held-out captions are probed")
    c.add_argument("--out", required=True, help="folder for probes.json and probes.png")
    c.add_argument("--split", default="test", choices=["val", "test"])
    c.add_argument("--seed", type=int, default=0, help="seed of the probe-train / probe-test split")
    c.set_defaults(func=_probes)

    c = an.add_parser(
        "minimal-pairs", help="LTD: does the caption score its image above one that differs in one attribute?"
    )
    c.add_argument("--checkpoint", required=True, help="checkpoint folder or run directory")
    c.add_argument("--world", required=True, help="the shapes world (its held-out scene captions)")
    c.add_argument("--out", required=True, help="folder for minimal_pairs.json and minimal_pairs.png")
    c.add_argument("--captions", type=int, default=200, help="scene captions (the first images of the split)")
    c.add_argument("--per-attribute", type=int, default=2, help="distractors per caption and attribute")
    c.add_argument("--split", default="test", choices=["val", "test"])
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(func=_minimal_pairs)


def _add_ltd_floor(an: Any) -> None:
    """``vlp analyze ltd-floor``."""
    c = an.add_parser("ltd-floor", help="LTD: the lowest L_rec reachable when an attribute is suppressed")
    c.add_argument("--targets", required=True, help="targets file (vlp make-targets)")
    c.add_argument("--data", required=True, nargs="+", help="the annotation file(s) the targets serve")
    c.add_argument("--out", required=True, help="folder for ltd_floor.json and ltd_floor.png")
    c.add_argument(
        "--attributes",
        nargs="+",
        help="attributes to hide, several joined by + (default: each attribute, size+cell+relation, caption)",
    )
    c.set_defaults(func=_ltd_floor)


def _add_analyze(sub: Any) -> None:
    """``vlp analyze cocos|helper|false-negatives|probes|minimal-pairs|ltd-floor``."""
    add_family(
        sub,
        "analyze",
        "analyses of a trained model",
        (_add_cocos, _add_helper, _add_false_negatives, _add_probes, _add_ltd_floor),
    )


def _add_plot(sub: Any) -> None:
    """``vlp plot losses|trajectories|retrieval|srcl-weights``."""
    s = sub.add_parser("plot", help="plots of a run")
    s.set_defaults(func=_plot)  # one handler, by `what`
    pl = s.add_subparsers(dest="what", required=True)
    c = pl.add_parser("losses", help="loss curves from RUN/metrics.jsonl")
    c.add_argument("run")
    c.add_argument("--out")
    c = pl.add_parser(
        "trajectories",
        help="alpha, temp (and ltd_lambda, ltd_violation, srcl_alpha_h when logged) from RUN/metrics.jsonl",
    )
    c.add_argument("run")
    c.add_argument("--out", help="default: RUN/trajectories.png")
    c = pl.add_parser(
        RETRIEVAL, help="the text->image example grid again, from an evaluation's retrieval_examples.json"
    )
    c.add_argument("dir", help="evaluation folder (--out of vlp evaluate retrieval) or run directory (its eval/)")
    c.add_argument(
        "--out",
        help="default: retrieval_examples.png next to the JSON; with --gradcam the output folder (default: the JSON's)",
    )
    c.add_argument(
        "--gradcam",
        action="store_true",
        help="also draw the caption's Grad-CAM over every retrieved image (retrieval_examples_gradcam.png) and "
        "per-word maps of each top-1 image (retrieval_examples_words/)",
    )
    c.add_argument("--checkpoint", help="with --gradcam: the model (default: the one metrics.json records)")
    c.add_argument("--layer", type=int, help="with --gradcam: fusion layer (default: the middle one)")
    c = pl.add_parser("srcl-weights", help="heatmap of one batch's SRCL weights + histogram over many batches")
    c.add_argument("run", help="run directory or checkpoint (its config names the helper features)")
    c.add_argument("--out", help="output folder (default: RUN/srcl_plots)")
    c.add_argument("--heatmap-size", type=int, default=10, help="batch size of the labelled heatmap")
    c.add_argument("--batches", type=int, default=50, help="training batches in the histogram")
    c.add_argument("--alpha-h", type=float, help="helper share (default: the schedule at the checkpoint's step)")
    c.add_argument("overrides", nargs="*", help="e.g. loss.srcl.delta=2 loss.srcl.helper_features=DIR")


#: This family's commands, each with the function that adds it to ``vlp``'s subparsers.
COMMANDS = {"analyze": _add_analyze, "plot": _add_plot}
