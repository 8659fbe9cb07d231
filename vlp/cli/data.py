"""The data commands: ``vlp cache-helper-features`` (SRCL) and ``make-targets`` (LTD), ``make-shards``
and ``data check`` (``prepare DATASET``: :mod:`vlp.cli.prepare`; ``make-world``: :mod:`vlp.cli.world`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vlp.cli.common import call, wrote
from vlp.config.loss import HELPER_INITS
from vlp.data.check import CHECK_KINDS, default_workers
from vlp.errors import ConfigError, DataError
from vlp.preprocess.images import MAX_PIXELS
from vlp.remote.url_credentials import refusal

CAPTION_KEY_HELP = "img2dataset shards: the caption's key in {key}.json (data.caption_key; default caption)"


#: ``vlp cache-helper-features``' options of ``--oracle`` (read by the handler, not by the helper's run).
_ORACLE_OPTIONS = ("oracle", "world", "oracle_auc", "oracle_seed")


def _cache_helper(a: argparse.Namespace) -> None:
    from vlp.data.shard_samples import is_shard_data
    from vlp.lab.oracle import run_cache_oracle_features
    from vlp.runs.training.features import run_cache_helper_features

    if (a.helper is None) == (a.oracle is None) or (a.oracle is not None) != (a.world is not None):
        raise ConfigError(
            "vlp cache-helper-features: give --helper CHECKPOINT (or open_clip:ARCH/PRETRAINED), "
            "or --oracle exact|graded with --world ROOT"
        )
    if a.oracle is not None:
        if a.helper_init is not None:
            raise ConfigError("vlp cache-helper-features: --helper-init is for --helper (an oracle has no weights)")
        if any(is_shard_data(d) for d in a.data):
            raise ConfigError("vlp cache-helper-features: --oracle reads the world's annotation files, not shards")
        if a.oracle_auc is not None and a.oracle != "exact":
            raise ConfigError("vlp cache-helper-features: --oracle-auc corrupts the exact oracle (--oracle exact)")
        wrote(
            run_cache_oracle_features(
                a.world, a.data, a.out, graded=a.oracle == "graded", auc=a.oracle_auc, seed=a.oracle_seed
            )
        )
    else:
        wrote(call(run_cache_helper_features, a, used=_ORACLE_OPTIONS))


def _make_targets(a: argparse.Namespace) -> None:
    from vlp.runs.training.features import run_make_targets

    wrote(call(run_make_targets, a))


def _make_shards(a: argparse.Namespace) -> None:
    from vlp.data.shard_writer import write_shards

    wrote(call(write_shards, a, used=("data", "out"), files=a.data, out_dir=a.out))


def _data_check(a: argparse.Namespace) -> int:
    """``vlp data check``: print every problem and a summary; exit status 1 when there are errors."""
    from vlp.data.check import CheckReport, check_annotations, check_shards, is_shard_entry
    from vlp.data.formats import write_json_atomic

    if a.max_pixels < 0:
        raise ConfigError(f"--max-pixels must be >= 0 (0: no limit), got {a.max_pixels}")
    if a.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {a.workers}")
    refused = next((r for r in (refusal(str(f), "vlp data check argument") for f in a.files) if r), None)
    if refused:  # before a report names the argument as it was given
        raise DataError(refused)
    shards = [f for f in a.files if is_shard_entry(f)]
    files = [f for f in a.files if f not in shards]
    if a.sample is not None and (a.sample < 1 or not shards):
        raise ConfigError(
            f"--sample N checks N >= 1 shards of shard folders or URL entries, got {a.sample} for {a.files}"
        )
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
            shards,
            images=not a.no_images,
            max_pixels=a.max_pixels,
            caption_key=a.caption_key,
            show_progress=True,
            sample=a.sample,
            seed=a.seed,
        )
        report.sampled = found.sampled
        report.files += found.files
        report.problems += found.problems
        if found.images_checked is not None:
            report.images_checked = (report.images_checked or 0) + found.images_checked
    print("\n".join(report.lines()))
    if a.json:
        write_json_atomic(Path(a.json), report.to_json(), indent=2)
        wrote(a.json)
    return 0 if report.ok else 1


def _add_cache_helper(sub: Any) -> None:
    """``vlp cache-helper-features`` (SRCL)."""
    s = sub.add_parser("cache-helper-features", help="compute the SRCL helper's features of a dataset once")
    s.add_argument(
        "--helper",
        help="helper checkpoint folder or run directory, or a frozen open_clip model open_clip:ARCH/PRETRAINED "
        "(ARCH: an open_clip model name or a model-config .json file; PRETRAINED: an open_clip tag or a local "
        "weights file)",
    )
    s.add_argument(
        "--helper-init",
        choices=HELPER_INITS,
        help="pretrained (default): the helper's weights are required; random: an open_clip:ARCH without weights, "
        "randomly initialised (tests; recorded in index.json)",
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
    s.add_argument(
        "--data",
        required=True,
        nargs="+",
        help="pretraining annotation file(s), shard folder(s) (vlp's or img2dataset's), brace patterns of tars or "
        "URL shard entries (s3://, gs://, http(s)://, pipe:), as data.train names them",
    )
    s.add_argument("--out", required=True, help="cache folder to create (loss.srcl.helper_features)")
    s.add_argument("--image-root", help="folder for relative image paths (default: each file's folder)")
    s.add_argument("--batch-size", type=int, default=256)
    s.add_argument("--num-workers", type=int, default=0)
    s.add_argument("--caption-key", metavar="KEY", help=CAPTION_KEY_HELP)
    s.set_defaults(func=_cache_helper)


def _add_make_targets(sub: Any) -> None:
    """``vlp make-targets`` (LTD)."""
    s = sub.add_parser("make-targets", help="embed every caption once with a sentence encoder (LTD targets)")
    s.add_argument(
        "--data",
        required=True,
        nargs="+",
        help="annotation file(s) (pretraining or retrieval-train), shard folder(s), brace patterns of tars or URL "
        "shard entries (s3://, gs://, http(s)://, pipe:), as data.train names them",
    )
    s.add_argument(
        "--encoder",
        default="all-MiniLM-L6-v2",
        help="sentence-transformers name or local path (default: the offline all-MiniLM-L6-v2)",
    )
    s.add_argument("--out", required=True, help="targets file to create (loss.ltd.targets)")
    s.add_argument("--batch-size", type=int, default=256)
    s.add_argument("--caption-key", metavar="KEY", help=CAPTION_KEY_HELP)
    s.set_defaults(func=_make_targets)


def _add_make_shards(sub: Any) -> None:
    """``vlp make-shards``."""
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


def _add_data(sub: Any) -> None:
    """``vlp data check`` and ``vlp data index``."""
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
        help="annotation file(s), shard folder(s) (vlp's or img2dataset's), brace patterns of tars, or URL "
        "entries as in data.train (s3://, gs://, http(s)://, pipe:; no stats or index needed)",
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
    c.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="check N shards drawn at random from all the shard entries' (default: every shard)",
    )
    c.add_argument("--seed", type=int, default=0, help="seed of the --sample draw (printed in the summary)")
    c.add_argument("--json", metavar="OUT", help="also write the report as JSON here")
    c.set_defaults(func=_data_check)
    x = dt.add_parser(
        "index",
        help="count the samples of URL shard sets without _stats.json once (streamed), for data.train to start fast",
    )
    x.add_argument(
        "entries", nargs="+", metavar="URL", help="data.train entries: s3://, gs://, http(s):// or pipe: brace patterns"
    )
    x.add_argument(
        "--caption-key", default="caption", metavar="KEY", help="img2dataset shards: the caption's key in {key}.json"
    )
    x.set_defaults(func=_data_index)


def _data_index(a: argparse.Namespace) -> int:
    """``vlp data index``: count each entry's shards and keep the counts where runs find them."""
    from vlp.data.shard_format import index_entry

    for entry in a.entries:
        f, counts = index_entry(entry, a.caption_key)
        print(f"{entry}: {len(counts)} shards, {sum(counts)} samples; index {f}")
    return 0


#: This family's commands, each with the function that adds it to ``vlp``'s subparsers.
COMMANDS = {
    "cache-helper-features": _add_cache_helper,
    "make-targets": _add_make_targets,
    "make-shards": _add_make_shards,
    "data": _add_data,
}
