"""The training loader on shards read by URL: samples/s per worker, and start-up of a large shard set.

    python scripts/bench/url_loader.py throughput                       # S3 vs local, 1 and 2 workers
    python scripts/bench/url_loader.py throughput --source-size 1280x960 --images 1000
    python scripts/bench/url_loader.py startup --shards 40000           # 40,000 stats files over HTTP
    python scripts/bench/url_loader.py startup --shards 40000 --counts num_samples   # no stats files

Everything is served on 127.0.0.1 by the servers the test suite uses (``tests/data/shard_servers.py``):
moto's S3 server (``ThreadedMotoServer``, a thread of this process) and a plain HTTP server with byte
ranges. No traffic goes to any other address.

**throughput** writes ``--images`` photo-like JPEGs at ``--source-size``
(:func:`vlp.runs.bench.loader.write_test_jpegs`: about 51 KB at 500x375, quality 90) into shards of
``--per-shard`` samples in img2dataset's layout (``NNNNN.tar`` with ``{key}.jpg`` and ``{key}.json``
holding the caption, ``NNNNN_stats.json`` beside it), uploads them to a bucket of the local S3 server,
then reads them with the training loader (:class:`vlp.data.shards.ShardLoader`: the shuffle buffer,
the split of shards over workers, the config's training transform at the model's resolution and
``data.image.decode``, batches of ``--batch``), from the local folder and from ``s3://``, with each
of ``--workers`` DataLoader workers, ``--rounds`` times (sources alternating). Batches carry the
image tensors and the captions (no tokenizer). Per (source, workers), the median round:

- ``samples_per_s``: samples after the first batch over the time from the first batch to the last
  (the first batch holds the workers' start and their first shard's first bytes); ``per_worker``: that
  over the workers;
- ``worker_cpu_ms``: the workers' CPU time per sample (``getrusage(RUSAGE_CHILDREN)``, read once the
  workers have exited): decoding, the transform, tar parsing and, from S3, the client's share of I/O;
  ``worker_wait_ms``: a worker's wall time per sample minus that, the time it waits (for bytes, for
  the main process, for a core);
- ``main_cpu_ms``: this process's CPU per sample: receiving batches and, for ``s3``, the S3
  server itself (a cost of the test setup, not of a training node).

**I/O alone** (``io``): one reader streaming every shard through the training read path
(:func:`vlp.data.shard_samples.iter_samples`: :func:`vlp.remote.shard_urls.open_url`, tar parsing,
image bytes not decoded), samples/s and MB/s from each source; it is what a worker spends on I/O
when its images take no decoding.

**startup** writes ``--shards`` img2dataset shards of ``--per-shard`` tiny JPEGs (hard links to one
tar: the bytes do not matter here) and their stats files, serves the folder over HTTP and times what
``vlp pretrain`` does before its first step with ``data.train`` a brace pattern of their URLs: the
shard counts (``--counts stats``: every ``_stats.json``, fetched concurrently; ``index``: ``vlp data
index`` once, timed apart, then the index file; ``num_samples``: ``data.train_num_samples``, one
HEAD), the loader's construction and its first batch. The server's log gives the requests made.

JSON with ``--out``; a table on stdout.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import platform
import resource
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))  # the suite's local servers (shard_servers.py)

from shard_servers import http_server, s3_server  # noqa: E402

from vlp.checkpoint import image_size  # noqa: E402
from vlp.config import DataConfig, PretrainConfig, load_config  # noqa: E402
from vlp.data.shard_format import index_entry, read_sizes  # noqa: E402
from vlp.data.shard_samples import iter_samples  # noqa: E402
from vlp.data.shards import ShardLoader  # noqa: E402
from vlp.preprocess.transforms import train_transform  # noqa: E402
from vlp.runs.bench.loader import cpu_name, parse_size, write_test_jpegs  # noqa: E402

BUCKET = "vlp-bench"


# ----------------------------------------------------------------------------- shards


def add_member(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def write_img2dataset(folder: Path, jpegs: Sequence[Path], per_shard: int) -> int:
    """img2dataset's layout in ``folder`` from ``jpegs``: ``NNNNN.tar`` (``{key}.jpg``, ``{key}.json``
    with url, key, status and caption) and ``NNNNN_stats.json``. Returns the number of shards."""
    folder.mkdir(parents=True, exist_ok=True)
    shards = -(-len(jpegs) // per_shard)
    for s in range(shards):
        part = jpegs[s * per_shard : (s + 1) * per_shard]
        with tarfile.open(folder / f"{s:05d}.tar", "w") as tf:
            for j, path in enumerate(part):
                key = f"{s:05d}{j:04d}"
                meta = {"url": f"http://example.com/{key}.jpg", "key": key, "status": "success"}
                add_member(tf, f"{key}.jpg", path.read_bytes())
                add_member(tf, f"{key}.json", json.dumps({**meta, "caption": f"a photo numbered {key}"}).encode())
        stats = {"count": len(part), "successes": len(part), "failed_to_download": 0}
        (folder / f"{s:05d}_stats.json").write_text(json.dumps(stats))
    return shards


def brace(base: str, shards: int) -> str:
    """The brace pattern of shards ``00000.tar`` .. under ``base`` (``base/00000.tar`` for one)."""
    return f"{base}/00000.tar" if shards == 1 else f"{base}/{{00000..{shards - 1:05d}}}.tar"


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


# ----------------------------------------------------------------------------- throughput


def stack_images(items: list[dict]) -> dict[str, Any]:
    """A batch of the loader's items: images ``[B, 3, res, res]``, captions (no tokenizer)."""
    return {"image": torch.stack([it["image"] for it in items]), "caption": [it["caption"] for it in items]}


def time_loader(entry: str, cfg: Any, workers: int, batch: int, seed: int) -> dict[str, Any]:
    """One epoch of the training loader over ``entry``: samples/s after the first batch, CPU per sample."""
    transform = train_transform(image_size(cfg), cfg.data.image)
    data = DataConfig(train=[entry], batch_size=batch, num_workers=workers, shuffle_buffer=100, image=cfg.data.image)
    loader = ShardLoader(data, transform, stack_images, seed=seed, verbose=False)
    children0, self0 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    t_start = time.perf_counter()
    t_first, n = 0.0, 0
    for b, out in enumerate(loader):
        if b == 0:
            t_first = time.perf_counter()
        else:
            n += len(out["caption"])
    t_end = time.perf_counter()
    children1, self1 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    total = n + batch
    worker_cpu = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
    main_cpu = (self1.ru_utime + self1.ru_stime) - (self0.ru_utime + self0.ru_stime)
    rate, wall = n / (t_end - t_first), t_end - t_start
    return {
        "samples": total,
        "first_batch_s": round(t_first - t_start, 3),
        "samples_per_s": round(rate, 1),
        "per_worker": round(rate / workers, 1),
        "worker_cpu_ms": round(1000 * worker_cpu / total, 2),
        "worker_wait_ms": round(1000 * (workers * wall - worker_cpu) / total, 2),
        "main_cpu_ms": round(1000 * main_cpu / total, 2),
        "load_avg": load_avg(),
    }


def time_io(entry: str) -> dict[str, Any]:
    """Every sample of ``entry`` streamed through the training read path by one reader, not decoded."""
    shards = read_sizes([entry])
    t0, cpu0 = time.perf_counter(), time.process_time()
    n = nbytes = 0
    for raw in iter_samples(shards, images=True):
        n += 1
        nbytes += len(raw.image or b"")
    dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "samples_per_s": round(n / dt, 1),
        "mb_per_s": round(nbytes / dt / 1e6, 1),
        "cpu_ms": round(1000 * cpu / n, 3),
    }


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round of median ``samples_per_s``, with the range over rounds."""
    ordered = sorted(rounds, key=lambda r: r["samples_per_s"])
    mid = dict(ordered[len(ordered) // 2])
    mid["range"] = [ordered[0]["samples_per_s"], ordered[-1]["samples_per_s"]]
    return mid


def run_throughput(a: argparse.Namespace) -> dict[str, Any]:
    cfg = load_config(PretrainConfig, a.config, list(a.overrides))
    work = Path(tempfile.mkdtemp(prefix="vlp_url_bench_", dir=a.tmp))
    try:
        t0 = time.time()
        jpegs = write_test_jpegs(work / "jpegs", a.images, parse_size(a.source_size))
        folder = work / "shards"
        shards = write_img2dataset(folder, jpegs, a.per_shard)
        mean_kb = statistics.mean(p.stat().st_size for p in jpegs) / 1024
        print(f"wrote {a.images} JPEGs ({mean_kb:.0f} KB mean) in {shards} shards ({time.time() - t0:.0f} s)")
        import pytest

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server: no line per request
        with pytest.MonkeyPatch.context() as mp, s3_server(mp, BUCKET, folder), http_server(folder) as web:
            sources = {
                "local": brace(str(folder), shards),
                "http": brace(web.url, shards),
                "s3": brace(f"s3://{BUCKET}", shards),
            }
            io_only = {name: time_io(entry) for name, entry in sources.items()}
            loader: dict[str, dict[int, list]] = {name: {w: [] for w in a.workers} for name in sources}
            for r in range(a.rounds):
                for w in a.workers:
                    for name, entry in sources.items():
                        res = time_loader(entry, cfg, w, a.batch, seed=r)
                        loader[name][w].append(res)
                        print(f"round {r}: {name:5s} {w} worker(s): {res['samples_per_s']:7.1f} samples/s", flush=True)
        return {
            "command": "throughput",
            "config": a.config,
            "overrides": list(a.overrides),
            "resolution": image_size(cfg),
            "decode": cfg.data.image.decode,
            "images": a.images,
            "source_size": a.source_size,
            "mean_jpeg_kb": round(mean_kb, 1),
            "per_shard": a.per_shard,
            "batch": a.batch,
            "io": io_only,
            "loader": {name: {w: median_round(rs) for w, rs in per.items()} for name, per in loader.items()},
            **machine(),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ----------------------------------------------------------------------------- start-up


def write_many(folder: Path, shards: int, per_shard: int, stats: bool) -> None:
    """``shards`` img2dataset tars (hard links to one of ``per_shard`` tiny JPEGs), with stats files."""
    jpegs = write_test_jpegs(folder.parent / "tiny", per_shard, (64, 48))
    write_img2dataset(folder, jpegs, per_shard)
    first = folder / "00000.tar"
    for s in range(1, shards):
        os.link(first, folder / f"{s:05d}.tar")
        if stats:
            shutil.copyfile(folder / "00000_stats.json", folder / f"{s:05d}_stats.json")
    if not stats:
        (folder / "00000_stats.json").unlink()


def run_startup(a: argparse.Namespace) -> dict[str, Any]:
    cfg = load_config(PretrainConfig, a.config, list(a.overrides))
    work = Path(tempfile.mkdtemp(prefix="vlp_url_startup_", dir=a.tmp))
    os.environ["VLP_CACHE"] = str(work / "cache")  # vlp data index's file, removed with the folder
    try:
        t0 = time.time()
        write_many(work / "shards", a.shards, a.per_shard, stats=a.counts == "stats")
        print(f"wrote {a.shards} shards ({time.time() - t0:.0f} s)", flush=True)
        transform = train_transform(image_size(cfg), cfg.data.image)
        out: dict[str, Any] = {"command": "startup", "shards": a.shards, "counts": a.counts, "per_shard": a.per_shard}
        with http_server(work / "shards") as server:
            entry = brace(server.url, a.shards)
            if a.counts == "index":
                t = time.perf_counter()
                index_entry(entry)
                out["index_s"] = round(time.perf_counter() - t, 2)
                out["index_requests"] = len(server.log)
                server.log.clear()
            num = a.shards * a.per_shard if a.counts == "num_samples" else None
            load0, t, cpu = load_avg(), time.perf_counter(), time.process_time()
            data = DataConfig(train=[entry], batch_size=a.batch, train_num_samples=num)
            loader = ShardLoader(data, transform, stack_images, verbose=False)
            out["counts_and_loader_s"] = round(time.perf_counter() - t, 3)
            out["requests_before_first_batch"] = len(server.log)
            next(iter(loader))
            out["startup_s"] = round(time.perf_counter() - t, 2)
            out["startup_cpu_s"] = round(time.process_time() - cpu, 2)
            out["requests"] = len(server.log)
            out["load_avg"] = [load0, load_avg()]
        return {**out, **machine()}
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ----------------------------------------------------------------------------- report


def machine() -> dict[str, Any]:
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}


def format_result(r: dict[str, Any]) -> str:
    if r["command"] == "startup":
        keys = ("index_s", "counts_and_loader_s", "startup_s", "startup_cpu_s", "requests", "load_avg")
        return "\n".join(f"{k:28s} {r[k]}" for k in keys if k in r)
    lines = [
        f"{r['images']} JPEGs {r['source_size']} ({r['mean_jpeg_kb']} KB), {r['resolution']} px, decode={r['decode']}"
    ]
    for name, io_r in r["io"].items():
        lines.append(f"I/O alone, {name:5s}: {io_r['samples_per_s']:8.1f} samples/s {io_r['mb_per_s']:6.1f} MB/s")
    lines.append("source  workers  samples/s  per worker  worker CPU ms  worker wait ms  main CPU ms  load")
    for name, per in r["loader"].items():
        for w, x in per.items():
            lines.append(
                f"{name:6s}  {w:7d}  {x['samples_per_s']:9.1f}  {x['per_worker']:10.1f}  {x['worker_cpu_ms']:13.2f}"
                f"  {x['worker_wait_ms']:14.2f}  {x['main_cpu_ms']:11.2f}  {x['load_avg']}"
            )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("throughput", "startup"):
        s = sub.add_parser(name)
        s.add_argument("--config", default="configs/pretrain/albef_4m.yaml", help="its model resolution and data.image")
        s.add_argument("--batch", type=int, default=32)
        s.add_argument("--tmp", default=None, help="where the shards are written (default: the system's temp folder)")
        s.add_argument("--out", default=None, help="write the result as JSON here")
        s.add_argument("overrides", nargs="*", help="dotted config overrides (data.image.decode=draft, ...)")
    t = sub.choices["throughput"]
    t.add_argument("--images", type=int, default=2000)
    t.add_argument("--source-size", default="500x375")
    t.add_argument("--per-shard", type=int, default=100)
    t.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    t.add_argument("--rounds", type=int, default=3)
    u = sub.choices["startup"]
    u.add_argument("--shards", type=int, default=40000)
    u.add_argument("--per-shard", type=int, default=4)
    u.add_argument("--counts", choices=("stats", "index", "num_samples"), default="stats")
    return p


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    a = parser().parse_args(argv)
    r = run_throughput(a) if a.command == "throughput" else run_startup(a)
    print(format_result(r))
    if a.out:
        Path(a.out).write_text(json.dumps(r, indent=1))
    return r


if __name__ == "__main__":
    from vlp.console import show_logs

    show_logs()  # vlp's log records printed as `vlp` prints them
    main()
