"""Time of one ``vlp search`` text query on a large index, model load excluded.

    python scripts/bench/search.py                         # 100,000 x 256, the demo's model (random weights), CPU
    python scripts/bench/search.py --rows 1000000          # a million rows (1 GB of features on disk)
    python scripts/bench/search.py --rows 2000 --repeats 3 # a smoke run (seconds)

Writes a synthetic index in vlp's format (:mod:`vlp.search.index_format`: ``--rows`` random
L2-normalised float32 features of width ``--dim``, made-up paths) into ``--folder`` (default: a
temporary folder; an index already there with the same rows and width is reused), and a random-init
model of ``configs/pretrain/shapes_tiny.yaml`` with ``model.embed_dim=DIM`` as its checkpoint. Then,
each ``--repeats`` times, the median reported:

1. ``open``: :func:`vlp.search.open_index` (the features memory-mapped, the paths read);
2. ``query``: :meth:`vlp.search.Searcher.text` with ``--top`` hits: the text encoded, every row
   scored a block at a time, the top k, the hits (the model already loaded);
3. ``ranking``: :func:`vlp.search.cosine_scores` and :func:`vlp.search.top_k` alone, on a random
   normalised query;
4. ``served``: the same text query through ``vlp serve`` (:mod:`vlp.serve`, the same searcher
   behind a server on 127.0.0.1 in this process): ``GET /api/search?q=...&top=...`` over HTTP, the
   JSON answer read and parsed, as the page asks it.

The first pass of each also reads the features from disk (or the page cache); the median is of
warm passes. Then the process's memory: ``RssAnon`` (its own: the model, the paths, the scores) and
``RssFile`` (file pages mapped, the features among them, which the kernel may drop), in MiB. JSON
with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def write_index(folder: Path, rows: int, dim: int, checkpoint: Path, seed: int = 0) -> Path:
    """A synthetic index of ``rows`` x ``dim`` random normalised features under ``folder / "index"``
    (reused when one of that shape is there), its meta naming ``checkpoint``."""
    from vlp.search.index_format import DTYPE, FEATURES, FORMAT, FORMAT_VERSION, META, PATHS

    out = folder / "index"
    meta_file = out / META
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text())
        if (meta["count"], meta["embed_dim"]) == (rows, dim):
            return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    features = np.lib.format.open_memmap(out / FEATURES, mode="w+", dtype=DTYPE, shape=(rows, dim))
    for lo in range(0, rows, 1 << 16):
        block = rng.standard_normal((min(rows, lo + (1 << 16)) - lo, dim), dtype=np.float32)
        features[lo : lo + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    features.flush()
    del features
    (out / PATHS).write_text(json.dumps([f"photos/{i // 1000:04d}/img_{i:07d}.jpg" for i in range(rows)]))
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "root": str(folder), "count": rows}
    meta |= {"embed_dim": dim, "dtype": DTYPE, "checkpoint": str(checkpoint)}
    meta_file.write_text(json.dumps(meta, indent=1))
    return out


def write_model(folder: Path, dim: int) -> Path:
    """A random-init model of the demo's config with ``model.embed_dim=dim``, saved as a checkpoint."""
    import torch

    from vlp.config import PretrainConfig, load_config, to_dict
    from vlp.models.albef import ALBEF
    from vlp.weights import save_checkpoint

    ckpt = folder / f"model_e{dim}"
    if (ckpt / "state.json").is_file():
        return ckpt
    cfg = load_config(PretrainConfig, ROOT / "configs/pretrain/shapes_tiny.yaml", [f"model.embed_dim={dim}"])
    torch.manual_seed(0)
    return save_checkpoint(ckpt, ALBEF(cfg.model), {"task": "pretrain", "config": to_dict(cfg), "step": 0})


def timed(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    """``fn`` run ``repeats`` times: the first pass and the median of the others, in milliseconds."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    warm = times[1:] or times
    return {
        "first_ms": round(times[0], 2),
        "median_ms": round(statistics.median(warm), 2),
        "min_ms": round(min(warm), 2),
    }


def served_query(searcher: Any, query: str, top: int) -> tuple[Callable[[], object], Callable[[], None]]:
    """A function that asks ``vlp serve``'s JSON API (``searcher`` behind a server on a free port of
    127.0.0.1, in a thread) for ``query``'s ``top`` hits and parses the answer; and the server's stop."""
    from vlp.serve import SearchApp, SearchServer

    server = SearchServer("127.0.0.1", 0, lambda: SearchApp(searcher))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = server.url + "api/search?" + urllib.parse.urlencode({"q": query, "top": top})

    def ask() -> object:
        with urllib.request.urlopen(url) as r:
            return json.loads(r.read())

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return ask, stop


def status_mib(field: str) -> float | None:
    """A ``/proc/self/status`` memory field (``RssAnon``, ``RssFile``, ``VmHWM``) in MiB; None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--query", default="a red circle left of a blue square")
    p.add_argument("--folder", default=None, help="where the index and model go (default: a temporary folder)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args()
    import torch

    from vlp.search import Searcher, cosine_scores, open_index, top_k

    folder = Path(a.folder) if a.folder else Path(tempfile.mkdtemp(prefix="vlp_search_bench_"))
    index = write_index(folder, a.rows, a.dim, write_model(folder, a.dim))
    searcher = Searcher.open(index, device=a.device)  # the model load: not timed
    q = np.random.default_rng(1).standard_normal(a.dim).astype(np.float32)
    q /= np.linalg.norm(q)
    features = searcher.index.features  # the mapping the queries read
    ask, stop = served_query(searcher, a.query, a.top)
    results = {
        "rows": a.rows,
        "dim": a.dim,
        "top": a.top,
        "device": a.device,
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "index_mib": round((index / "features.npy").stat().st_size / 2**20, 1),
        "open": timed(lambda: open_index(index), a.repeats),
        "query": timed(lambda: searcher.text(a.query, top=a.top), a.repeats),
        "ranking": timed(lambda: top_k(cosine_scores(features, q), a.top), a.repeats),
        "served": timed(ask, a.repeats),
    }
    stop()
    # the features are file pages of the mapping (RssFile, dropped by the kernel under pressure), not
    # the process's own memory (RssAnon)
    results["memory_mib"] = {k: status_mib(k) for k in ("RssAnon", "RssFile", "VmHWM")}
    print(json.dumps(results, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
