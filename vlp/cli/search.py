"""``vlp index`` and ``vlp search``: a folder of photos into one index, and the index searched by a
text or an image (:mod:`vlp.search`, docs/search.md)."""

from __future__ import annotations

import argparse
from typing import Any

from vlp.cli.common import call


def _index(a: argparse.Namespace) -> None:
    from vlp.search import run_index

    report = call(run_index, a, used=("dir", "progress"), folder=a.dir, show_progress=a.progress)
    print("\n".join(report.lines()))


def _search(a: argparse.Namespace) -> None:
    from vlp.search import run_search

    print(call(run_search, a, used=("json",), as_json=a.json))


def _add_index(sub: Any) -> None:
    """``vlp index``."""
    s = sub.add_parser(
        "index",
        help="embed every image under a folder into one searchable index (resumable: run it again after a kill)",
        description="Embed every image under DIR (recursively; .jpg .jpeg .png .bmp .gif .webp .tif .tiff) with "
        "the image tower of the checkpoint (--checkpoint) or of a `vlp export onnx` folder under onnxruntime "
        "(--onnx) into the index folder --out. An interrupted run leaves OUT.partial; the same command continues it.",
    )
    s.add_argument("dir", help="the folder of images")
    s.add_argument("--checkpoint", help="run directory, checkpoint folder or save_pretrained folder (this or --onnx)")
    s.add_argument(
        "--onnx", metavar="EXPORT", help="a `vlp export onnx` folder, run by onnxruntime (this or --checkpoint)"
    )
    s.add_argument("--out", required=True, help="the index folder to write (must not exist)")
    s.add_argument("--batch-size", type=int, default=64, help="images per forward pass")
    s.add_argument("--chunk-size", type=int, default=4096, help="images per saved chunk: what a resumed run keeps")
    s.add_argument(
        "--device", default=None, help="default: cuda if available (--onnx: onnxruntime's CUDA provider), else cpu"
    )
    s.add_argument("--workers", type=int, default=0, help="image-decoding loader processes (0: this process)")
    s.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    s.set_defaults(func=_index)


def _add_search(sub: Any) -> None:
    """``vlp search``."""
    s = sub.add_parser(
        "search",
        help="search an index of `vlp index` by text (or by image: --image)",
        description="Rank the images of INDEX by the ITC cosine to a text query (or to --image), "
        "optionally re-ranking the top K by the ITM head as ALBEF's retrieval evaluation does.",
    )
    s.add_argument("index", help="the index folder")
    s.add_argument("query", nargs="?", default=None, help="the text to search for")
    s.add_argument("--top", type=int, default=10, help="how many hits")
    s.add_argument(
        "--checkpoint",
        default=None,
        help="default: the checkpoint that built the index (an index of --onnx: that export's towers)",
    )
    s.add_argument("--image", default=None, help="search by this image instead of a text (image-image cosine)")
    s.add_argument("--rerank-itm", type=int, default=0, metavar="K", help="re-rank the ITC top K by ITM match logit")
    s.add_argument("--json", action="store_true", help="print the hits as a JSON list (exact scores)")
    s.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    s.set_defaults(func=_search)


#: This family's commands, each with the function that adds it to ``vlp``'s subparsers.
COMMANDS = {"index": _add_index, "search": _add_search}
