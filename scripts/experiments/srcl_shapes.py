"""SRCL on the shapes world: plain ITC vs SRCL (softmax, mean) vs removal, over seeds, equal compute.

    python scripts/experiments/srcl_shapes.py --out runs/srcl_shapes

1. writes a shapes world and a pretraining file in which ``--generic-share`` of the images are
   captioned only generically (object / relation / count captions, each true of many images:
   false negatives of one another within a batch);
2. trains the helper once with plain InfoNCE on the clean scene captions (``helper.json``) and
   caches its features of the pretraining file;
3. calibrates the softmax sharpness delta on helper similarities (methods.md §1.4: ~20% of the
   negatives below 0.7) and measures, with the world's ground truth, the weights that true false
   negatives and true negatives get;
4. pretrains every variant for every seed with identical data order, steps and model, evaluates
   zero-shot retrieval on the test split (standard and relevance-aware R@k, R-precision), and
   writes ``OUT/results.json`` and ``OUT/report.md`` (mean ± std over seeds).

Every step is skipped when its output already exists, so an interrupted run resumes.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import torch
from harness import Sweep, experiment_parser, prepare_world, results_table, write_report

from vlp.config import PretrainConfig, load_config
from vlp.data.formats import load_pairs
from vlp.data.helper_cache import HelperCache
from vlp.data.synthetic import caption_matches, scene_from_dict, write_generic_mix
from vlp.eval.report import SeedResults, slug
from vlp.losses.srcl import calibrate_delta, srcl_weights
from vlp.runs.features import run_cache_helper_features
from vlp.runs.pretrain import run_train_helper
from vlp.train.preemption import exit_status
from vlp.viz import plot_weight_histogram
from vlp.weights import read_state, step_checkpoints

VARIANTS = {
    "plain ITC": ["loss.regulation=none"],
    "SRCL softmax": ["loss.regulation=srcl", "loss.srcl.norm=softmax"],
    "SRCL mean": ["loss.regulation=srcl", "loss.srcl.norm=mean"],
    "removal (ALBEF++)": ["loss.regulation=removal", "loss.srcl.norm=softmax"],  # threshold: --threshold
    "removal 0.7": ["loss.regulation=removal", "loss.srcl.norm=softmax"],  # ~20% of negatives dropped at start
    "SRCL softmax delta=4": ["loss.regulation=srcl", "loss.srcl.norm=softmax", "loss.srcl.delta=4.0"],  # sharper
}
THRESHOLDS = {"removal 0.7": 0.7}
METRICS = (
    "txt_r1 txt_r5 img_r1 img_r5 img_r10 img_r1_rel img_r5_rel txt_r1_rel img_r_precision txt_r_precision"
).split()


def sample_batches(mix: Path, cache: HelperCache, batch: int, batches: int, seed: int):
    """Random training batches of the pretraining file: (samples, drawn captions, helper
    image features [B, E], helper text features [B, E])."""
    samples = load_pairs([str(mix)])
    rng = random.Random(seed)
    for _ in range(batches):
        picked = rng.sample(samples, batch)
        caps = [rng.choice(s.captions) for s in picked]
        img = torch.stack([cache.image[cache.image_index[s.image_key]] for s in picked])
        txt = torch.stack([cache.text[cache.text_index[c]] for c in caps])
        yield picked, caps, img, txt


def diagnose_weights(
    root: Path, mix: Path, cache: HelperCache, batch: int, batches: int, delta: float, plot: Path
) -> dict:
    """Helper-only SRCL weights (alpha_h = 1) of true false negatives vs true negatives, using the
    world's ground truth (a caption is a false negative of an image if it is true of it)."""
    records = json.loads((root / "scenes.json").read_text())["splits"]["train"]
    preds = {c["text"]: c["predicate"] for r in records for c in r["captions"]}
    scenes = {Path(r["image"]).name: scene_from_dict(r) for r in records}
    pos = torch.eye(batch, dtype=torch.bool)
    fn_w, tn_w = [], []
    for picked, caps, img, txt in sample_batches(mix, cache, batch, batches, seed=0):
        w = srcl_weights(torch.exp(img @ txt.T), pos, "softmax", delta)
        truth = torch.tensor([[caption_matches(preds[c], scenes[Path(p.image).name]) for c in caps] for p in picked])
        fn_w.append(w[truth & ~pos])
        tn_w.append(w[~truth])
    fn_w, tn_w = torch.cat(fn_w), torch.cat(tn_w)
    neg = batches * batch * (batch - 1)
    plot_weight_histogram(
        torch.cat([fn_w, tn_w]),
        plot,
        f"helper-only SRCL weights (alpha_h = 1, delta = {delta:.2f}), {batches} batches of {batch}",
        {"true false negatives": fn_w, "true negatives": tn_w},
    )
    return {
        "delta": delta,
        "false_negative_share": len(fn_w) / neg,
        "false_negative_weight_mean": fn_w.mean().item() if len(fn_w) else float("nan"),
        "false_negative_weight_median": fn_w.median().item() if len(fn_w) else float("nan"),
        "true_negative_weight_mean": tn_w.mean().item(),
        "false_negatives_below_0.2": (fn_w < 0.2).float().mean().item() if len(fn_w) else float("nan"),
        "true_negatives_below_0.2": (tn_w < 0.2).float().mean().item(),
        "all_below_0.7": torch.cat([fn_w, tn_w]).lt(0.7).float().mean().item(),
    }


def calibrate(mix: Path, cache: HelperCache, batch: int, batches: int) -> float:
    s = [torch.exp(img @ txt.T) for _, _, img, txt in sample_batches(mix, cache, batch, batches, seed=1)]
    return calibrate_delta(torch.cat(s), torch.eye(batch, dtype=torch.bool).repeat(len(s), 1))


def report(table: str, diag, args, n_seeds: int, minutes: float) -> str:
    d = diag
    return "\n".join(
        [
            f"Shapes world: {args.images} training images, generic-caption share {args.generic_share}, "
            f"{args.steps} steps x batch {args.batch_size}, objectives `{args.objectives}`, {n_seeds} seeds, "
            f"{minutes:.0f} min on this machine. Removal thresholds: `removal (ALBEF++)` {args.threshold}, "
            "`removal 0.7` 0.7. Retrieval: zero-shot on the 1,000-image test split, ITC scores "
            "(`eval.score=itc`) for `--objectives itc`.",
            "",
            f"Helper-only weights (alpha_h = 1) on {args.calib_batches} training batches of {args.batch_size}: delta = "
            f"{d['delta']:.3f}; true false negatives are {100 * d['false_negative_share']:.1f}% of the in-batch negatives "
            f"and get mean weight {d['false_negative_weight_mean']:.3f} (median {d['false_negative_weight_median']:.3f}, "
            f"{100 * d['false_negatives_below_0.2']:.1f}% below 0.2); true negatives get {d['true_negative_weight_mean']:.3f} "
            f"({100 * d['true_negatives_below_0.2']:.1f}% below 0.2); {100 * d['all_below_0.7']:.1f}% of all negatives "
            "fall below 0.7.",
            "",
            table,
        ]
    )


def main(argv=None) -> int:
    p = experiment_parser(
        __doc__,
        out="runs/srcl_shapes",
        steps=250,
        data_options=lambda p: p.add_argument("--generic-share", type=float, default=0.5),
    )
    p.add_argument("--helper-steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--objectives",
        choices=["itc", "albef"],
        default="itc",
        help="itc: ITC only (the term SRCL changes; fast); albef: ITC + ITM + MLM",
    )
    p.add_argument("--threshold", type=float, default=0.2, help="removal threshold (paper optimum 0.2-0.3)")
    p.add_argument("--delta", type=float, help="softmax sharpness (default: calibrated on the helper)")
    p.add_argument("--calib-batches", type=int, default=20)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument(
        "--helper-data",
        choices=["clean", "all"],
        default="clean",
        help="clean: scene captions only (helper.json, the paper's setting); all: every caption kind",
    )
    p.add_argument("--diagnose-only", action="store_true", help="helper, cache and weight diagnosis; no training")
    a = p.parse_args(argv)
    out = Path(a.out)
    t0 = time.time()
    root = prepare_world(out, a.images, a.test_images)
    mix = write_generic_mix(root, a.generic_share, seed=0)
    base = ["data.batch_size=" + str(a.batch_size), "train.progress=false", "data.num_workers=1"]

    tag = "" if a.helper_data == "clean" else "_all"
    helper_dir = out / f"helper{tag}"
    saved = step_checkpoints(helper_dir)
    if not saved or read_state(saved[-1])["step"] < a.helper_steps:  # none yet, or an interrupted run: resume it
        helper_data = root / ("helper.json" if a.helper_data == "clean" else "pretrain.json")
        cfg = load_config(
            PretrainConfig,
            "configs/helper/shapes_tiny.yaml",
            [
                f"output_dir={helper_dir}",
                f"data.train=[{helper_data}]",
                f"train.steps={a.helper_steps}",
                *base,
                *(["train.resume=auto"] if saved else []),
            ],
        )
        run_train_helper(cfg)
    cache_dir = out / f"helper{tag}_cache_{a.generic_share:g}"
    if not cache_dir.exists():
        run_cache_helper_features(helper_dir, [str(mix)], cache_dir)
    cache = HelperCache.load(cache_dir)
    delta = a.delta if a.delta is not None else calibrate(mix, cache, a.batch_size, a.calib_batches)
    diag = diagnose_weights(
        root, mix, cache, a.batch_size, a.calib_batches, delta, out / f"helper{tag}_weights_g{a.generic_share:g}.png"
    )
    diag["helper_data"] = a.helper_data
    print("weights:", json.dumps(diag))
    (out / f"helper{tag}_weights_g{a.generic_share:g}.json").write_text(json.dumps(diag, indent=1))
    if a.diagnose_only:
        return 0

    objectives = ["loss.itm=0", "loss.mlm=0", "eval.score=itc"] if a.objectives == "itc" else []
    results = SeedResults(out / f"results{tag}.json")
    Sweep(
        results,
        root,
        "configs/pretrain/shapes_tiny.yaml",
        mix,
        a.steps,
        run_dir=lambda name, seed: out / f"g{a.generic_share:g}{tag}_{slug(name)}_seed{seed}",
        overrides=lambda name: [
            *base,
            *objectives,
            f"loss.srcl.helper_features={cache_dir}",
            f"loss.srcl.delta={delta}",
            f"loss.srcl.threshold={THRESHOLDS.get(name, a.threshold)}",
            *VARIANTS[name],
        ],
        summary=lambda m: f"IR@5 {m['img_r5']:.2f} IR@5_rel {m['img_r5_rel']:.2f} TR@5 {m['txt_r5']:.2f}",
        name_width=18,
        t0=t0,
    ).run(a.seeds, a.variants)
    minutes = (time.time() - t0) / 60
    write_report(
        out / f"report{tag}.md", report(results_table(results, a.seeds, METRICS), diag, a, len(a.seeds), minutes)
    )
    return 0


if __name__ == "__main__":
    sys.exit(exit_status(main, "srcl_shapes.py"))
