"""The checkpoint commands: ``vlp convert albef|to-albef`` (official ALBEF checkpoints <-> vlp
checkpoint folders, :mod:`vlp.interop.albef`) and ``vlp zoo list|fetch`` (the released ALBEF
checkpoints by name, :mod:`vlp.interop.zoo`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vlp.cli.common import call, wrote
from vlp.kinds import albef_formats


def _convert_albef(a: argparse.Namespace) -> None:
    from vlp.interop.albef import convert_albef_file

    print(call(convert_albef_file, a, used=("out",), out_dir=a.out).summary())
    print(f"wrote {a.out} (key report: {Path(a.out) / 'key_report.json'})")


def _convert_to_albef(a: argparse.Namespace) -> None:
    from vlp.interop.albef import export_albef_checkpoint

    print(export_albef_checkpoint(a.checkpoint, a.out).summary())
    wrote(a.out)


def _zoo(a: argparse.Namespace) -> None:
    from vlp.interop.zoo import fetch, format_pretrained

    if a.what == "list":
        print(format_pretrained())
        return
    print(fetch(a.tag, Path(a.cache) if a.cache else None))


def _add_convert(sub: Any) -> None:
    """``vlp convert albef|to-albef``."""
    s = sub.add_parser("convert", help="official ALBEF checkpoints <-> vlp checkpoint folders")
    cv = s.add_subparsers(dest="what", required=True)
    c = cv.add_parser(
        "albef", help="an ALBEF .pth (pretrain, retrieval, VQA or NLVR2 format) -> a vlp checkpoint folder"
    )
    c.add_argument("src", help="ALBEF weights ({model: state_dict} or a bare state dict; read as tensors only)")
    c.add_argument("out", help="checkpoint folder to write (model.safetensors, state.json, key_report.json)")
    c.add_argument("--kind", default="auto", choices=["auto", *albef_formats()])
    c.add_argument("--image-size", type=int, help="interpolate the position embedding to this resolution")
    c.add_argument("--allow-unexpected", nargs="+", metavar="PATTERN", help="fnmatch patterns of ALBEF keys to drop")
    c.add_argument("--config", help="model YAML (ModelConfig keys, e.g. text.heads) for what shapes do not tell")
    c.set_defaults(func=_convert_albef)
    c = cv.add_parser("to-albef", help="a vlp checkpoint -> an ALBEF .pth ({model: state_dict}) of its kind's format")
    c.add_argument("checkpoint", help="vlp checkpoint folder or run directory")
    c.add_argument("out", help="the .pth file to write")
    c.set_defaults(func=_convert_to_albef)


def _add_zoo(sub: Any) -> None:
    """``vlp zoo list|fetch``."""
    s = sub.add_parser("zoo", help="the released ALBEF checkpoints by name: list, download + convert")
    z = s.add_subparsers(dest="what", required=True)
    z.add_parser("list", help="every tag VLPModel.from_pretrained accepts, with its kind, size and URL")
    c = z.add_parser("fetch", help="download (progress bar), convert and cache a tag; prints the checkpoint folder")
    c.add_argument("tag")
    c.add_argument("--cache", help="cache folder (default: $VLP_CACHE or ~/.cache/vlp)")
    s.set_defaults(func=_zoo)


#: This family's commands, each with the function that adds it to ``vlp``'s subparsers.
COMMANDS = {"convert": _add_convert, "zoo": _add_zoo}
