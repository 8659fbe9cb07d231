"""Write ALBEF-format annotation files and their images as webdataset tar shards (= `vlp make-shards`).

    python scripts/make_shards.py --data worlds/shapes/pretrain.json --out shards/shapes --size 64 --max-per-shard 500

Writes ``shard-00000.tar``, ... (one sample per image: ``{key}.jpg`` resized so the shorter side
is ``--size``, ``{key}.json`` with all its captions) and ``sizes.json`` (images and pairs per
shard). Train from them with ``data.format=webdataset data.train=[OUT]`` (docs/data.md).
"""

from __future__ import annotations

import sys

from vlp.cli import main

if __name__ == "__main__":
    sys.exit(main(["make-shards", *sys.argv[1:]]))
