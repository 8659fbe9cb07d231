"""Cost of SRCL and LTD per pretraining step: plain ITC vs SRCL (cached helper features) vs removal
vs SRCL with a live helper vs LTD (cached latent targets), on the full ALBEF step (ITC + ITM + MLM
forward, backward, AdamW, momentum update, queue writes).

    python scripts/bench/srcl_overhead.py --preset tiny --batch 64 --queue 4096        # CPU
    python scripts/bench/srcl_overhead.py --preset base --batch 64 --queue 65536 --precision bf16  # GPU

Variants run interleaved (round-robin, ``--steps`` steps each per round) on the same random
batch, so drifts in machine speed hit all of them alike; the figure is the median over rounds.
Writes JSON with ``--out``.

The LTD variant is ``loss.ltd.mode=constraint`` with a targets file of random unit vectors
(``--ltd-dim``, 384 = all-MiniLM-L6-v2) written for the batch's captions with
``vlp.features.targets.write_targets`` and looked up per caption as the dataset does; it adds the
decoder MLP, the cosine reconstruction loss and the Lagrange multiplier's ascent step.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from vlp.config import PretrainConfig, load_config
from vlp.features.targets import LatentTargets, write_targets
from vlp.models.albef import ALBEF
from vlp.runs.training.assembly import build_reconstruction
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.pretrain import PretrainTask
from vlp.tasks.regulation import SRCLRegulator
from vlp.train.optim import build_optimizer

# name -> (loss.regulation, live helper, LTD with cached targets)
VARIANTS = {
    "plain": ("none", False, False),
    "srcl (cache)": ("srcl", False, False),
    "removal (cache)": ("removal", False, False),
    "srcl (live helper)": ("srcl", True, False),
    "ltd (cached targets)": ("none", False, True),
}


def captions(a) -> list[str]:
    """The benchmark batch's captions (its token ids are random; these name its rows)."""
    return [f"benchmark caption {i}" for i in range(a.batch)]


def write_random_targets(a, folder: Path) -> Path:
    """A ``vlp make-targets`` file of random unit vectors [batch, ltd_dim] for :func:`captions`."""
    g = torch.Generator().manual_seed(3)
    vectors = torch.nn.functional.normalize(torch.randn(a.batch, a.ltd_dim, generator=g), dim=1)
    return write_targets(folder / "targets.safetensors", captions(a), vectors, "benchmark-random", ["benchmark"])


def build(a, regulation: str, live: bool, device: torch.device, targets: Optional[LatentTargets] = None):
    ltd = ["loss.ltd.mode=constraint", f"loss.ltd.targets={targets.path}"] if targets is not None else []
    cfg = load_config(
        PretrainConfig,
        None,
        [
            f"model.vision.preset={a.preset}",
            f"model.text.preset={a.preset}",
            "model.text.init=random",
            "model.vision.pretrained=null",
            f"model.queue_size={a.queue}",
            f"loss.regulation={regulation}",
            "loss.srcl.delta=4.0",  # a calibrated-range value; the cost does not depend on it
            f"train.steps={10**6}",
            *ltd,
        ],
    )
    torch.manual_seed(0)
    model = ALBEF(cfg.model)
    reg = None
    if regulation != "none":
        helper = ALBEF(cfg.model) if live else None
        reg = SRCLRegulator(cfg.loss.srcl, regulation, cfg.train.steps, a.queue, cfg.model.embed_dim, helper=helper)
    rec = build_reconstruction(cfg.loss.ltd, cfg.model.embed_dim, targets, 30522) if targets is not None else None
    task = PretrainTask(model, cfg.loss, TokenInfo(30522, 103, (0, 101, 102)), regulator=reg, reconstruction=rec).to(
        device
    )
    return task, build_optimizer(task, cfg.train), cfg


def make_batch(a, cfg, device, with_helper: bool, targets: Optional[LatentTargets] = None):
    g = torch.Generator().manual_seed(1)
    res = {"tiny": 64, "small": 224, "base": 256}.get(a.preset, 256) if a.image_size is None else a.image_size
    ids = torch.randint(1000, 30000, (a.batch, a.text_len), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    b = {
        "images": torch.randn(a.batch, 3, res, res, generator=g),
        "input_ids": ids,
        "attention_mask": torch.ones(a.batch, a.text_len, dtype=torch.long),
        "image_ids": torch.arange(a.batch),
    }
    if with_helper:
        e = cfg.model.embed_dim
        b["helper_image"] = torch.nn.functional.normalize(torch.randn(a.batch, e, generator=g), dim=1)
        b["helper_text"] = torch.nn.functional.normalize(torch.randn(a.batch, e, generator=g), dim=1)
    if targets is not None:  # what the dataset does per caption
        b["ltd_target"] = torch.stack([targets.lookup(c) for c in captions(a)])
    return {k: v.to(device) for k, v in b.items()}


def run_steps(task, opt, batch, step0: int, n: int, device, dtype) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for s in range(step0, step0 + n):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            out = task(batch, step=s)
        out["loss"].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        task.after_optimizer_step(s + 1)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / max(n, 1)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny", choices=["tiny", "small", "base"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--queue", type=int, default=4096)
    p.add_argument("--text-len", type=int, default=30)
    p.add_argument("--image-size", type=int)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=5, help="steps per variant per round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--threads", type=int, help="torch.set_num_threads (default: torch's choice); 1 is steadier on a shared machine"
    )
    p.add_argument("--ltd-dim", type=int, default=384, help="LTD target dimension (all-MiniLM-L6-v2: 384)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--out")
    return p.parse_args(argv)


def warm_variants(
    a: argparse.Namespace, device: torch.device, dtype: Optional[torch.dtype], targets: Optional[LatentTargets]
) -> tuple[dict[str, list[Any]], Any]:
    """Each variant built and run for ``--warmup`` steps -> ({name: [task, optimizer, batch, next step,
    step times]}, the last variant's config)."""
    runs: dict[str, list[Any]] = {}
    cfg = None
    for name in a.variants:
        regulation, live, ltd = VARIANTS[name]
        task, opt, cfg = build(a, regulation, live, device, targets if ltd else None)
        task.train()
        batch = make_batch(
            a, cfg, device, with_helper=regulation != "none" and not live, targets=targets if ltd else None
        )
        run_steps(task, opt, batch, 0, a.warmup, device, dtype)
        runs[name] = [task, opt, batch, a.warmup, []]
    return runs, cfg


def run_rounds(
    a: argparse.Namespace, runs: dict[str, list[Any]], device: torch.device, dtype: Optional[torch.dtype]
) -> None:
    """``--rounds`` rounds of ``--steps`` steps of every variant (the order rotated each round), each
    round's seconds per step appended to its variant's times."""
    for r in range(a.rounds):
        order = a.variants[r % len(a.variants) :] + a.variants[: r % len(a.variants)]
        for name in order:
            task, opt, batch, step, times = runs[name]
            times.append(run_steps(task, opt, batch, step, a.steps, device, dtype))
            runs[name][3] = step + a.steps


def report_variants(runs: dict[str, list[Any]], result: dict[str, Any], base: Optional[float]) -> None:
    """Each variant's median ms per step and overhead against ``plain`` (median seconds ``base``) into
    ``result``, and its printed line."""
    for name, (_, _, _, _, times) in runs.items():
        med = statistics.median(times)
        result["ms_per_step"][name] = 1000 * med
        result["ms_per_step_rounds"][name] = [1000 * t for t in times]
        if base:
            result["overhead_pct"][name] = 100 * (med / base - 1)
            # each round's variants run back to back: per-round ratios show the spread of the overhead
            result.setdefault("overhead_pct_per_round", {})[name] = [
                100 * (t / tb - 1) for t, tb in zip(times, runs["plain"][4])
            ]
        spread = ""
        if base and name != "plain":
            pr = result["overhead_pct_per_round"][name]
            spread = f", per round {min(pr):+.1f}% to {max(pr):+.1f}%"
        print(
            f"{name:20s} {1000 * med:9.1f} ms/step"
            + (f"  {100 * (med / base - 1):+6.1f}%" if base else "")
            + f"  (rounds {1000 * min(times):.0f}-{1000 * max(times):.0f} ms{spread})"
        )


def median_ms(call: Callable[[], None], device: torch.device) -> float:
    """Median milliseconds of ``call`` over 60 calls, the first 10 left out (synchronised on CUDA)."""
    calls = []
    for _ in range(60):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        calls.append(time.perf_counter() - t)
    return 1000 * statistics.median(calls[10:])


def print_alone(label: str, ms: float, base: Optional[float]) -> None:
    """The printed line of a part's work alone: ms per step and its share of a plain step."""
    print(f"{label:20s} {ms:9.2f} ms/step" + (f"  {100 * ms / (1000 * base):+6.2f}% of a plain step" if base else ""))


def regulation_alone(
    a: argparse.Namespace, cfg: Any, reg_task: Any, device: torch.device, result: dict[str, Any], base: Optional[float]
) -> None:
    """The SRCL regulation's work alone (helper features, regulate, reading its statistics) into ``result``."""
    reg, c = reg_task.regulator, a.batch + a.queue
    g = torch.Generator().manual_seed(2)
    cos = (torch.rand(2, a.batch, c, generator=g) * 2 - 1).to(device)
    pos = torch.zeros(a.batch, c, dtype=torch.bool, device=device)
    pos[range(a.batch), range(a.batch)] = True
    hb = make_batch(a, cfg, device, with_helper=True)

    def call() -> None:
        h = reg.helper_features(hb, 0)
        r = reg.regulate(cos[0], cos[1], pos, pos, h, 0)
        float(r.stats["srcl_w_mean"])  # the loop reads the statistics once per step

    ms = median_ms(call, device)
    result["regulation_ms_per_step"] = ms
    if base:
        result["regulation_pct_of_plain_step"] = 100 * ms / (1000 * base)
    print_alone("regulation alone", ms, base)


def ltd_alone(
    a: argparse.Namespace,
    cfg: Any,
    run: list[Any],
    device: torch.device,
    dtype: Optional[torch.dtype],
    result: dict[str, Any],
    base: Optional[float],
) -> None:
    """LTD's work alone (decoder forward, cosine loss, backward, AdamW on the head, lambda ascent) into ``result``."""
    rec, e = run[0].reconstruction, cfg.model.embed_dim
    g = torch.Generator().manual_seed(4)
    emb = torch.nn.functional.normalize(torch.randn(a.batch, e, generator=g), dim=1).to(device).requires_grad_()
    l_con = torch.zeros((), device=device, requires_grad=True)
    lb = {"ltd_target": run[2]["ltd_target"]}
    head_opt = torch.optim.AdamW(rec.decoder.parameters(), lr=1e-4)

    def call() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss, stats = rec(l_con, emb, lb)
        loss.backward()
        head_opt.step()
        head_opt.zero_grad(set_to_none=True)
        rec.after_optimizer_step()
        float(stats["ltd_rec"])  # the loop reads the statistics once per step

    ms = median_ms(call, device)
    result["ltd_ms_per_step"] = ms
    result["ltd_head_params"] = sum(q.numel() for q in rec.decoder.parameters())
    if base:
        result["ltd_pct_of_plain_step"] = 100 * ms / (1000 * base)
    print_alone("ltd alone", ms, base)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if a.precision == "bf16" else None
    tmp = tempfile.TemporaryDirectory()
    targets = None
    if any(VARIANTS[n][2] for n in a.variants):
        targets = LatentTargets.load(write_random_targets(a, Path(tmp.name)))
    runs, cfg = warm_variants(a, device, dtype, targets)
    run_rounds(a, runs, device, dtype)
    base = statistics.median(runs["plain"][4]) if "plain" in runs else None
    result = {
        "device": torch.cuda.get_device_name()
        if device.type == "cuda"
        else f"CPU ({platform.processor() or 'cpu'}, {torch.get_num_threads()} threads)",
        "args": vars(a),
        "ms_per_step": {},
        "overhead_pct": {},
        "ms_per_step_rounds": {},
    }
    report_variants(runs, result, base)
    # The added work alone (no model), timed over many calls: the noise-free part of the overhead.
    reg_task = next((runs[n][0] for n in runs if VARIANTS[n] == ("srcl", False, False)), None)
    if reg_task is not None:
        regulation_alone(a, cfg, reg_task, device, result, base)
    ltd_name = next((n for n in runs if VARIANTS[n][2]), None)
    if ltd_name is not None:
        ltd_alone(a, cfg, runs[ltd_name], device, dtype, result, base)
    tmp.cleanup()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    from vlp.console import show_logs

    show_logs()  # vlp's log records printed as `vlp` prints them
    sys.exit(main())
