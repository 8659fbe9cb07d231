"""``vlp demo``: shapes world -> tiny ALBEF pretraining on CPU -> zero-shot retrieval -> table + plots."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Optional, Sequence

from vlp.config import PretrainConfig, load_config
from vlp.eval.metrics import chance_recall

DEMO_CONFIG = Path(__file__).parent / "configs" / "pretrain" / "shapes_tiny.yaml"
# NLVR2 statements of the full demo: the existence templates. A from-scratch tiny model learns them
# within the CPU budget; the counting comparisons ("more", "same", "total", "exactly") stay at
# chance in 750 steps and, mixed in, keep it from learning anything (docs/shapes_world.md).
DEMO_NLVR_TEMPLATES = ("both", "contains")


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


FINETUNE_CONFIGS = Path(__file__).parent / "configs" / "finetune"


def run_demo_full(out: str | Path, seed: int = 0, n_train: int = 4000, pretrain_steps: Optional[int] = None,
                  stage_overrides: Optional[dict[str, Sequence[str]]] = None, nlvr_ta: bool = False,
                  reuse: bool = False) -> dict:
    """World -> pretrain -> zero-shot retrieval -> fine-tune retrieval, VQA, NLVR2 (and the NLVR2
    text-only baseline) -> one table (``out/results.md``, ``out/results.json``).

    ``stage_overrides`` maps a stage (pretrain, retrieval, vqa, nlvr2, nlvr2_text_only, nlvr_ta) to
    dotted overrides. ``nlvr_ta``: run the optional text-assignment stage before NLVR2. ``reuse``:
    keep the stages an earlier (interrupted) run of the same command finished.
    """
    from vlp.cli import load_finetune_config
    from vlp.data.synthetic import generate_world
    from vlp.finetune import run_finetune
    from vlp.jobs import run_evaluate_retrieval, run_pretrain

    out, extra = Path(out), stage_overrides or {}
    t0 = time.perf_counter()
    times: dict[str, float] = {}

    def stage(name: str) -> None:
        times[name] = time.perf_counter()
        print(f"\n== [{len(times)}/8] {name} ({(times[name] - t0) / 60:.1f} min) ==", flush=True)

    stage("shapes world")
    w = generate_world(out / "world", seed=seed, n_train=n_train, n_val=200, n_test=1000,
                       nlvr_templates=DEMO_NLVR_TEMPLATES)
    stages = ("pretrain", "zero_shot", "retrieval", "vqa", "nlvr_ta", "nlvr2", "nlvr2_text_only")

    def finished(name: str) -> bool:  # a stage's last output, written after everything else
        done = {"pretrain": out / "pretrain" / "checkpoints", "zero_shot": out / "zero_shot" / "metrics.json"}
        path = done.get(name, out / name / "results.json")
        return path.is_file() or (path.is_dir() and any(path.glob("step_*/model.safetensors")))

    for d in stages:
        if not (reuse and finished(d)):
            shutil.rmtree(out / d, ignore_errors=True)
    stage("pretrain")
    if not finished("pretrain"):
        cfg = load_config(PretrainConfig, DEMO_CONFIG, [
            f"output_dir={out / 'pretrain'}", f"data.train=[{w['pretrain']}]", f"train.seed={seed}",
            *([f"train.steps={pretrain_steps}"] if pretrain_steps else []), *extra.get("pretrain", [])])
        run_pretrain(cfg)
    stage("zero-shot retrieval (pretrained checkpoint, pretraining resolution)")
    if not finished("zero_shot"):
        run_evaluate_retrieval(out / "pretrain", w["retrieval_test"], None, out / "zero_shot")
    zs = json.loads((out / "zero_shot" / "metrics.json").read_text())

    def finetune(task: str, name: str, pretrained: Path, files: list[str]) -> dict:
        stage(name)
        if finished(name):
            print(f"reusing {out / name} (finished earlier)")
            return json.loads((out / name / "results.json").read_text())
        c = load_finetune_config(task, str(FINETUNE_CONFIGS / f"shapes_{task.replace('-', '_')}.yaml"),
                                 [f"output_dir={out / name}", f"pretrained={pretrained}", f"train.seed={seed}",
                                  *files, *extra.get(name, [])])
        return run_finetune(c)

    ret = finetune("retrieval", "retrieval", out / "pretrain", [
        f"data.train=[{w['retrieval_train']}]", f"data.val={w['retrieval_val']}", f"data.test={w['retrieval_test']}"])
    vqa = finetune("vqa", "vqa", out / "pretrain", [
        f"data.train=[{w['vqa_train']}]", f"data.val={w['vqa_val']}", f"data.test={w['vqa_test']}",
        f"data.answer_list={w['answer_list']}"])
    nlvr_src = out / "pretrain"
    if nlvr_ta:
        finetune("nlvr-ta", "nlvr_ta", out / "pretrain", [f"data.train=[{w['pretrain']}]"])
        nlvr_src = out / "nlvr_ta"
    nlvr_files = [f"data.train=[{w['nlvr_train']}]", f"data.val={w['nlvr_dev']}", f"data.test={w['nlvr_test']}"]
    nlvr = finetune("nlvr2", "nlvr2", nlvr_src, nlvr_files)
    text_only = finetune("nlvr2", "nlvr2_text_only", nlvr_src, [*nlvr_files, "nlvr.text_only=true"])

    nlvr_kinds, text_only_name = ", ".join(DEMO_NLVR_TEMPLATES), "text-only model (images blanked)"
    rows = [
        ("retrieval (test, 1,000 images)", "r_mean", ret["test"]["r_mean"], "zero-shot, same checkpoint", zs["r_mean"]),
        ("retrieval (test)", "txt_r1", ret["test"]["txt_r1"], "zero-shot, same checkpoint", zs["txt_r1"]),
        ("retrieval (test)", "img_r1", ret["test"]["img_r1"], "zero-shot, same checkpoint", zs["img_r1"]),
        ("VQA (val, 600 questions)", "VQA accuracy", vqa["val"]["acc"], "most frequent answer per question type",
         vqa["val_baseline_most_frequent_per_type"]["acc"]),
        (f"NLVR2 (test, 2,000 statements: {nlvr_kinds})", "accuracy", nlvr["test"]["acc"], text_only_name,
         text_only["test"]["acc"]),
        (f"NLVR2 (dev, 400 statements: {nlvr_kinds})", "accuracy", nlvr["val"]["acc"], text_only_name,
         text_only["val"]["acc"]),
    ]
    lines = ["| task | metric | vlp tiny | baseline | baseline value | margin |", "|---|---|---:|---|---:|---:|"]
    lines += [f"| {t} | {m} | {v:.2f} | {b} | {bv:.2f} | {v - bv:+.2f} |" for t, m, v, b, bv in rows]
    table = "\n".join(lines)
    minutes = (time.perf_counter() - t0) / 60
    results = {"rows": [dict(task=t, metric=m, value=v, baseline=b, baseline_value=bv) for t, m, v, b, bv in rows],
               "zero_shot": zs, "retrieval": ret, "vqa": vqa, "nlvr2": nlvr, "nlvr2_text_only": text_only,
               "minutes": minutes, "stage_start_minutes": {k: (v - t0) / 60 for k, v in times.items()}}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(table + "\n")
    print(f"\n{table}\n\ntotal {minutes:.1f} min. Outputs under {out}/ (results.md, results.json, one folder per stage)")
    return results
