"""SRCL weights while alpha_h anneals with delta fixed (issue 40 part 3): does delta need to follow alpha_h?

    python scripts/experiments/srcl_anneal.py --out runs/srcl_anneal       # one seed, 150 + 250 CPU steps

1. writes a shapes world (object and count captions only, as the SRCL testbed: about 17% of the
   in-batch negatives are true false negatives) and a helper cache of the exact oracle noised to
   ROC-AUC 0.85 (``vlp cache-helper-features --oracle exact --oracle-auc 0.85``);
2. calibrates delta once at alpha_h = 1, as ``vlp analyze helper`` does: the delta at which the
   true false negatives' median weight is ``--target-weight`` (default 0.12, the paper's example);
3. warms a tiny ALBEF up with plain in-batch ITC, then trains it on with SRCL, alpha_h 1 -> 0
   over the run (the paper's schedule), delta fixed;
4. reads the SRCL statistics of every log window (``metrics.jsonl``: alpha_h, mean weight,
   N_eff / negatives, shares below 0.2 / 0.7, same-image weight) and, at every checkpoint, the
   weights of the true false and true negatives on fixed training batches at that checkpoint's
   alpha_h, with the delta that would put the false negatives' median weight back on the target
   there; the same at alpha_h 1 (the helper alone: its weights depend on the batch only, so this is
   also the control of a run that keeps alpha_h at 1) and at alpha_h 0 (the live model alone);
5. writes ``OUT/anneal.json`` (every number), ``OUT/report.md`` (the tables) and
   ``OUT/srcl_anneal.png`` (the statistics against alpha_h).

Steps whose output exists are skipped, so an interrupted run resumes. One seed on a toy world.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from harness import experiment_parser, prepare_world, train_once  # noqa: E402

from vlp.checkpoint import image_size, open_checkpoint  # noqa: E402
from vlp.data.datasets import Collator, ImageTextDataset  # noqa: E402
from vlp.data.formats import load_pairs  # noqa: E402
from vlp.eval.separation import roc_auc  # noqa: E402
from vlp.features.helper_cache import HelperCache  # noqa: E402
from vlp.lab.diagnostics import run_helper_diagnostics  # noqa: E402
from vlp.lab.oracle import WorldTruth, run_cache_oracle_features  # noqa: E402
from vlp.losses.srcl import (  # noqa: E402
    calibrate_delta_for_weight,
    effective_negatives,
    mixed_similarity,
    srcl_weights,
    weight_distribution,
)
from vlp.preprocess.transforms import test_transform  # noqa: E402
from vlp.tasks.regulation import helper_similarities  # noqa: E402
from vlp.train.logging import read_metrics  # noqa: E402
from vlp.train.preemption import exit_status  # noqa: E402
from vlp.weights import step_checkpoints  # noqa: E402
from vlp.world import write_caption_mix  # noqa: E402

PRESET = "configs/pretrain/shapes_tiny.yaml"
KINDS = ("object", "count")
BASE = ["loss.itm=0", "loss.mlm=0", "eval.score=itc", "train.progress=false", "data.num_workers=1"]
STATS = ("srcl_alpha_h", "srcl_w_mean", "srcl_n_eff_share", "srcl_w_below_0_2", "srcl_w_below_0_7", "srcl_w_same_image")


@torch.no_grad()
def probe_rows(ckpt_dir: Path, cache_dir: Path, root: Path, data: Path, n_batches: int, batch_size: int) -> dict:
    """Both ITC directions of ``n_batches`` fixed batches of ``data`` (in-batch negatives, eval
    transform) at a checkpoint: the live cosines (online anchors vs momentum columns, as the
    training step has them), the oracle helper's similarities (``cache_dir``), positives and true
    false negatives (the ground truth of the world at ``root``), each [2 * n_batches * B, B]."""
    ckpt = open_checkpoint(ckpt_dir)
    model, cfg, cache = ckpt.load(), ckpt.pretrain_config, HelperCache.load(cache_dir)
    truth = WorldTruth.load(root)
    dataset = ImageTextDataset(load_pairs([data]), test_transform(image_size(cfg), cfg.data.image), cache)
    collate = Collator(ckpt.tokenizer, cfg.model.text.max_len, cfg.data.text_padding)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0)).tolist()
    random.seed(0)  # the caption drawn for each item (the same batches at every checkpoint)
    pos = torch.eye(batch_size, dtype=torch.bool)
    out: dict[str, list[torch.Tensor]] = {"live": [], "helper": [], "fn": []}
    for k in range(n_batches):
        idx = order[k * batch_size : (k + 1) * batch_size]
        items = [dataset[i] for i in idx]
        b = collate(items)
        img = model.encode_image(b["images"]).feat
        txt = model.encode_text(b["input_ids"], b["attention_mask"]).feat
        img_m = model.encode_image(b["images"], momentum=True).feat
        txt_m = model.encode_text(b["input_ids"], b["attention_mask"], momentum=True).feat
        empty = torch.zeros(0, 1)
        h_i2t, h_t2i = helper_similarities(b["helper_image"], b["helper_text"], empty, empty, cache.relevance)
        rel = torch.from_numpy(
            truth.relevance([it["caption"] for it in items], [dataset.samples[i].image for i in idx])
        )
        out["live"] += [img @ txt_m.T, txt @ img_m.T]
        out["helper"] += [h_i2t, h_t2i]
        out["fn"] += [(rel.T == 1.0) & ~pos, (rel == 1.0) & ~pos]  # i2t: caption j true of image i
    rows = {k: torch.cat(v) for k, v in out.items()}
    rows["positives"] = pos.repeat(2 * n_batches, 1)
    return rows


def weights_at(rows: dict[str, torch.Tensor], alpha_h: float, delta: float, target: float) -> dict[str, Any]:
    """The weights of the probe rows at ``alpha_h`` and ``delta``: the true false negatives' and
    true negatives' distributions, N_eff / negatives, the ROC-AUC of the mixed similarity at telling
    them apart (pooled over the rows), and the delta that would give the false negatives the median
    weight ``target`` at this alpha_h (None: out of reach)."""
    pos, fn = rows["positives"], rows["fn"]
    s = mixed_similarity(rows["live"], rows["helper"], alpha_h)
    w = srcl_weights(s, pos, "softmax", delta)
    try:
        delta_target: Optional[float] = calibrate_delta_for_weight(s, pos, fn, target)
    except ValueError:
        delta_target = None
    return {
        "alpha_h": alpha_h,
        "false_negatives": weight_distribution(w[fn]),
        "true_negatives": weight_distribution(w[~pos & ~fn]),
        "negatives": weight_distribution(w[~pos]),
        "n_eff_share": float(effective_negatives(w, pos)["srcl_n_eff_share"]),
        "auc": roc_auc(s[~pos], fn[~pos]),  # how well the mixed similarity tells false from true negatives
        "delta_for_target": delta_target,
        # the true negatives if delta were re-calibrated here
        "true_negatives_at_target": None
        if delta_target is None
        else weight_distribution(srcl_weights(s, pos, "softmax", delta_target)[~pos & ~fn]),
    }


def plot(windows: list[dict], probes: list[dict], out: Path) -> Path:
    """The log windows' statistics against alpha_h, and the probes': the false negatives' median
    weight and the delta that would restore it, at the schedule's alpha_h and at the helper alone."""
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.4))
    a = [r["srcl_alpha_h"] for r in windows]
    for key, ax in (("srcl_w_below_0_7", 0), ("srcl_w_below_0_2", 0), ("srcl_n_eff_share", 1)):
        axes[ax].plot(a, [r.get(key) for r in windows], marker=".", label=f"{key} (log windows)")
    same = [(x, r["srcl_w_same_image"]) for x, r in zip(a, windows) if r.get("srcl_w_same_image") is not None]
    axes[2].plot([p[0] for p in same], [p[1] for p in same], ".", label="same-image negatives (log windows)")
    x = [p["alpha_h"] for p in probes]
    for name, sel, style in (("at alpha_h", lambda p: p, "ko-"), ("helper alone", lambda p: p["helper_only"], "k^--")):
        axes[1].plot(x, [sel(p)["n_eff_share"] for p in probes], style, label=f"probes, {name}")
        axes[2].plot(x, [sel(p)["false_negatives"]["median"] for p in probes], style, label=f"true FN median, {name}")
        axes[3].plot(x, [sel(p)["delta_for_target"] for p in probes], style, label=name)
    axes[3].set_yscale("log")
    titles = (
        "shares of negatives below 0.2 / 0.7",
        "N_eff / negatives",
        "false negatives' weight",
        "delta for the target",
    )
    for ax, t in zip(axes, titles):
        ax.set_title(t)
        ax.set_xlabel("alpha_h")
        ax.invert_xaxis()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def window_table(rows: list[dict], every: int) -> list[str]:
    """Markdown rows of every ``every``-th log window (and the last): the SRCL statistics."""
    lines = ["| step | alpha_h | mean w | N_eff / neg | below 0.2 | below 0.7 | same-image w |", "|---:" * 7 + "|"]
    for r in rows[::every] + ([rows[-1]] if (len(rows) - 1) % every else []):
        cells = [f"{r[k]:.3f}" if r.get(k) is not None else "-" for k in STATS]
        lines.append(f"| {r['step']} | " + " | ".join(cells) + " |")
    return lines


def at_target(r: dict) -> str:
    """The true negatives' median weight and share below 0.7 at the re-calibrated delta."""
    tn = r["true_negatives_at_target"]
    return "-" if tn is None else f"{tn['median']:.3f} / {tn['below_0_7']:.3f}"


def probe_table(probes: list[dict]) -> list[str]:
    """Markdown rows of the probes: at each checkpoint, the weights at the schedule's alpha_h, at
    the helper alone (alpha_h 1) and at the live model alone (alpha_h 0), with delta fixed, and the
    delta that would give the true false negatives the target median weight there."""
    lines = [
        "| step | similarity | alpha_h | AUC FN vs TN | FN median w | FN below 0.2 | TN median w | below 0.7 | "
        "N_eff / neg | delta for the target | TN median / below 0.7 at it |",
        "|---:|---|" + "---:|" * 9,
    ]
    for q in probes:
        for name, r in (("schedule", q), ("helper alone", q["helper_only"]), ("live alone", q["live_only"])):
            fn, tn, d = r["false_negatives"], r["true_negatives"], r["delta_for_target"]
            lines.append(
                f"| {q['step']} | {name} | {r['alpha_h']:.2f} | {r['auc']:.3f} | {fn['median']:.3f} | {fn['below_0_2']:.3f} | "
                f"{tn['median']:.3f} | {r['negatives']['below_0_7']:.3f} | {r['n_eff_share']:.3f} | "
                f"{'-' if d is None else f'{d:.2f}'} | {at_target(r)} |"
            )
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    p = experiment_parser(__doc__, out="runs/srcl_anneal", steps=250)
    p.set_defaults(images=2000, test_images=100, seeds=[0])
    p.add_argument("--warmup-steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--auc", type=float, default=0.85, help="ROC-AUC of the noised oracle helper")
    p.add_argument("--target-weight", type=float, default=0.12)
    p.add_argument("--probe-batches", type=int, default=8)
    p.add_argument("--ckpt-every", type=int, default=50)
    a = p.parse_args(argv)
    out, seed, t0 = Path(a.out), a.seeds[0], time.time()
    root = prepare_world(out, a.images, a.test_images)
    mix = root / f"pretrain_kinds_{'+'.join(KINDS)}.json"
    if not mix.exists():
        write_caption_mix(root, KINDS, seed=0)
    cache = out / f"cache_oracle_auc{a.auc:g}"
    if not cache.exists():
        run_cache_oracle_features(root, [mix], cache, auc=a.auc, seed=0)
    diag_file = out / "diagnostics" / "helper_diagnostics.json"
    if not diag_file.exists():
        run_helper_diagnostics(
            cache, root, mix, diag_file.parent, batch_size=a.batch_size, target_weight=a.target_weight
        )
    diag = json.loads(diag_file.read_text())
    delta = diag["delta"]["target_weight"]
    base = [*BASE, f"data.batch_size={a.batch_size}", f"train.seed={seed}", "model.queue_size=0"]
    warm = train_once(out / "warmup", PRESET, mix, a.warmup_steps, base)
    srcl = [
        "loss.regulation=srcl",
        f"loss.srcl.helper_features={cache}",
        f"loss.srcl.delta={delta}",
        "loss.distill=false",
    ]
    extra = [f"init_from={warm}", *srcl, "loss.srcl.alpha_h_end=0.0", "train.log_every=10"]
    run = train_once(out / "anneal", PRESET, mix, a.steps, [*base, *extra, f"train.ckpt_every={a.ckpt_every}"])
    windows = [r for r in read_metrics(run / "metrics.jsonl") if r.get("srcl_alpha_h") is not None]
    print(f"anneal: done ({time.time() - t0:.0f} s)", flush=True)
    ckpts = [(0, step_checkpoints(warm)[-1])] + [(int(c.name.split("_")[-1]), c) for c in step_checkpoints(run)]
    probes = []
    for step, c in ckpts:
        rows = probe_rows(c, cache, root, mix, a.probe_batches, a.batch_size)
        probes.append({"step": step, **weights_at(rows, 1.0 - step / a.steps, delta, a.target_weight)})
        probes[-1]["helper_only"] = weights_at(rows, 1.0, delta, a.target_weight)
        probes[-1]["live_only"] = weights_at(rows, 0.0, delta, a.target_weight)
    result = {"delta": delta, "helper_auc": diag["helper_auc"], "args": vars(a), "windows": windows, "probes": probes}
    (out / "anneal.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    plot(windows, probes, out / "srcl_anneal.png")
    lines = [
        f"# SRCL weights as alpha_h anneals, delta {delta:.3f} fixed (calibrated at alpha_h 1)",
        "",
        f"Shapes world, {a.images} training images, object and count captions; helper: exact oracle noised to AUC "
        f"{a.auc:g} (measured {diag['helper_auc']['in_batch']:.3f}); batch {a.batch_size}, in-batch negatives; "
        f"{a.warmup_steps} warm-up steps of plain ITC, then {a.steps} SRCL steps, alpha_h 1 -> 0; seed {seed}; "
        f"{time.time() - t0:.0f} s.",
    ]
    lines += ["", "## Log windows (metrics.jsonl)", "", *window_table(windows, 5)]
    lines += ["", f"## Probes: {a.probe_batches} fixed training batches at the checkpoints", "", *probe_table(probes)]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(exit_status(main, "srcl_anneal.py"))
