"""``vlp demo``: shapes world -> tiny ALBEF pretraining on CPU -> zero-shot retrieval -> table + plots."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Sequence

from vlp.config import PretrainConfig, load_config
from vlp.eval.metrics import chance_recall

DEMO_CONFIG = Path(__file__).parent / "configs" / "pretrain" / "shapes_tiny.yaml"


def chance_table(n_images: int, n_texts: int) -> dict[str, float]:
    """Chance level of every recall key for a random ranking."""
    per_image = n_texts // n_images
    out = {f"txt_r{k}": chance_recall(n_texts, per_image, k) for k in (1, 5, 10)}
    out |= {f"img_r{k}": chance_recall(n_images, 1, k) for k in (1, 5, 10)}
    out["txt_r_mean"] = sum(out[f"txt_r{k}"] for k in (1, 5, 10)) / 3
    out["img_r_mean"] = sum(out[f"img_r{k}"] for k in (1, 5, 10)) / 3
    out["r_mean"] = (out["txt_r_mean"] + out["img_r_mean"]) / 2
    out["rsum"] = sum(out[f"{d}_r{k}"] for d in ("txt", "img") for k in (1, 5, 10))
    return out


def format_table(metrics: dict[str, float], chance: dict[str, float]) -> str:
    lines = ["| metric | vlp tiny | chance | x chance |", "|---|---:|---:|---:|"]
    for k, c in chance.items():
        v = metrics[k]
        lines.append(f"| {k} | {v:.2f} | {c:.2f} | {v / c:.1f}x |")
    for k, v in metrics.items():
        if k.endswith("_rel") or k.endswith("_precision"):
            lines.append(f"| {k} | {v:.2f} | | |")
    return "\n".join(lines)


def run_demo(out: str | Path, seed: int = 0, n_train: int = 4000, overrides: Sequence[str] = ()) -> dict[str, float]:
    """Write the world, pretrain, evaluate on the 1,000-image test split; returns the metrics."""
    from vlp.data.synthetic import generate_world
    from vlp.jobs import run_evaluate_retrieval, run_pretrain
    from vlp.viz import plot_losses

    out = Path(out)
    t0 = time.perf_counter()
    world = out / "world"
    print(f"[1/3] shapes world -> {world}")
    paths = generate_world(world, seed=seed, n_train=n_train, n_val=200, n_test=1000)
    run_dir = out / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cfg = load_config(
        PretrainConfig, DEMO_CONFIG,
        [f"output_dir={run_dir}", f"data.train=[{paths['pretrain']}]", f"train.seed={seed}", *overrides],
    )
    print(f"[2/3] pretraining tiny ALBEF for {cfg.train.steps} steps (batch {cfg.data.batch_size}) on CPU")
    run_pretrain(cfg)
    t_train = time.perf_counter() - t0
    print("[3/3] zero-shot retrieval on the 1,000-image test split")
    res = run_evaluate_retrieval(run_dir, paths["retrieval_test"], paths["relevance_test"], out,
                                 graded_relevance=paths["relevance_graded_test"])
    plot_losses(run_dir / "metrics.jsonl", out / "loss_curves.png")
    n_img, n_txt = res.scores_i2t.shape
    chance = chance_table(n_img, n_txt)
    table = format_table(res.metrics, chance)
    (out / "results.md").write_text(table + "\n")
    (out / "chance.json").write_text(json.dumps(chance, indent=2))
    print()
    print(f"zero-shot retrieval, {n_img} test images / {n_txt} captions "
          f"(score: {cfg.eval.score}, k_test: {cfg.eval.k_test})")
    print(table)
    print(f"\ntrain {t_train / 60:.1f} min, total {(time.perf_counter() - t0) / 60:.1f} min. "
          f"Outputs: {out}/metrics.json, loss_curves.png, retrieval_examples.png")
    return res.metrics
