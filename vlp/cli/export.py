"""``vlp export onnx RUN --out DIR``: a model's image and text towers as ONNX graphs
(:mod:`vlp.export.onnx`), with ``export.json`` and the tokenizer, for onnxruntime."""

from __future__ import annotations

import argparse
from typing import Any

from vlp.cli.common import add_family, call, wrote


def _export_onnx(a: argparse.Namespace) -> None:
    from vlp.export.onnx import export_onnx, summary

    print(summary(call(export_onnx, a)))
    wrote(a.out)


def _add_onnx(family: Any) -> None:
    """``vlp export onnx``."""
    c = family.add_parser(
        "onnx",
        help="image_encoder.onnx and text_encoder.onnx (normalised ITC features), export.json, tokenizer/",
    )
    c.add_argument(
        "run", help="run directory, checkpoint folder, save_pretrained folder, zoo tag or Hub id (ITC kinds, ALBEF)"
    )
    c.add_argument("--out", required=True, help="folder to write (absent or empty, unless --overwrite)")
    c.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier export's files in a non-empty --out (other files are left alone)",
    )
    c.add_argument("--opset", type=int, help="ONNX opset (default 17)")
    c.set_defaults(func=_export_onnx)


def _add_export(sub: Any) -> None:
    """``vlp export onnx``."""
    add_family(sub, "export", "a model's towers for deployment: ONNX graphs for onnxruntime", [_add_onnx])


#: This family's commands, each with the function that adds it to ``vlp``'s subparsers.
COMMANDS = {"export": _add_export}
