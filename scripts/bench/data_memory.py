"""Start-up time and memory of training data at ALBEF's 4M scale (5.1M annotation entries), with 8 loader workers.

    python scripts/bench/data_memory.py                                  # 5.1M entries, 8 workers, one epoch
    python scripts/bench/data_memory.py --entries 200000 --workers 2     # a quick run
    PYTHONPATH=OLD_TREE python scripts/bench/data_memory.py              # an older vlp (its own data form)
    python scripts/bench/data_memory.py --features 8                     # with an SRCL cache and LTD targets

It writes an ALBEF-format pretraining file of ``--entries`` entries (``{"image": ..., "caption":
...}``; image paths like ALBEF's ``/data/cc3m/train/000123456.jpg``, captions of random words,
40-70 characters; the first ``--shared`` of the entries are COCO-like, five entries per image) to
``--data`` (kept and reused) or a temporary folder (removed), then measures:

1. **start-up**: ``vlp.data.formats.load_pairs`` of the file and ``ImageTextDataset`` over its
   samples (the training path of ``vlp pretrain``): wall and CPU seconds (the machine's load
   average beside them), the main process's peak resident memory during it (``VmHWM``) and its
   memory afterwards;
2. **an epoch of random indexing**: the training loader (``vlp.data.datasets.train_loader``:
   a shuffled permutation, ``--workers`` forked persistent workers) over the dataset for
   ``--fraction`` of an epoch (``--gc-freeze``: ``gc.freeze()`` before the workers fork). Each
   item runs the dataset's real per-item path (the sample looked up, a caption drawn, its image
   id, per-item seeding) except that no image is opened (a fixed 1x1 image; the transform
   returns 0) and batches carry three ints.

With ``--features DIM``, it also writes (to ``--data``, kept and reused) a synthetic SRCL helper
cache (``vlp.features.helper_cache``: every distinct image key and caption of the file, random
unit features of DIM dimensions) and an LTD targets file (``vlp.features.targets``: every distinct
caption) of the samples, as ``vlp cache-helper-features`` and ``vlp make-targets`` would; start-up
then also times ``HelperCache.load`` and ``LatentTargets.load``, the dataset takes both (its
``check_covers`` runs in the ``dataset`` figure) and every item looks its features and targets up,
as in training. DIM only sizes the feature tensors; their indexes do not depend on it.

Memory is read from ``/proc/PID/smaps_rollup`` (MiB): ``rss``, ``pss`` (shared pages divided
among the processes sharing them) and ``uss`` = ``Private_Clean + Private_Dirty``, the pages only
this process maps. **Growth per worker** = the worker's ``uss`` after the epoch (the workers stay
alive, idle) minus its ``uss`` at start (read in its ``worker_init_fn``, before it loads an item):
the memory a worker has copied on write or allocated while indexing, and file pages (a
memory-mapped feature file, library code) only it has read; ``growth_dirty_mib`` counts the written
pages alone (``Private_Dirty``: copies and allocations). The main process is read
after start-up (before the workers fork) and after the epoch. A run stops early, marked
``aborted``, when the machine's ``MemAvailable`` falls below ``--min-available-gib``. JSON with
``--out``; a table on stdout.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from PIL import Image

from vlp.data.datasets import ImageTextDataset, train_loader
from vlp.data.formats import load_pairs
from vlp.features.helper_cache import HelperCache, cache_rows, write_cache
from vlp.features.targets import LatentTargets, write_targets

WORDS = (
    "a an the man woman child dog cat bird horse car bus train boat plane bicycle street road city "
    "park beach field water river sky tree trees building house room table chair bed kitchen window "
    "red blue green white black yellow small large old young tall two three several group people "
    "standing sitting walking riding holding playing looking next to near on in with of at under "
    "front top side view close up photo picture image stock vector illustration background sunset "
    "snow grass road sign light pizza plate food cake phone laptop computer shirt hat umbrella"
).split()
SMAPS_FIELDS = ("Rss", "Pss", "Private_Clean", "Private_Dirty")


def _caption(rng: random.Random) -> str:
    """Random words up to 40-70 characters (ALBEF's CC3M/COCO captions average about 55)."""
    target, words, n = rng.randint(40, 70), [], 0
    while n < target:
        w = rng.choice(WORDS)
        words.append(w)
        n += len(w) + 1
    return " ".join(words)


def write_albef(path: Path, entries: int, shared: float, seed: int = 0) -> Path:
    """An ALBEF pretraining JSON of ``entries`` entries: the first ``shared`` share COCO-like
    (five entries, one caption each, per image), the rest one image each (CC3M-like)."""
    rng = random.Random(seed)
    n_shared = int(entries * shared)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("[")
        for k in range(entries):
            if k < n_shared:
                image = f"/data/coco/train2014/COCO_train2014_{k // 5:012d}.jpg"
            else:
                image = f"/data/cc3m/train/{k:09d}.jpg"
            f.write(f'{"," if k else ""}\n{{"image": "{image}", "caption": "{_caption(rng)}"}}')
        f.write("\n]\n")
    os.replace(tmp, path)
    return path


def _unit_rows(n: int, dim: int, seed: int) -> torch.Tensor:
    """[n, dim] random unit vectors (fp32)."""
    v = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))
    return v / v.norm(dim=1, keepdim=True)


def write_feature_files(ann: Path, samples: Sequence[Any], dim: int, seed: int) -> tuple[Path, Path]:
    """A synthetic helper cache and LTD targets file of ``samples`` (the rows ``vlp
    cache-helper-features`` and ``vlp make-targets`` write), next to ``ann``; reused when present."""
    cache, targets = ann.with_name(f"{ann.stem}_helper{dim}"), ann.with_name(f"{ann.stem}_targets{dim}.safetensors")
    if not cache.is_dir():
        _, keys, texts = cache_rows(samples)
        meta = {"kind": "learned", "helper": "synthetic", "helper_init": "random", "data": [str(ann)]}
        write_cache(cache, keys, _unit_rows(len(keys), dim, seed), texts, _unit_rows(len(texts), dim, seed + 1), meta)
    if not targets.is_file():
        captions = sorted({c for smp in samples for c in smp.captions})
        write_targets(targets, captions, _unit_rows(len(captions), dim, seed + 2), "synthetic", [str(ann)])
    return cache, targets


def smaps(pid: int | str = "self") -> dict[str, float]:
    """``rss``, ``pss`` and ``uss`` (private clean + dirty) of a process in MiB (smaps_rollup)."""
    kib = dict.fromkeys(SMAPS_FIELDS, 0)
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in kib:
            kib[name] = int(rest.split()[0])
    mib = {k: v / 1024 for k, v in kib.items()}
    return {
        "rss": round(mib["Rss"], 1),
        "pss": round(mib["Pss"], 1),
        "uss": round(mib["Private_Clean"] + mib["Private_Dirty"], 1),
        "private_dirty": round(mib["Private_Dirty"], 1),  # written pages: copies and allocations, no file pages
    }


def _meminfo_gib(field: str) -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


class IndexOnly(ImageTextDataset):
    """The training dataset with image reading replaced by a fixed 1x1 image (no file is opened)."""

    _IMAGE = Image.new("RGB", (1, 1))

    def image(self, path: str, origin: str) -> Image.Image:
        return self._IMAGE


def no_transform(_image: Image.Image) -> int:
    return 0


def collate(items: list[dict]) -> tuple[int, int, int]:
    """(items, sum of image ids, caption characters): ints, so batches cost no IPC."""
    return len(items), sum(int(it["image_id"]) for it in items), sum(len(it["caption"]) for it in items)


def record_start(folder: str, init: Optional[Callable[[int], None]], worker_id: int) -> None:
    """``worker_init_fn``: the loader's own init, then this worker's pid and memory to a file."""
    if init is not None:
        init(worker_id)
    out = {"worker": worker_id, "pid": os.getpid(), "start": smaps()}
    Path(folder, f"worker-{worker_id}.json").write_text(json.dumps(out))


def run_epoch(dataset: IndexOnly, a: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """A ``--fraction`` of an epoch of the training loader; the workers' memory at start and after."""
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores: on purpose
    loader = train_loader(dataset, a.batch_size, collate, a.workers, a.seed)
    loader.worker_init_fn = functools.partial(record_start, str(folder), loader.worker_init_fn)
    n_batches = max(1, int(len(loader) * a.fraction))
    if a.gc_freeze:
        gc.freeze()
    t0, items, aborted = time.perf_counter(), 0, None
    it = iter(loader)
    for b, (n, _, _) in enumerate(it):
        items += n
        if b % 64 == 0 and _meminfo_gib("MemAvailable") < a.min_available_gib:
            aborted = f"MemAvailable below {a.min_available_gib} GiB after {b + 1} batches"
            break
        if b + 1 >= n_batches:
            break
    seconds = time.perf_counter() - t0
    time.sleep(0.5)  # the workers' last prefetches land
    workers = []
    for f in sorted(folder.glob("worker-*.json")):
        w = json.loads(f.read_text())
        w["end"] = smaps(w["pid"])
        w["growth_uss_mib"] = round(w["end"]["uss"] - w["start"]["uss"], 1)
        w["growth_dirty_mib"] = round(w["end"]["private_dirty"] - w["start"]["private_dirty"], 1)
        workers.append(w)
    main_after = smaps()
    del it, loader
    gc.collect()
    if a.gc_freeze:
        gc.unfreeze()
    return {
        "epoch_seconds": round(seconds, 1),
        "batches": n_batches,
        "items": items,
        "aborted": aborted,
        "main_after_epoch": main_after,
        "worker_memory": workers,
    }


def start_up(ann: Path, features: Optional[tuple[Path, Path]]) -> tuple[IndexOnly, dict[str, Any]]:
    """The dataset of ``ann`` as ``vlp pretrain`` builds it, with the helper cache and targets
    ``features`` when given; the seconds each step took."""
    load_before, seconds = os.getloadavg()[0], {}
    t0, cpu0 = time.perf_counter(), time.process_time()
    samples = load_pairs([ann])
    seconds["load_pairs"] = time.perf_counter() - t0
    cache = targets = None
    if features is not None:
        t = time.perf_counter()
        cache = HelperCache.load(features[0])
        seconds["helper_cache"] = time.perf_counter() - t
        t = time.perf_counter()
        targets = LatentTargets.load(features[1])
        seconds["targets"] = time.perf_counter() - t
    t = time.perf_counter()
    dataset = IndexOnly(samples, no_transform, cache, targets)
    del samples
    gc.collect()
    seconds["dataset"] = time.perf_counter() - t
    t2, cpu2 = time.perf_counter(), time.process_time()
    startup = {k: round(v, 1) for k, v in seconds.items()}
    startup["total"], startup["cpu"] = round(t2 - t0, 1), round(cpu2 - cpu0, 1)  # CPU s: an unshared core's
    startup["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]  # 1-min, before and after
    return dataset, startup


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=5_100_000, help="annotation entries (ALBEF 4M: 5.1M)")
    p.add_argument("--shared", type=float, default=0.25, help="share of entries that are COCO-like (5 per image)")
    p.add_argument("--workers", type=int, default=8, help="loader worker processes")
    p.add_argument("--fraction", type=float, default=1.0, help="share of an epoch to index")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gc-freeze", action="store_true", help="gc.freeze() before the workers fork")
    p.add_argument("--min-available-gib", type=float, default=2.0, help="stop early below this MemAvailable")
    p.add_argument("--data", default=None, help="folder for the generated file (kept; default: a temporary one)")
    p.add_argument("--features", type=int, default=0, help="with a helper cache and LTD targets of DIM dimensions")
    p.add_argument("--out", default=None, help="write the report as JSON")
    a = p.parse_args(argv)
    if a.workers < 1 or not 0 < a.fraction <= 1:
        p.error("--workers must be >= 1 and --fraction in (0, 1]")

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.data) if a.data else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        ann = folder / f"albef_{a.entries}_shared{a.shared:g}_seed{a.seed}.json"
        t0 = time.perf_counter()
        if not ann.is_file():
            write_albef(ann, a.entries, a.shared, a.seed)
        written = time.perf_counter() - t0
        features = None
        if a.features:
            t0 = time.perf_counter()
            features = write_feature_files(ann, load_pairs([ann]), a.features, a.seed)
            features_written = time.perf_counter() - t0
        gc.collect()
        before = smaps()
        dataset, startup = start_up(ann, features)
        main_after_startup, peak = smaps(), _peak_rss_mib()
        worker_dir = Path(tmp, "workers")
        worker_dir.mkdir()
        epoch = run_epoch(dataset, a, worker_dir)
        growth = [w["growth_uss_mib"] for w in epoch["worker_memory"]]
        report = {
            "entries": a.entries,
            "samples": len(dataset),
            "images": len(dataset.key_to_id),
            "form": type(dataset.samples).__name__,
            "held_mib": round(dataset.samples.nbytes / 2**20, 1) if hasattr(dataset.samples, "nbytes") else None,
            "file_mib": round(ann.stat().st_size / 2**20, 1),
            "file_written_seconds": round(written, 1),
            "features_dim": a.features,
            "features_written_seconds": round(features_written, 1) if features else None,
            "startup_seconds": startup,
            "main_before_load": before,
            "main_after_startup": main_after_startup,
            "main_peak_rss_mib": peak,
            "workers": a.workers,
            "fraction": a.fraction,
            "batch_size": a.batch_size,
            "gc_freeze": a.gc_freeze,
            **epoch,
            "worker_growth_mib": {
                "max": max(growth, default=None),
                "mean": round(sum(growth) / len(growth), 1) if growth else None,
            },
            "mem_total_gib": round(_meminfo_gib("MemTotal"), 1),
            "cores": len(os.sched_getaffinity(0)),
            "machine": platform.processor() or platform.machine(),
            "vlp": str(Path(sys.modules[ImageTextDataset.__module__].__file__ or "").parents[1]),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
        }
    _print_table(report)
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2))
    return report


def _print_table(r: dict[str, Any]) -> None:
    s = r["startup_seconds"]
    print(
        f"{r['entries']:,} entries, {r['images']:,} images, form {r['form']} ({r['held_mib']} MiB held); "
        f"start-up {s['total']} s (load_pairs {s['load_pairs']} s, "
        + (f"helper cache {s['helper_cache']} s, targets {s['targets']} s, " if "helper_cache" in s else "")
        + f"dataset {s['dataset']} s; {s['cpu']} CPU s, "
        f"load average {s['load_average'][0]}-{s['load_average'][1]}), "
        f"main peak RSS {r['main_peak_rss_mib']} MiB"
    )
    print(
        f"{r['items']:,} items in {r['batches']} batches over {r['workers']} workers, {r['epoch_seconds']} s"
        + (f"; ABORTED: {r['aborted']}" if r["aborted"] else "")
    )
    print(f"{'process':<16}{'rss MiB':>10}{'pss MiB':>10}{'uss MiB':>10}{'uss start':>11}{'growth':>9}{'dirty':>8}")
    for name, m in (("main (start-up)", r["main_after_startup"]), ("main (after)", r["main_after_epoch"])):
        print(f"{name:<16}{m['rss']:>10}{m['pss']:>10}{m['uss']:>10}")
    for w in r["worker_memory"]:
        e = w["end"]
        print(
            f"{'worker ' + str(w['worker']):<16}{e['rss']:>10}{e['pss']:>10}{e['uss']:>10}"
            f"{w['start']['uss']:>11}{w['growth_uss_mib']:>9}{w['growth_dirty_mib']:>8}"
        )


if __name__ == "__main__":
    from vlp.console import show_logs

    show_logs()  # vlp's log records printed as `vlp` prints them
    main()
