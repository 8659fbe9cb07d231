"""Memory and time of retrieval evaluation at COCO size (5,000 images x 25,000 captions), by phase.

    python scripts/bench/eval_memory.py                        # 5,000 x 25,000, k_test 16, tiny model, CPU (~3 min)
    python scripts/bench/eval_memory.py --quick                # 60 x 300, k_test 4: a smoke run (seconds)
    python scripts/bench/eval_memory.py --device cuda --preset base --image-size 384   # on a GPU

A random-init ALBEF of the ``--preset`` towers (``tiny``: the shapes demo model, ViT 64 px width
192 and BERT 2+2 layers) evaluates a generated split: ``--images`` random 64x64 PNGs with
``--captions`` captions each (random words from a small vocabulary, 6-14 words), written once to
``--data`` (default: a temporary folder). The evaluation is vlp's, phase by phase:

1. ``embed``: captions and images encoded (:func:`vlp.eval.retrieval.embed`, image decoding in
   ``--workers`` loader processes), ITM inputs kept;
2. ``itc``: the cosine matrix [N_img, N_txt];
3. ``itm``: ITM re-ranking of every query's top ``--k-test`` (:func:`score_pairs`, timed inside
   :func:`rerank_both`);
4. ``final``: the rest of :func:`rerank_both` (top-k, distinct pairs, final score matrices);
5. ``metrics``: recall@K (:func:`vlp.eval.metrics.retrieval_metrics`).

For each phase it reports the wall time, the process's peak resident memory during the phase
(Linux ``VmHWM``, reset before each phase through ``/proc/self/clear_refs``) and the resident
memory after it; on CUDA also the peak allocated device memory. Loader worker processes are not
counted (their memory is their own). JSON with ``--out``.

It also runs against an older vlp checkout (``PYTHONPATH=OLD_TREE python scripts/bench/eval_memory.py``):
options that tree does not know (``eval.offload``, ``eval.num_workers``) are left out.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import random
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

WORDS = (
    "a red blue green small large circle square triangle star left right top bottom of the and with near "
    "above below two three one shape shapes image picture dark light bright round sharp corner middle"
).split()


def _proc_kib(field: str) -> Optional[int]:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Reset the process's peak RSS (VmHWM); False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class Phases:
    """Wall time, peak and final RSS (MiB) and peak CUDA memory per phase."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.rows = device, {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        resettable = _reset_peak()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        raw = time.perf_counter() - t0
        row = {
            "seconds": round(raw, 2),
            "raw_seconds": raw,
            "peak_rss_mib": round((_proc_kib("VmHWM") or 0) / 1024, 1),
            "rss_after_mib": round((_proc_kib("VmRSS") or 0) / 1024, 1),
        }
        if not resettable:
            row["peak_rss_note"] = "VmHWM not resettable here: peak since the process started"
        if self.device.type == "cuda":
            row["cuda_peak_mib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**20, 1)
        self.rows[name] = row


def make_split(folder: Path, n_images: int, per_image: int, seed: int = 0) -> Path:
    """``n_images`` random 64x64 PNGs and ``per_image`` random captions each, as a retrieval JSON
    (ALBEF/Karpathy test format); reused when ``folder`` already holds the same split."""
    from PIL import Image

    ann = folder / f"retrieval_{n_images}x{per_image}.json"
    if ann.is_file():
        return ann
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(n_images):
        path = folder / "images" / f"{i:06d}.png"
        if not path.is_file():
            Image.fromarray(torch.randint(0, 256, (64, 64, 3), generator=g, dtype=torch.uint8).numpy()).save(path)
        caps = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) for _ in range(per_image)]
        entries.append({"image": str(path), "caption": caps})
    ann.write_text(json.dumps(entries))
    return ann


def _supported(fn, **kwargs) -> dict:
    """The keyword arguments ``fn`` accepts (an older vlp has fewer)."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    """The command line, with ``--images`` and ``--k-test`` defaulted from ``--quick``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=None, help="default 5000 (--quick: 60)")
    p.add_argument("--captions", type=int, default=5, help="captions per image")
    p.add_argument("--k-test", type=int, default=None, help="default 16 (--quick: 4)")
    p.add_argument("--preset", default="tiny", help="model.vision.preset and model.text.preset")
    p.add_argument("--image-size", type=int, default=None, help="model.vision.img_size (default: the preset's)")
    p.add_argument("--precision", default="auto", help="eval.precision")
    p.add_argument("--offload", default="auto", help="eval.offload (newer vlp)")
    p.add_argument("--batch", type=int, default=256, help="eval.batch_size (encoder batch)")
    p.add_argument("--itm-batch", type=int, default=None, help="eval.itm_batch_size")
    p.add_argument("--workers", type=int, default=None, help="eval.num_workers (default: min(4, cores))")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--device", default="cpu")
    p.add_argument("--data", default=None, help="folder for the generated split (kept; default: a temporary one)")
    p.add_argument("--quick", action="store_true", help="60 images x 5 captions, k_test 4 (unless given): a smoke run")
    p.add_argument("--out", default=None, help="write the report as JSON")
    a = p.parse_args(argv)
    a.images = a.images or (60 if a.quick else 5000)
    a.k_test = a.k_test or (4 if a.quick else 16)
    return a


def eval_config(a: argparse.Namespace) -> Any:
    """The EvalConfig of the run from the options this vlp's EvalConfig has (an older one has fewer)."""
    from vlp.config import EvalConfig

    fields = {f for f in EvalConfig.__dataclass_fields__}
    return EvalConfig(
        **{
            k: v
            for k, v in dict(
                k_test=a.k_test,
                score="itm",
                batch_size=a.batch,
                itm_batch_size=a.itm_batch,
                precision=a.precision,
                offload=a.offload,
                num_workers=a.workers,
            ).items()
            if k in fields
        }
    )


@contextmanager
def timed_itm(device: torch.device, timed: dict[str, float]) -> Iterator[None]:
    """Within: ``vlp.eval.retrieval.score_pairs`` wrapped to add its wall time to ``timed["itm"]``."""
    import vlp.eval.retrieval as retrieval

    score_pairs = retrieval.score_pairs

    def timed_score_pairs(*args, **kwargs):
        t = time.perf_counter()
        out = score_pairs(*args, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timed["itm"] += time.perf_counter() - t
        return out

    retrieval.score_pairs = timed_score_pairs
    yield
    retrieval.score_pairs = score_pairs


def run_phases(
    a: argparse.Namespace, model: Any, tokenizer: Any, ecfg: Any, res: int, workers: int, split: Any, phases: Phases
) -> tuple[Any, int, dict[str, float]]:
    """Embed, ITC, ITM re-ranking and metrics of ``split``, each a phase of ``phases`` -> (the
    image-to-text scores [N_img, N_txt], the ITM pairs scored, the metrics)."""
    import vlp.eval.retrieval as retrieval
    from vlp.config import ImageConfig
    from vlp.eval.metrics import retrieval_metrics
    from vlp.preprocess.transforms import test_transform

    device = torch.device(a.device)
    with torch.no_grad():
        with phases.phase("embed"):
            emb = retrieval.embed(
                model,
                split,
                tokenizer,
                test_transform(res, ImageConfig()),
                32,
                a.batch,
                device,
                False,
                **_supported(
                    retrieval.embed,
                    num_workers=workers,
                    precision=ecfg.precision,
                    offload=getattr(ecfg, "offload", "none"),
                ),
            )
        with phases.phase("itc"):
            sim = emb.image_feat.float() @ emb.text_feat.float().T
        with phases.phase("itm + final"):
            i2t, t2i, pairs = retrieval.rerank_both(model, emb, sim, ecfg, show_progress=False)
        with phases.phase("metrics"):
            metrics = retrieval_metrics(i2t.cpu(), t2i.cpu(), split.img2txt, split.txt2img)
    return i2t, pairs, metrics


def phase_rows(rows: dict[str, dict[str, Any]], itm_seconds: float) -> dict[str, dict[str, Any]]:
    """The report's phases from the measured ones: "itm + final" split into the timed ITM scoring and
    the rest ("final"), without the raw seconds, in the order embed, itc, itm, final, metrics."""
    both = rows.pop("itm + final")
    rows["itm"] = {"seconds": round(itm_seconds, 2)}
    rows["final"] = {
        **both,
        "seconds": round(max(0.0, both.pop("raw_seconds") - itm_seconds), 2),
        "note": "peak RSS and CUDA peak over itm + final",
    }
    return {
        k: {f: v for f, v in rows[k].items() if f != "raw_seconds"} for k in ("embed", "itc", "itm", "final", "metrics")
    }


def main(argv: Optional[list[str]] = None) -> dict:
    a = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)

    import vlp.eval.retrieval as retrieval
    from vlp.config import ModelConfig, TextConfig, VisionConfig
    from vlp.data.formats import load_retrieval_split
    from vlp.models.albef import ALBEF
    from vlp.preprocess.transforms import load_tokenizer

    device = torch.device(a.device)
    vision = VisionConfig(preset=a.preset, **({"img_size": a.image_size} if a.image_size else {}))
    mcfg = ModelConfig(vision=vision, text=TextConfig(preset=a.preset, init="random", max_len=32), queue_size=0)
    torch.manual_seed(0)
    model = ALBEF(mcfg).to(device).eval()
    tokenizer = load_tokenizer(mcfg.text)
    ecfg = eval_config(a)
    precision = ecfg.resolved_precision(device) if hasattr(ecfg, "resolved_precision") else ecfg.precision
    workers = ecfg.resolved_workers() if hasattr(ecfg, "resolved_workers") else (a.workers or 0)
    res = vision.img_size or {"tiny": 64, "small": 224, "base": 256}[a.preset]

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.data) if a.data else Path(tmp)
        t0 = time.perf_counter()
        split = load_retrieval_split(make_split(folder, a.images, a.captions))
        made = time.perf_counter() - t0
        phases = Phases(device)
        timed = {"itm": 0.0}
        with timed_itm(device, timed):
            i2t, pairs, metrics = run_phases(a, model, tokenizer, ecfg, res, workers, split, phases)
    rows = phase_rows(phases.rows, timed["itm"])
    report = {
        "images": a.images,
        "captions": len(split.texts),
        "k_test": a.k_test,
        "itm_pairs": pairs,
        "preset": a.preset,
        "image_size": res,
        "precision": precision,
        "offload": getattr(ecfg, "offload", "n/a"),
        "workers": workers,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "phases": rows,
        "total_seconds": round(sum(r["seconds"] for r in rows.values()), 2),
        "peak_rss_mib": max(r.get("peak_rss_mib", 0) for r in rows.values()),
        "r_mean": round(metrics["r_mean"], 4),
        "split_written_seconds": round(made, 1),
        "score_dtype": str(i2t.dtype),
        "machine": platform.processor() or platform.machine(),
        "vlp": str(Path(inspect.getfile(retrieval)).parents[1]),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    print(json.dumps(report, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    from vlp.console import show_logs

    show_logs()  # vlp's log records printed as `vlp` prints them
    main()
