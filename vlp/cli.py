"""Command line: ``vlp pretrain [nlvr-ta] | finetune retrieval|vqa|nlvr2 | train-helper | cache-helper-features | make-targets | make-shards | analyze cocos |
evaluate retrieval | make-world | data check | demo | plot``.

Only parsing and dispatch: each command is one call into its family's module of :mod:`vlp.runs`
(or into a data, conversion or plotting tool), and prints what that call returns. Those modules are
imported inside the handlers, when their command runs: ``vlp --help`` and the data tools stay light.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from vlp.config import CONTRASTIVE_LOSSES, PretrainConfig, load_config, load_finetune_config
from vlp.data.check import CHECK_KINDS, CheckReport, check_annotations, check_shards, default_workers, is_shard_entry
from vlp.data.formats import write_json_atomic
from vlp.data.images import MAX_PIXELS
from vlp.dist import OtherRankDone, launch_rank, rank
from vlp.errors import CheckpointError, ConfigError, DataError, DownloadError
from vlp.train.loop import NonFiniteError
from vlp.train.preemption import Preempted

USER_ERRORS = (ConfigError, DataError, CheckpointError, DownloadError)


def _wrote(path: Any) -> None:
    print(f"wrote {path}")


def _pretrain(a: argparse.Namespace) -> None:
    from vlp.runs.pretrain import run_pretrain

    run_dir = run_pretrain(load_config(PretrainConfig, a.config, a.overrides))
    if rank() == 0:
        print(f"done: {run_dir}")


def _train_helper(a: argparse.Namespace) -> None:
    from vlp.runs.pretrain import run_train_helper

    print(f"done: {run_train_helper(load_config(PretrainConfig, a.config, a.overrides))}")


def _bench(a: argparse.Namespace) -> None:
    if a.loader_only:
        from vlp.runs.loader_bench import format_loader_bench, parse_size, run_loader_bench

        if a.count_ops:
            raise ConfigError("vlp bench: --loader-only and --count-ops are separate benchmarks: give one")
        if a.images and a.source_size:
            raise ConfigError("vlp bench --loader-only: --source-size applies to generated images, not to --images")
        cfg = load_config(PretrainConfig, a.config, a.overrides)
        size = parse_size(a.source_size) if a.source_size else (500, 375)
        loaded = run_loader_bench(cfg, a.images, a.n_images, a.workers, size, out=a.out)
        print(format_loader_bench(loaded))
        if a.out:
            _wrote(a.out)
        return
    from vlp.runs.bench import format_bench, format_count_ops, run_bench, run_count_ops

    if a.count_ops:
        counted = run_count_ops(load_config(PretrainConfig, a.config, a.overrides), a.warmup, a.out)
        if rank() == 0:
            print(format_count_ops(counted))
        return
    result = run_bench(load_config(PretrainConfig, a.config, a.overrides), a.steps, a.warmup, a.peak_tflops, a.out)
    if rank() == 0:
        print(format_bench(result))
        if a.out:
            _wrote(a.out)


def _finetune(a: argparse.Namespace) -> None:
    from vlp.runs.finetune import run_finetune

    print(json.dumps(run_finetune(load_finetune_config(a.task, a.config, a.overrides)), indent=2))


def _nlvr_ta(a: argparse.Namespace) -> None:
    from vlp.runs.finetune import run_finetune

    print(f"done: {run_finetune(load_finetune_config('nlvr-ta', a.config, a.overrides))['checkpoint']}")


def _cache_helper(a: argparse.Namespace) -> None:
    from vlp.runs.features import run_cache_helper_features, run_cache_oracle_features

    if (a.helper is None) == (a.oracle is None) or (a.oracle is not None) != (a.world is not None):
        raise ConfigError(
            "vlp cache-helper-features: give --helper CHECKPOINT (or open_clip:ARCH[/PRETRAINED]), "
            "or --oracle exact|graded with --world ROOT"
        )
    if a.oracle is not None:
        if a.oracle_auc is not None and a.oracle != "exact":
            raise ConfigError("vlp cache-helper-features: --oracle-auc corrupts the exact oracle (--oracle exact)")
        _wrote(
            run_cache_oracle_features(
                a.world, a.data, a.out, graded=a.oracle == "graded", auc=a.oracle_auc, seed=a.oracle_seed
            )
        )
    else:
        _wrote(run_cache_helper_features(a.helper, a.data, a.out, a.image_root, a.batch_size, a.num_workers))


def _make_targets(a: argparse.Namespace) -> None:
    from vlp.runs.features import run_make_targets

    _wrote(run_make_targets(a.data, a.encoder, a.out, a.batch_size))


def _evaluate_classification(a: argparse.Namespace) -> None:
    from vlp.runs.classify import run_evaluate_classification

    run_evaluate_classification(
        a.checkpoint,
        a.data,
        a.out,
        classes=a.classes,
        templates=a.templates,
        image_root=a.image_root,
        rerank_k=a.rerank_k,
        batch_size=a.batch_size,
    )
    _wrote(Path(a.out) / "metrics.json")


@contextmanager
def _naming_layer(layer: Optional[int]) -> Iterator[None]:
    """A plain ``ValueError`` from a Grad-CAM command (a ``--layer`` the model does not have) becomes
    a :class:`ConfigError` naming ``--layer``; the user errors (a missing image, a bad checkpoint)
    keep their own message."""
    try:
        yield
    except USER_ERRORS:
        raise
    except ValueError as e:
        raise ConfigError(f"--layer {layer}: {e}") from None


def _evaluate_grounding(a: argparse.Namespace) -> None:
    from vlp.runs.grounding import run_evaluate_grounding

    with _naming_layer(a.layer):
        run_evaluate_grounding(
            a.checkpoint,
            a.data,
            a.out,
            train=a.train,
            layer=a.layer,
            batch_size=a.batch_size,
            image_root=a.image_root,
            words_only=a.words_only,
        )
    _wrote(Path(a.out) / "metrics.json")


def _explain(a: argparse.Namespace) -> None:
    from vlp.runs.explain import run_explain

    with _naming_layer(a.layer):
        run_explain(a.checkpoint, a.image, a.text, a.out, layer=a.layer)
    _wrote(Path(a.out) / "explain.png")


def _zoo(a: argparse.Namespace) -> None:
    from vlp.interop.zoo import PRETRAINED, fetch, source_url

    if a.what == "list":
        for e in PRETRAINED.values():
            print(f"{e.tag:24s} {e.kind:10s} {e.image_size:4d} px  {source_url(e)}\n{'':24s} {e.about}")
        return
    print(fetch(a.tag, Path(a.cache) if a.cache else None))


def _evaluate_retrieval(a: argparse.Namespace) -> None:
    from vlp.runs.evaluate import run_evaluate_retrieval

    res = run_evaluate_retrieval(
        a.checkpoint,
        a.data,
        a.relevance,
        a.out,
        a.image_root,
        a.overrides,
        graded_relevance=a.graded_relevance,
        preset=a.preset,
        caption_groups=a.caption_groups,
    )
    if rank() == 0:  # launched as several processes (docs/evaluation.md): every rank has the same metrics
        print_metrics(res.metrics)
        _wrote(Path(a.out) / "metrics.json")


def _make_world(a: argparse.Namespace) -> None:
    from vlp.data.synthetic import generate_world

    templates = None
    if a.nlvr_templates:
        from vlp.data.synthetic import check_templates

        try:
            templates = check_templates([t.strip() for t in a.nlvr_templates.split(",") if t.strip()])
        except ValueError as e:
            raise ConfigError(f"--nlvr-templates {a.nlvr_templates!r}: {e}") from None
    paths = generate_world(
        a.out,
        seed=a.seed,
        n_train=a.images,
        n_val=a.val_images,
        n_test=a.test_images,
        image_size=a.image_size,
        nlvr_templates=templates,
        n_helper=a.helper_images,
    )
    for share in a.generic_share or []:
        from vlp.data.synthetic import write_generic_mix

        paths[f"generic_{share:g}"] = write_generic_mix(a.out, share, a.seed)
    for spec in a.caption_kinds or []:
        from vlp.data.synthetic import write_caption_mix

        try:
            kinds, repeats = _kind_spec(spec)
            mix = write_caption_mix(a.out, kinds, a.seed, repeats=repeats)
        except ValueError as e:
            raise ConfigError(f"--caption-kinds {spec!r}: {e}") from None
        paths[mix.path.stem.removeprefix("pretrain_")] = mix.path
        if mix.dropped:
            print(f"caption kinds {spec}: {len(mix.dropped)} images without such a caption left out")
    for k, p in paths.items():
        print(f"{k:22s} {p}")


def _kind_spec(spec: str) -> tuple[list[str], dict[str, int]]:
    """``scene:4,object,count`` -> (["scene", "object", "count"], {"scene": 4}); ``ValueError``
    names a repeat that is not a whole number."""
    kinds, repeats = [], {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        kind, _, times = part.partition(":")
        kinds.append(kind.strip())
        if times:
            if not times.strip().isdigit():
                raise ValueError(f"{part!r}: expected KIND or KIND:N with a whole number N >= 1")
            repeats[kind.strip()] = int(times)
    return kinds, repeats


def _demo(a: argparse.Namespace) -> None:
    from vlp.runs.demo import run_demo, run_demo_full

    if a.full:
        run_demo_full(
            a.out,
            seed=a.seed,
            n_train=a.images,
            stage_overrides=_stage_overrides(a.overrides),
            nlvr_ta=a.nlvr_ta,
            reuse=a.reuse,
        )
    else:
        run_demo(a.out, seed=a.seed, n_train=a.images, overrides=a.overrides)


def _stage_overrides(items: Sequence[str]) -> dict[str, list[str]]:
    """``vlp demo --full``'s ``STAGE:key=value`` overrides, by stage."""
    stages: dict[str, list[str]] = {}
    for item in items:
        name, _, override = item.partition(":")
        if not override:
            raise ConfigError(f"vlp demo --full override {item!r}: expected STAGE:key=value, e.g. vqa:train.epochs=1")
        stages.setdefault(name, []).append(override)
    return stages


def _run_metrics(run: str) -> Path:
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise DataError(f"{run}: no metrics.jsonl (expected a run directory)")
    return path


def _plot(a: argparse.Namespace) -> None:
    """``vlp plot losses|trajectories|retrieval`` (plots of a run's files, :mod:`vlp.viz`) and
    ``srcl-weights`` (an analysis of a checkpoint)."""
    if a.what == "srcl-weights":
        from vlp.runs.analyze import run_srcl_weight_plots

        for p in run_srcl_weight_plots(a.run, a.out, a.heatmap_size, a.batches, a.alpha_h, a.overrides).values():
            _wrote(p)
        return
    from vlp import viz

    if a.what == "losses":
        _wrote(viz.plot_losses(_run_metrics(a.run), a.out or Path(a.run) / "loss_curves.png"))
    elif a.what == "trajectories":
        _wrote(viz.plot_trajectories(_run_metrics(a.run), a.out or Path(a.run) / "trajectories.png"))
    elif not a.gradcam:
        _wrote(viz.replot_retrieval(a.dir, a.out))
    else:
        from vlp.runs.explain import run_retrieval_gradcam

        with _naming_layer(a.layer):
            written = run_retrieval_gradcam(a.dir, a.out, a.checkpoint, a.layer)
        for p in written:
            _wrote(p)


def _make_shards(a: argparse.Namespace) -> None:
    from vlp.data.shard_writer import write_shards

    _wrote(write_shards(a.data, a.out, a.image_root, a.size, a.max_per_shard, a.seed, a.quality, workers=a.workers))


def _cocos(a: argparse.Namespace) -> None:
    from vlp.runs.analyze import run_cocos

    rec = run_cocos(
        a.checkpoint, a.data, a.loss, a.out, a.threshold, a.batches, a.overrides, smoothap_inv_tau=a.smoothap_inv_tau
    )
    for k, v in rec["stats"].items():
        print(f"  {k:24s} {v['mean']:10.3f} +- {v['std']:.3f}")
    print(f"wrote {Path(a.out) / 'cocos.json'} and cocos.png")


def _helper_diagnostics(a: argparse.Namespace) -> None:
    if a.config is not None:  # the run's own helper cache, data, batch, queue and weight settings
        cfg = load_config(PretrainConfig, a.config, a.overrides)
        a.cache = a.cache or cfg.loss.srcl.helper_features
        a.data = a.data or list(cfg.data.train)
        a.image_root = a.image_root or cfg.data.image_root
        a.batch_size = a.batch_size or cfg.data.batch_size
        a.queue = cfg.model.queue_size if a.queue is None else a.queue
        a.mode, a.tau_w = a.mode or cfg.loss.srcl.norm, a.tau_w or cfg.loss.srcl.tau_w
    if not a.cache or not a.data:
        raise ConfigError("vlp analyze helper: give --cache and --data, or --config RUN.yaml naming them")
    a.batch_size, a.queue, a.mode, a.tau_w = a.batch_size or 64, a.queue or 0, a.mode or "softmax", a.tau_w or 1.0
    if a.world is None:
        _helper_calibration(a)
        return
    from vlp.runs.diagnostics import diagnostics_summary, run_helper_diagnostics

    if a.mode != "softmax":
        raise ConfigError("vlp analyze helper --world: the ground-truth report is for the softmax norm")
    r = run_helper_diagnostics(
        a.cache, a.world, a.data, a.out, a.batch_size, a.queue, a.batches, a.target_weight, a.delta, a.seed, a.tau_w
    )
    print(diagnostics_summary(r))
    _wrote(Path(a.out) / "helper_diagnostics.json")


def _helper_calibration(a: argparse.Namespace) -> None:
    from vlp.runs.calibration import calibration_summary, run_helper_calibration

    r = run_helper_calibration(
        a.cache, a.data, a.out, a.batch_size, a.queue, a.batches, a.target_weight, a.delta, a.mode, a.seed, a.tau_w,
        a.image_root,
    )  # fmt: skip
    print(calibration_summary(r))
    _wrote(Path(a.out) / "helper_diagnostics.json")


def _false_negatives(a: argparse.Namespace) -> None:
    from vlp.data.synthetic import false_negative_share

    rows = []
    for q in a.queue:
        try:
            r = false_negative_share(a.data, a.world, a.batch_size, q, a.batches, a.seed)
        except ValueError as e:
            raise DataError(str(e)) from None
        rows.append(r)
        print(
            f"batch {a.batch_size:4d} queue {q:6d}: {100 * r['in_batch_share']:5.1f}% of in-batch negatives are false "
            f"({r['in_batch_per_anchor']:.1f} per anchor); with the queue i2t {100 * r['i2t_share']:.1f}% / t2i "
            f"{100 * r['t2i_share']:.1f}% ({r['i2t_per_anchor']:.1f} / {r['t2i_per_anchor']:.1f} per anchor)"
        )
    if a.out:
        write_json_atomic(Path(a.out), rows, indent=1)
        _wrote(a.out)


def _probes(a: argparse.Namespace) -> None:
    from vlp.runs.probes import run_probes

    r = run_probes(a.checkpoint, a.world, a.out, a.split, seed=a.seed)
    for name, v in r["attributes"].items():
        if "accuracy" in v:
            print(
                f"  {name:10s} probe accuracy {100 * v['accuracy']:5.1f}%  (majority class {100 * v['majority']:5.1f}%)"
            )
        else:
            print(f"  {name:10s} {v.get('skipped', 'not probed')}")
    _wrote(Path(a.out) / "probes.json")


def _minimal_pairs(a: argparse.Namespace) -> None:
    from vlp.runs.probes import run_minimal_pairs

    r = run_minimal_pairs(a.checkpoint, a.world, a.out, a.captions, a.per_attribute, a.split, seed=a.seed)
    for name, v in r["attributes"].items():
        if "accuracy" in v:
            print(f"  {name:10s} minimal-pair accuracy {100 * v['accuracy']:5.1f}%  ({v['n_pairs']} pairs; chance 50%)")
    _wrote(Path(a.out) / "minimal_pairs.json")


def _ltd_floor(a: argparse.Namespace) -> None:
    from vlp.runs.probes import FLOOR_ATTRIBUTES, run_ltd_floor

    run_ltd_floor(a.targets, a.data, a.out, a.attributes or FLOOR_ATTRIBUTES)
    _wrote(Path(a.out) / "ltd_floor.json")


def _convert_albef(a: argparse.Namespace) -> None:
    from vlp.interop.albef import convert_albef_file

    report = convert_albef_file(a.src, a.out, a.kind, a.image_size, a.allow_unexpected or (), a.config)
    print(report.summary())
    print(f"wrote {a.out} (key report: {Path(a.out) / 'key_report.json'})")


def _convert_to_albef(a: argparse.Namespace) -> None:
    from vlp.interop.albef import export_albef_checkpoint

    print(export_albef_checkpoint(a.checkpoint, a.out).summary())
    _wrote(a.out)


def _data_check(a: argparse.Namespace) -> int:
    """``vlp data check``: print every problem and a summary; exit status 1 when there are errors."""
    if a.max_pixels < 0:
        raise ConfigError(f"--max-pixels must be >= 0 (0: no limit), got {a.max_pixels}")
    if a.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {a.workers}")
    shards = [f for f in a.files if is_shard_entry(f)]
    files = [f for f in a.files if f not in shards]
    report = CheckReport()
    if files:
        report = check_annotations(
            files,
            image_root=a.images,
            images=not a.no_images,
            max_pixels=a.max_pixels,
            kind=a.kind,
            workers=a.workers,
            show_progress=True,
        )
    if shards:  # shard folders (vlp's or img2dataset's) or brace patterns of tars
        found = check_shards(
            shards, images=not a.no_images, max_pixels=a.max_pixels, caption_key=a.caption_key, show_progress=True
        )
        report.files += found.files
        report.problems += found.problems
        if found.images_checked is not None:
            report.images_checked = (report.images_checked or 0) + found.images_checked
    print("\n".join(report.lines()))
    if a.json:
        write_json_atomic(Path(a.json), report.to_json(), indent=2)
        _wrote(a.json)
    return 0 if report.ok else 1


def print_metrics(m: dict[str, float]) -> None:
    for k, v in m.items():
        print(f"  {k:18s} {v:8.2f}")


def add_resume(s: argparse.ArgumentParser) -> None:
    """``--resume auto|CHECKPOINT`` of the training commands: the same as the override ``train.resume=...``."""
    s.add_argument(
        "--resume",
        metavar="auto|CHECKPOINT",
        help="continue a run: 'auto' = the newest valid checkpoint of its output_dir, or a checkpoint folder "
        "(= train.resume=...; docs/training.md, Runs that survive)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vlp", description="ALBEF-style vision-language pretraining.")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (
        _add_training,
        _add_features,
        _add_data_tools,
        _add_analyze,
        _add_evaluate,
        _add_make_world,
        _add_bench,
        _add_demo,
        _add_convert,
        _add_explain,
        _add_zoo,
        _add_plot,
    ):  # in this order in `vlp --help`
        add(sub)
    return p


def _add_config_command(
    sub: Any, name: str, text: str, example: str, overrides: str, func: Any
) -> argparse.ArgumentParser:
    """A training command: ``--config`` YAML, dotted overrides and ``--resume``."""
    s = sub.add_parser(name, help=text)
    s.add_argument("--config", required=True, help=f"YAML config (e.g. {example})")
    s.add_argument("overrides", nargs="*", help=f"dotted overrides, e.g. {overrides}")
    add_resume(s)
    s.set_defaults(func=func)
    return s


def _add_training(sub: Any) -> None:
    """``vlp pretrain``, ``pretrain nlvr-ta``, ``finetune retrieval|vqa|nlvr2``, ``train-helper``."""
    _add_config_command(
        sub,
        "pretrain",
        "pretrain ITC + ITM + MLM",
        "configs/pretrain/shapes_tiny.yaml",
        "train.steps=50 model.vision.depth=2",
        _pretrain,
    )
    # `vlp pretrain nlvr-ta ...` is rewritten to this command in main()
    _add_config_command(
        sub,
        "pretrain-nlvr-ta",
        "= `vlp pretrain nlvr-ta`: text-assignment pre-training of the doubled NLVR2 fusion layers",
        "configs/finetune/shapes_nlvr_ta.yaml",
        "train.epochs=1",
        _nlvr_ta,
    )
    s = sub.add_parser("finetune", help="fine-tune a pretrained checkpoint on a downstream task")
    ft = s.add_subparsers(dest="task", required=True)
    for task, text in (
        ("retrieval", "image-text retrieval (ITC by image id + ITM), COCO / Flickr30k Karpathy files"),
        ("vqa", "VQA v2 (+ VG-QA): answer decoder, ranked candidate answers"),
        ("nlvr2", "NLVR2: a sentence about two images, doubled fusion layers"),
        ("ve", "SNLI-VE: image premise + hypothesis -> entailment / neutral / contradiction"),
        ("grounding", "weakly supervised grounding: ITC + ITM on referring expressions, validated by Grad-CAM boxes"),
    ):
        _add_config_command(
            ft, task, text, f"configs/finetune/shapes_{task}.yaml", "pretrained=runs/pretrain train.epochs=1", _finetune
        )
    _add_config_command(
        sub,
        "train-helper",
        "train the frozen SRCL helper (ITC-only InfoNCE on clean captions)",
        "configs/helper/shapes_tiny.yaml",
        "train.steps=50",
        _train_helper,
    )


def _add_features(sub: Any) -> None:
    """``vlp cache-helper-features`` (SRCL) and ``make-targets`` (LTD)."""
    s = sub.add_parser("cache-helper-features", help="compute the SRCL helper's features of a dataset once")
    s.add_argument(
        "--helper",
        help="helper checkpoint folder or run directory, or a frozen open_clip model open_clip:ARCH[/PRETRAINED] "
        "(ARCH: an open_clip model name or a model-config .json file; PRETRAINED: an open_clip tag or a weights file)",
    )
    s.add_argument(
        "--oracle",
        choices=["exact", "graded"],
        help="instead of a helper: the shapes world's ground-truth relevance as the helper similarity (needs --world)",
    )
    s.add_argument("--world", help="with --oracle: the shapes world (vlp make-world) the data files belong to")
    s.add_argument(
        "--oracle-auc",
        type=float,
        help="with --oracle exact: corrupt the truth by fixed per-pair noise to a helper of this ROC-AUC (0.5-1)",
    )
    s.add_argument("--oracle-seed", type=int, default=0, help="seed of the --oracle-auc noise")
    s.add_argument("--data", required=True, nargs="+", help="pretraining annotation file(s)")
    s.add_argument("--out", required=True, help="cache folder to create (loss.srcl.helper_features)")
    s.add_argument("--image-root", help="folder for relative image paths (default: each file's folder)")
    s.add_argument("--batch-size", type=int, default=256)
    s.add_argument("--num-workers", type=int, default=0)
    s.set_defaults(func=_cache_helper)

    s = sub.add_parser("make-targets", help="embed every caption once with a sentence encoder (LTD targets)")
    s.add_argument("--data", required=True, nargs="+", help="annotation file(s) (pretraining or retrieval-train)")
    s.add_argument(
        "--encoder",
        default="all-MiniLM-L6-v2",
        help="sentence-transformers name or local path (default: the offline all-MiniLM-L6-v2)",
    )
    s.add_argument("--out", required=True, help="targets file to create (loss.ltd.targets)")
    s.add_argument("--batch-size", type=int, default=256)
    s.set_defaults(func=_make_targets)


def _add_data_tools(sub: Any) -> None:
    """``vlp make-shards``, ``data check``, ``prepare DATASET``."""
    s = sub.add_parser(
        "make-shards", help="write annotation files + images as webdataset tar shards (data.format=webdataset)"
    )
    s.add_argument("--data", required=True, nargs="+", help="pretraining / retrieval-train annotation file(s)")
    s.add_argument("--out", required=True, help="shard folder to create (shard-NNNNN.tar + sizes.json)")
    s.add_argument("--image-root", help="folder for relative image paths (default: each file's folder)")
    s.add_argument("--size", type=int, default=256, help="shorter image side after resizing (never upscaled)")
    s.add_argument("--max-per-shard", type=int, default=5000, help="images per shard")
    s.add_argument("--seed", type=int, default=0, help="seed of the global shuffle before writing")
    s.add_argument("--quality", type=int, default=90, help="JPEG quality")
    s.add_argument("--workers", type=int, default=0, help="processes that resize and encode (0: this one)")
    s.set_defaults(func=_make_shards)

    s = sub.add_parser("data", help="annotation data tools")
    dt = s.add_subparsers(dest="what", required=True)
    c = dt.add_parser(
        "check",
        help="check annotation files and their images, reporting every problem (exit status 1 when there are errors)",
    )
    c.add_argument(
        "files",
        nargs="+",
        metavar="ANN_JSON|SHARDS",
        help="annotation file(s), shard folder(s) (vlp's or img2dataset's) or brace patterns of tars",
    )
    g = c.add_mutually_exclusive_group()
    g.add_argument("--images", metavar="ROOT", help="folder for relative image paths (default: each file's folder)")
    g.add_argument("--no-images", action="store_true", help="check the annotations only, open no image")
    c.add_argument(
        "--kind",
        default="auto",
        choices=CHECK_KINDS,
        help="annotation format (default auto: nlvr / vqa / pairs from the entries' keys)",
    )
    c.add_argument(
        "--max-pixels",
        type=int,
        default=MAX_PIXELS,
        metavar="N",
        help="refuse images with more pixels (data.max_image_pixels; 0: no limit)",
    )
    c.add_argument("--workers", type=int, default=default_workers(), metavar="N", help="threads opening images")
    c.add_argument(
        "--caption-key", default="caption", metavar="KEY", help="img2dataset shards: the caption's key in {key}.json"
    )
    c.add_argument("--json", metavar="OUT", help="also write the report as JSON here")
    c.set_defaults(func=_data_check)

    from vlp.data.prepare import add_prepare_parser  # vlp prepare coco|flickr30k|cc3m|sbu|vg|vqa|vqa-answers|nlvr2

    add_prepare_parser(sub)


def _add_analyze(sub: Any) -> None:
    """``vlp analyze cocos|helper|false-negatives|probes|minimal-pairs|ltd-floor``."""
    s = sub.add_parser("analyze", help="analyses of a trained model")
    an = s.add_subparsers(dest="what", required=True)
    c = an.add_parser("cocos", help="count candidates contributing to each query's gradient (COCOS)")
    c.add_argument("--checkpoint", required=True, help="checkpoint folder or run directory")
    c.add_argument("--data", required=True, nargs="+", help="training annotation file(s)")
    c.add_argument("--loss", required=True, choices=CONTRASTIVE_LOSSES)
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
    c.add_argument("overrides", nargs="*", help="with --config: dotted overrides, e.g. data.batch_size=32")
    c.set_defaults(func=_helper_diagnostics)

    c = an.add_parser("false-negatives", help="share of true false negatives among a training batch's negatives")
    c.add_argument("--world", required=True, help="the shapes world the data file belongs to")
    c.add_argument("--data", required=True, help="pretraining annotation file over the world's images")
    c.add_argument("--batch-size", type=int, default=64)
    c.add_argument("--queue", type=int, nargs="+", default=[0], help="queue sizes to measure")
    c.add_argument("--batches", type=int, default=50)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", help="also write the measurements as JSON here")
    c.set_defaults(func=_false_negatives)

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


def _add_evaluate(sub: Any) -> None:
    """``vlp evaluate retrieval``."""
    s = sub.add_parser("evaluate", help="evaluate a checkpoint")
    ev = s.add_subparsers(dest="what", required=True)
    r = ev.add_parser("retrieval", help="zero-shot image-text retrieval (ITC + top-k ITM re-rank)")
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
    r.add_argument(
        "overrides",
        nargs="*",
        help="e.g. eval.k_test=32 eval.score=itm+itc eval.precision=bf16 eval.itm_batch_size=256",
    )
    r.set_defaults(func=_evaluate_retrieval)
    c = ev.add_parser(
        "classification",
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
    c = ev.add_parser(
        "grounding",
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


def _add_make_world(sub: Any) -> None:
    """``vlp make-world``."""
    s = sub.add_parser("make-world", help="write the synthetic shapes world")
    s.add_argument("--out", required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--images", type=int, default=4000, help="training images")
    s.add_argument("--val-images", type=int, default=200)
    s.add_argument("--test-images", type=int, default=1000)
    s.add_argument("--image-size", type=int, default=64)
    s.add_argument(
        "--nlvr-templates",
        default=None,
        help="comma-separated NLVR statement templates (default: all of more, contains, exactly, both, "
        "one_image, neither, total, same)",
    )
    s.add_argument(
        "--generic-share",
        type=float,
        action="append",
        help="also write pretrain_generic_<share>.json: this share of images captioned only generically (repeatable)",
    )
    s.add_argument(
        "--caption-kinds",
        action="append",
        metavar="KINDS",
        help="also write pretrain_kinds_<kinds>.json: every image keeps only its captions of these comma-separated "
        "kinds (scene, object, relation, count), e.g. object,count; KIND:N lists that kind's captions N times, "
        "so it is drawn N times as often, e.g. scene:4,object,relation,count (repeatable)",
    )
    s.add_argument(
        "--helper-images",
        type=int,
        default=0,
        help="also write helper_split.json: this many further images, disjoint from every split, with every "
        "caption kind (an SRCL helper's training data)",
    )
    s.set_defaults(func=_make_world)


def _add_bench(sub: Any) -> None:
    """``vlp bench``."""
    s = sub.add_parser(
        "bench", help="time pretraining steps of a config: pairs/s, ms per phase, peak memory, FLOP per pair, MFU"
    )
    s.add_argument("--config", required=True, help="pretraining YAML (its data.train is read)")
    s.add_argument("--steps", type=int, default=20, help="timed steps")
    s.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    s.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="device peak per process for MFU, e.g. 989 (H100 SXM dense bf16)",
    )
    s.add_argument(
        "--count-ops",
        action="store_true",
        help="count one training step after the warm-up at the dispatcher instead of timing: kernel-launching "
        "ops, casts, device syncs, module calls per forward (the CPU proxies of GPU host time)",
    )
    s.add_argument(
        "--loader-only",
        action="store_true",
        help="time the training image pipeline instead (open, decode, training transform) in loader "
        "workers: images/s per worker, full and JPEG draft-mode decoding; data.train is not read",
    )
    s.add_argument(
        "--images",
        nargs="+",
        default=None,
        metavar="PATH",
        help="--loader-only: image files or folders of .jpg/.jpeg/.png (default: generated photo-like JPEGs)",
    )
    s.add_argument("--workers", type=int, default=1, help="--loader-only: loader worker processes (0: in-process)")
    s.add_argument(
        "--n-images",
        type=int,
        default=None,
        help="--loader-only: images to generate (default 200), or the first N of --images (default all)",
    )
    s.add_argument(
        "--source-size", default=None, metavar="WxH", help="--loader-only: generated images' size (default 500x375)"
    )
    s.add_argument("--out", default=None, help="also write the result as JSON here")
    s.add_argument("overrides", nargs="*", help="config overrides, e.g. data.batch_size=64")
    s.set_defaults(func=_bench)


def _add_demo(sub: Any) -> None:
    """``vlp demo [--full]``."""
    s = sub.add_parser("demo", help="world -> pretrain tiny model -> zero-shot retrieval, on CPU")
    s.add_argument("--out", default="demo_out")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--images", type=int, default=4000, help="training images")
    s.add_argument(
        "--full",
        action="store_true",
        help="pretrain -> fine-tune retrieval, VQA, NLVR2 -> one table (`make demo-full`)",
    )
    s.add_argument("--nlvr-ta", action="store_true", help="with --full: run NLVR2 text-assignment pre-training first")
    s.add_argument("--reuse", action="store_true", help="with --full: keep the stages an interrupted run finished")
    s.add_argument(
        "overrides",
        nargs="*",
        help="config overrides, e.g. train.steps=100; with --full prefixed by the "
        "stage: pretrain:train.steps=100 vqa:train.epochs=1 (stages: pretrain zero_shot retrieval vqa nlvr_ta nlvr2 "
        "nlvr2_text_only ve ve_hypothesis_only grounding)",
    )
    s.set_defaults(func=_demo)


def _add_convert(sub: Any) -> None:
    """``vlp convert albef|to-albef``."""
    s = sub.add_parser("convert", help="official ALBEF checkpoints <-> vlp checkpoint folders")
    cv = s.add_subparsers(dest="what", required=True)
    c = cv.add_parser(
        "albef", help="an ALBEF .pth (pretrain, retrieval, VQA or NLVR2 format) -> a vlp checkpoint folder"
    )
    c.add_argument("src", help="ALBEF weights ({model: state_dict} or a bare state dict; read as tensors only)")
    c.add_argument("out", help="checkpoint folder to write (model.safetensors, state.json, key_report.json)")
    c.add_argument("--kind", default="auto", choices=["auto", "pretrain", "retrieval", "vqa", "nlvr", "ve"])
    c.add_argument("--image-size", type=int, help="interpolate the position embedding to this resolution")
    c.add_argument("--allow-unexpected", nargs="+", metavar="PATTERN", help="fnmatch patterns of ALBEF keys to drop")
    c.add_argument("--config", help="model YAML (ModelConfig keys, e.g. text.heads) for what shapes do not tell")
    c.set_defaults(func=_convert_albef)
    c = cv.add_parser("to-albef", help="a vlp checkpoint -> an ALBEF .pth ({model: state_dict}) of its task's format")
    c.add_argument("checkpoint", help="vlp checkpoint folder or run directory")
    c.add_argument("out", help="the .pth file to write")
    c.set_defaults(func=_convert_to_albef)


def _add_explain(sub: Any) -> None:
    """``vlp explain``."""
    s = sub.add_parser("explain", help="per-word Grad-CAM heat maps of one image and text (one PNG grid)")
    s.add_argument("--checkpoint", required=True, help="checkpoint folder or run directory (with a fusion encoder)")
    s.add_argument("--image", required=True)
    s.add_argument("--text", required=True)
    s.add_argument("--layer", type=int, help="fusion layer (default: the middle one)")
    s.add_argument("--out", required=True, help="output folder: explain.png, explain.json")
    s.set_defaults(func=_explain)


def _add_zoo(sub: Any) -> None:
    """``vlp zoo list|fetch``."""
    s = sub.add_parser("zoo", help="the released ALBEF checkpoints by name: list, download + convert")
    z = s.add_subparsers(dest="what", required=True)
    z.add_parser("list", help="every tag VLPModel.from_pretrained accepts, with its kind, size and URL")
    c = z.add_parser("fetch", help="download (progress bar), convert and cache a tag; prints the checkpoint folder")
    c.add_argument("tag")
    c.add_argument("--cache", help="cache folder (default: $VLP_CACHE or ~/.cache/vlp)")
    s.set_defaults(func=_zoo)


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
        "retrieval", help="the text->image example grid again, from an evaluation's retrieval_examples.json"
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["pretrain", "nlvr-ta"]:
        argv = ["pretrain-nlvr-ta", *argv[2:]]
    args = build_parser().parse_args(argv)
    if getattr(args, "resume", None):
        args.overrides = [*args.overrides, f"train.resume={args.resume}"]
    if args.command not in MULTI_PROCESS and launch_rank()[0] != 0:
        return 0  # launched as several processes: this command's files are made by rank 0 alone
    try:
        status = args.func(args)  # None, or an exit status (data check: 1 when it found errors)
    except OtherRankDone:
        return 0
    except Preempted as e:
        if launch_rank()[0] == 0:
            print(f"vlp: {e}", file=sys.stderr)
        return 0
    except USER_ERRORS as e:
        print(f"vlp: error: {e}", file=sys.stderr)
        return 2
    except NonFiniteError as e:  # the run's own numbers, not its input: status 1
        print(f"vlp: error: {e}", file=sys.stderr)
        return 1
    return status or 0


#: Commands that split their work over the processes of a launch (torchrun, accelerate launch);
#: the others (make-world, make-shards, make-targets, cache-helper-features, analyze, plot, demo)
#: run on rank 0 only.
MULTI_PROCESS = frozenset({"pretrain", "pretrain-nlvr-ta", "train-helper", "finetune", "evaluate", "bench"})


if __name__ == "__main__":
    sys.exit(main())
