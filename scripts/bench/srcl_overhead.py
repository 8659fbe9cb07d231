"""Cost of SRCL per pretraining step: plain ITC vs SRCL (cached helper features) vs removal vs
SRCL with a live helper, on the full ALBEF step (ITC + ITM + MLM forward, backward, AdamW,
momentum update, queue writes).

    python scripts/bench/srcl_overhead.py --preset tiny --batch 64 --queue 4096        # CPU
    python scripts/bench/srcl_overhead.py --preset base --batch 64 --queue 65536 --precision bf16  # GPU

Variants run interleaved (round-robin, ``--steps`` steps each per round) on the same random
batch, so drifts in machine speed hit all of them alike; the figure is the median over rounds.
Writes JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch

from vlp.config import PretrainConfig, load_config
from vlp.models.albef import ALBEF
from vlp.tasks.objectives import TokenInfo
from vlp.tasks.pretrain import PretrainTask
from vlp.tasks.regulation import SRCLRegulator
from vlp.train.optim import build_optimizer

VARIANTS = {
    "plain": ("none", False),
    "srcl (cache)": ("srcl", False),
    "removal (cache)": ("removal", False),
    "srcl (live helper)": ("srcl", True),
}


def build(a, regulation: str, live: bool, device: torch.device):
    cfg = load_config(PretrainConfig, None, [
        f"model.vision.preset={a.preset}", f"model.text.preset={a.preset}", "model.text.init=random",
        "model.vision.pretrained=null", f"model.queue_size={a.queue}", f"loss.regulation={regulation}",
        f"train.steps={10 ** 6}"])
    torch.manual_seed(0)
    model = ALBEF(cfg.model)
    reg = None
    if regulation != "none":
        helper = ALBEF(cfg.model) if live else None
        reg = SRCLRegulator(cfg.loss.srcl, regulation, cfg.train.steps, a.queue, cfg.model.embed_dim, helper=helper)
    task = PretrainTask(model, cfg.loss, TokenInfo(30522, 103, (0, 101, 102)), regulator=reg).to(device)
    return task, build_optimizer(task, cfg.train), cfg


def make_batch(a, cfg, device, with_helper: bool):
    g = torch.Generator().manual_seed(1)
    res = {"tiny": 64, "small": 224, "base": 256}.get(a.preset, 256) if a.image_size is None else a.image_size
    ids = torch.randint(1000, 30000, (a.batch, a.text_len), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    b = {"images": torch.randn(a.batch, 3, res, res, generator=g), "input_ids": ids,
         "attention_mask": torch.ones(a.batch, a.text_len, dtype=torch.long),
         "image_ids": torch.arange(a.batch)}
    if with_helper:
        e = cfg.model.embed_dim
        b["helper_image"] = torch.nn.functional.normalize(torch.randn(a.batch, e, generator=g), dim=1)
        b["helper_text"] = torch.nn.functional.normalize(torch.randn(a.batch, e, generator=g), dim=1)
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
    return (time.perf_counter() - t) / n


def main(argv=None) -> int:
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
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--out")
    a = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if a.precision == "bf16" else None
    runs = {}
    for name in a.variants:
        regulation, live = VARIANTS[name]
        task, opt, cfg = build(a, regulation, live, device)
        task.train()
        batch = make_batch(a, cfg, device, with_helper=regulation != "none" and not live)
        run_steps(task, opt, batch, 0, a.warmup, device, dtype)
        runs[name] = [task, opt, batch, a.warmup, []]
    for r in range(a.rounds):
        order = a.variants[r % len(a.variants):] + a.variants[: r % len(a.variants)]
        for name in order:
            task, opt, batch, step, times = runs[name]
            times.append(run_steps(task, opt, batch, step, a.steps, device, dtype))
            runs[name][3] = step + a.steps
    base = statistics.median(runs["plain"][4]) if "plain" in runs else None
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({platform.processor() or 'cpu'}, "
              f"{torch.get_num_threads()} threads)", "args": vars(a), "ms_per_step": {}, "overhead_pct": {},
              "ms_per_step_rounds": {}}
    for name, (_, _, _, _, times) in runs.items():
        med = statistics.median(times)
        result["ms_per_step"][name] = 1000 * med
        result["ms_per_step_rounds"][name] = [1000 * t for t in times]
        if base:
            result["overhead_pct"][name] = 100 * (med / base - 1)
        print(f"{name:20s} {1000 * med:9.1f} ms/step" + (f"  {100 * (med / base - 1):+6.1f}%" if base else ""))
    # The added work alone (no model), timed over many calls: the noise-free part of the overhead.
    reg_task = next((runs[n][0] for n in runs if VARIANTS[n] == ("srcl", False)), None)
    if reg_task is not None:
        reg, e, c = reg_task.regulator, cfg.model.embed_dim, a.batch + a.queue
        g = torch.Generator().manual_seed(2)
        cos = (torch.rand(2, a.batch, c, generator=g) * 2 - 1).to(device)
        pos = torch.zeros(a.batch, c, dtype=torch.bool, device=device)
        pos[range(a.batch), range(a.batch)] = True
        hb = make_batch(a, cfg, device, with_helper=True)
        calls = []
        for i in range(60):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            h = reg.helper_features(hb, 0)
            r = reg.regulate(cos[0], cos[1], pos, pos, h, 0)
            float(r.stats["srcl_w_mean"])  # the loop reads the statistics once per step
            if device.type == "cuda":
                torch.cuda.synchronize()
            calls.append(time.perf_counter() - t)
        ms = 1000 * statistics.median(calls[10:])
        result["regulation_ms_per_step"] = ms
        if base:
            result["regulation_pct_of_plain_step"] = 100 * ms / (1000 * base)
        print(f"{'regulation alone':20s} {ms:9.2f} ms/step" + (f"  {100 * ms / (1000 * base):+6.2f}% of a plain step" if base else ""))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
