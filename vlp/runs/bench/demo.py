"""``vlp demo``: shapes world -> tiny ALBEF pretraining on CPU -> zero-shot retrieval -> table + plots;
``--full``: + fine-tuned retrieval, VQA and NLVR2 against their baselines, one table.

A demo holds its ``--out`` folder for its life (:func:`vlp.locks.lock_folder`) and never deletes a
folder that holds a checkpoint: without ``resume`` such a folder is refused in one line; with it
(``vlp demo --resume auto``, what a stopped demo advises and ``make demo`` passes) the interrupted
training continues from its checkpoint and finished stages are kept."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Optional, Sequence

from vlp.config import PretrainConfig, load_config, load_finetune_config
from vlp.errors import ConfigError
from vlp.eval.metrics import chance_recall
from vlp.kinds import GROUNDING, NLVR2, NLVR_TA, PRETRAIN, RETRIEVAL, VE, VQA
from vlp.locks import lock_folder, releasing_folders
from vlp.metrics_table import format_table

CONFIGS = Path(__file__).parents[2] / "configs"  # vlp/configs
DEMO_CONFIG = CONFIGS / "pretrain" / "shapes_tiny.yaml"
FINETUNE_CONFIGS = CONFIGS / "finetune"
#: ``make demo``'s settings on top of :data:`DEMO_CONFIG`, chosen by the runs in docs/experiments.md
#: ("The demo as a showcase"): 48 px images (a step costs about 0.82 of a 64 px one, so 500 steps
#: take the time of 400), and retrieval ranked by the ITC cosine alone, since the ITM head does not
#: leave its prior from scratch within the 2-core budget and its logit only adds noise to the ranking.
DEMO_OVERRIDES = ("model.vision.img_size=48", "train.steps=500", "eval.score=itc")
#: Training captions of ``make demo``: every kind, the scene caption (the one that names every
#: object) listed 4 times, so it is drawn about half the time (``vlp make-world --caption-kinds
#: scene:4,object,relation,count``).
DEMO_CAPTION_REPEATS = {"scene": 4}
# NLVR2 statements of the full demo: the existence templates. A from-scratch tiny model learns them
# within the CPU budget; the counting comparisons ("more", "same", "total", "exactly") stay at
# chance in 750 steps and, mixed in, keep it from learning anything (docs/shapes_world.md).
DEMO_NLVR_TEMPLATES = ("both", "contains")
#: the stages of ``vlp demo --full`` that write a folder of their own under ``out``
FULL_STAGES = (
    PRETRAIN,
    "zero_shot",
    RETRIEVAL,
    VQA,
    "nlvr_ta",
    NLVR2,
    "nlvr2_text_only",
    VE,
    "ve_hypothesis_only",
    GROUNDING,
    "classification",
)
#: the zero-shot classification splits of the full demo, each with an ITM re-rank of the top 3
CLASSIFICATION_ATTRS = ("shape", "colour", "count")
CLASSIFICATION_RERANK_K = 3
#: SNLI-VE in the full demo: one epoch over the world's training triples (3 per image)
DEMO_VE_OVERRIDES = ("train.epochs=1",)


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


def demo_table(metrics: dict[str, float], chance: dict[str, float]) -> str:
    """The demo's table (:func:`vlp.metrics_table.format_table`): each recall against its chance
    level and their ratio, then the relevance-aware metrics and those by caption kind."""
    rows: list[tuple] = [(k, metrics[k], c, f"{metrics[k] / c:.1f}x") for k, c in chance.items()]
    rows += [(k, v, None, None) for k, v in metrics.items() if k.endswith(("_rel", "_precision", "_map_at_r"))]
    by_kind = ("img_r1@scene", "img_r5@scene", "img_r10@scene", "img_r5_rel@generic")
    rows += [(k, metrics[k], None, None) for k in by_kind if k in metrics]
    return format_table(("metric", "vlp tiny", "chance", "x chance"), rows, right=(False, True, True, True))


def has_checkpoints(folder: Path) -> bool:
    """Whether ``folder`` (a run directory) holds a checkpoint: ``checkpoints/step_*`` or ``best``."""
    ckpts = folder / "checkpoints"
    return ckpts.is_dir() and any(p.name.startswith("step_") or p.name == "best" for p in ckpts.iterdir())


def refuse_to_clear(folder: Path) -> ConfigError:
    """The error for a demo folder that holds checkpoints and was not asked to resume (it is kept)."""
    return ConfigError(
        f"vlp demo: {folder} holds the checkpoints of an earlier demo run; continue it with --resume auto "
        "(the same command otherwise), or remove that folder (or choose another --out) to start again"
    )


def clear_run(run_dir: Path, cfg: PretrainConfig) -> None:
    """Make ``run_dir`` ready for the demo's pretraining per ``cfg``: resuming, keep it (nothing there
    yet: start from step 0, ``train.resume`` dropped); else refuse a folder that holds a checkpoint
    (:func:`refuse_to_clear`) and remove one that holds none (a run stopped before its first)."""
    if cfg.train.resume:
        if not run_dir.is_dir():
            print(f"vlp demo: nothing to resume in {run_dir}; starting")
            cfg.train.resume = None
        return
    if has_checkpoints(run_dir):
        raise refuse_to_clear(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)


def run_demo(
    out: str | Path,
    seed: int = 0,
    n_train: int = 4000,
    overrides: Sequence[str] = (),
    n_test: int = 1000,
    resume: bool = False,
) -> dict[str, float]:
    """Write the world and its demo caption mix (:data:`DEMO_CAPTION_REPEATS`), pretrain with
    :data:`DEMO_CONFIG` + :data:`DEMO_OVERRIDES` + ``overrides``, evaluate on the ``n_test``-image
    test split; returns the metrics. ``resume`` (or ``train.resume=auto`` in ``overrides``): continue
    the pretraining an earlier demo under ``out`` left (a finished one trains no step); else a run
    folder holding a checkpoint is refused, never deleted (:func:`clear_run`)."""
    with releasing_folders():
        lock_folder(out, "--out")  # one demo per folder
        return _run_demo(Path(out), seed, n_train, overrides, n_test, resume)


def _run_demo(
    out: Path, seed: int, n_train: int, overrides: Sequence[str], n_test: int, resume: bool
) -> dict[str, float]:
    """:func:`run_demo` in the folder it holds."""
    from vlp.runs.evaluation.image_text_retrieval import run_evaluate_retrieval
    from vlp.viz import plot_losses
    from vlp.world import generate_world, write_caption_mix
    from vlp.world.captions import CAPTION_KINDS

    t0 = time.perf_counter()
    world = out / "world"
    print(f"[1/3] shapes world -> {world}")
    paths = generate_world(world, seed=seed, n_train=n_train, n_val=200, n_test=n_test)
    mix = write_caption_mix(world, CAPTION_KINDS, seed=seed, repeats=DEMO_CAPTION_REPEATS)
    run_dir = out / "run"
    cfg = load_config(
        PretrainConfig,
        DEMO_CONFIG,
        [
            f"output_dir={run_dir}",
            f"data.train=[{mix.path}]",
            f"train.seed={seed}",
            *DEMO_OVERRIDES,
            *(["train.resume=auto"] if resume else []),
            *overrides,
        ],
    )
    clear_run(run_dir, cfg)
    print(f"[2/3] pretraining tiny ALBEF for {cfg.train.steps} steps (batch {cfg.data.batch_size}) on CPU")
    _pretrain(cfg, run_dir)
    t_train = time.perf_counter() - t0
    print(f"[3/3] zero-shot retrieval on the {n_test:,}-image test split")
    res = run_evaluate_retrieval(
        run_dir,
        paths["retrieval_test"],
        paths["relevance_test"],
        out,
        graded_relevance=paths["relevance_graded_test"],
        caption_groups=world / "caption_kinds_test.json",
    )
    plot_losses(run_dir / "metrics.jsonl", out / "loss_curves.png")
    n_img, n_txt = res.scores_i2t.shape
    chance = chance_table(n_img, n_txt)
    table = demo_table(res.metrics, chance)
    (out / "results.md").write_text(table + "\n")
    (out / "chance.json").write_text(json.dumps(chance, indent=2))
    print()
    print(
        f"zero-shot retrieval, {n_img} test images / {n_txt} captions "
        f"(score: {cfg.eval.score}, k_test: {cfg.eval.k_test})"
    )
    print(table)
    print(
        f"\ntrain {t_train / 60:.1f} min, total {(time.perf_counter() - t0) / 60:.1f} min. "
        f"Outputs: {out}/metrics.json, loss_curves.png, retrieval_examples.png"
    )
    return res.metrics


def _pretrain(cfg: PretrainConfig, run_dir: Path) -> None:
    """The demo's pretraining; a resume refused for a changed config says how to start the demo again."""
    from vlp.runs.training.pretrain import run_pretrain

    try:
        run_pretrain(cfg)
    except ConfigError as e:
        if not cfg.train.resume or "config key 'train.resume'" not in str(e):
            raise
        raise ConfigError(f"{e}; or start the demo again: remove {run_dir} or choose another --out") from None


class FullDemo:
    """The stages of ``vlp demo --full`` under ``out``: their start times, which an earlier run
    finished, and the fine-tuning stages. ``resume``: finished stages are kept and an interrupted
    training stage continues from its checkpoint; without it a stage folder holding a checkpoint is
    refused, never deleted (:meth:`clear`)."""

    def __init__(
        self, out: Path, seed: int, stage_overrides: dict[str, Sequence[str]], resume: bool, n_stages: int
    ) -> None:
        self.out, self.seed, self.extra, self.resume, self.n_stages = out, seed, stage_overrides, resume, n_stages
        self.t0 = time.perf_counter()
        self.times: dict[str, float] = {}

    def stage(self, name: str) -> None:
        self.times[name] = time.perf_counter()
        print(
            f"\n== [{len(self.times)}/{self.n_stages}] {name} ({(self.times[name] - self.t0) / 60:.1f} min) ==",
            flush=True,
        )

    def finished(self, name: str) -> bool:
        """Whether the stage's last output, written after everything else, is there. Pretraining is
        never taken as finished: its run resumes (a finished one trains no step), so one stopped at
        a checkpoint is not mistaken for one that ran its steps."""
        if name == PRETRAIN:
            return False
        done = {"zero_shot": self.out / "zero_shot" / "metrics.json"}
        return done.get(name, self.out / name / "results.json").is_file()

    def clear(self) -> None:
        """Without ``resume``: remove every stage's folder, or, when one holds a checkpoint, nothing
        (:func:`refuse_to_clear`). With ``resume``: keep them all."""
        if self.resume:
            return
        held = [self.out / d for d in FULL_STAGES if has_checkpoints(self.out / d)]
        if held:
            raise refuse_to_clear(held[0])
        for d in FULL_STAGES:
            shutil.rmtree(self.out / d, ignore_errors=True)

    def resume_overrides(self, name: str) -> list[str]:
        """``train.resume=auto`` for a training stage ``name`` an earlier run began (its folder is
        there) and did not finish, under ``resume``; else nothing."""
        begun = self.resume and (self.out / name).is_dir() and not self.finished(name)
        return ["train.resume=auto"] if begun else []

    def classification(self, pretrained: Path, world: dict[str, Path]) -> dict:
        """Stage ``classification``: zero-shot classification of the test split by each of
        :data:`CLASSIFICATION_ATTRS`, by ITC and with the ITM re-rank of the top
        :data:`CLASSIFICATION_RERANK_K`; its results (``classification/results.json``)."""
        from vlp.runs.evaluation.zero_shot_classification import run_evaluate_classification

        name = "classification"
        self.stage("zero-shot classification")
        done = self.out / name / "results.json"
        if self.finished(name):
            print(f"reusing {self.out / name} (finished earlier)")
            return json.loads(done.read_text())
        res = {
            attr: run_evaluate_classification(
                pretrained,
                world[f"classification_{attr}_test"],
                self.out / name / attr,
                classes=world[f"classification_{attr}_classes"],
                templates=world[f"classification_{attr}_templates"],
                rerank_k=CLASSIFICATION_RERANK_K,
            )
            for attr in CLASSIFICATION_ATTRS
        }
        done.write_text(json.dumps(res, indent=2))
        return res

    def finetune(self, task: str, name: str, pretrained: Path, files: list[str]) -> dict:
        """Stage ``name``: fine-tune ``task`` from ``pretrained`` on ``files`` (overrides); its results."""
        from vlp.runs.training.finetune import run_finetune

        out = self.out
        self.stage(name)
        if self.finished(name):
            print(f"reusing {out / name} (finished earlier)")
            return json.loads((out / name / "results.json").read_text())
        c = load_finetune_config(
            task,
            str(FINETUNE_CONFIGS / f"shapes_{task.replace('-', '_')}.yaml"),
            [
                f"output_dir={out / name}",
                f"pretrained={pretrained}",
                f"train.seed={self.seed}",
                *files,
                *self.resume_overrides(name),
                *self.extra.get(name, []),
            ],
        )
        return run_finetune(c)


def run_demo_full(
    out: str | Path,
    seed: int = 0,
    n_train: int = 4000,
    pretrain_steps: Optional[int] = None,
    stage_overrides: Optional[dict[str, Sequence[str]]] = None,
    nlvr_ta: bool = False,
    reuse: bool = False,
    n_val: int = 200,
    n_test: int = 1000,
    resume: bool = False,
) -> dict:
    """World -> pretrain -> zero-shot retrieval -> fine-tune retrieval, VQA, NLVR2 (and the NLVR2
    text-only baseline) -> one table (``out/results.md``, ``out/results.json``).

    ``stage_overrides`` maps a stage (pretrain, zero_shot, retrieval, vqa, nlvr2, nlvr2_text_only,
    nlvr_ta, ve, ve_hypothesis_only, grounding) to dotted overrides. ``nlvr_ta``: run the optional
    text-assignment stage before NLVR2. ``resume`` (``reuse``, its older name): keep the stages an
    earlier (interrupted) run of the same command finished and continue the one it was in from its
    checkpoint; without it a stage folder holding a checkpoint is refused, never deleted
    (:meth:`FullDemo.clear`).
    """
    from vlp.world import generate_world

    out = Path(out)
    with releasing_folders():
        lock_folder(out, "--out")  # one demo per folder
        n_stages = 1 + len(FULL_STAGES) - (not nlvr_ta)  # the world, then every stage run
        demo = FullDemo(out, seed, stage_overrides or {}, resume or reuse, n_stages)
        demo.clear()  # before anything is written: a refusal leaves the folder as it was
        demo.stage("shapes world")
        w = generate_world(
            out / "world", seed=seed, n_train=n_train, n_val=n_val, n_test=n_test, nlvr_templates=DEMO_NLVR_TEMPLATES
        )
        results = {"zero_shot": _pretrain_and_zero_shot(demo, w, pretrain_steps)}
        results.update(_finetune_stages(demo, w, nlvr_ta))
        results["classification"] = demo.classification(out / PRETRAIN, w)
        return write_full_results(demo, results)


def _pretrain_and_zero_shot(demo: FullDemo, w: dict[str, Path], pretrain_steps: Optional[int]) -> dict:
    """Stages ``pretrain`` (on the world's pretraining file ``w["pretrain"]``; ``pretrain_steps``
    overrides the config's) and ``zero_shot`` (retrieval on ``w["retrieval_test"]`` by the pretrained
    checkpoint), each skipped where an earlier run finished it. Returns the zero-shot metrics
    (``zero_shot/metrics.json``)."""
    from vlp.runs.evaluation.image_text_retrieval import run_evaluate_retrieval

    out, seed = demo.out, demo.seed
    demo.stage(PRETRAIN)
    cfg = load_config(
        PretrainConfig,
        DEMO_CONFIG,
        [
            f"output_dir={out / PRETRAIN}",
            f"data.train=[{w[PRETRAIN]}]",
            f"train.seed={seed}",
            *([f"train.steps={pretrain_steps}"] if pretrain_steps else []),
            *demo.resume_overrides(PRETRAIN),
            *demo.extra.get(PRETRAIN, []),
        ],
    )
    _pretrain(cfg, out / PRETRAIN)
    demo.stage("zero-shot retrieval (pretrained checkpoint, pretraining resolution)")
    if not demo.finished("zero_shot"):
        run_evaluate_retrieval(
            out / PRETRAIN, w["retrieval_test"], None, out / "zero_shot", overrides=demo.extra.get("zero_shot", [])
        )
    return json.loads((out / "zero_shot" / "metrics.json").read_text())


def _finetune_stages(demo: FullDemo, w: dict[str, Path], nlvr_ta: bool) -> dict:
    """The fine-tuning stages from the pretrained checkpoint on the world's files ``w``: retrieval,
    VQA, (the optional NLVR text assignment, ``nlvr_ta``, then) NLVR2 and its text-only baseline,
    VE and its hypothesis-only baseline, grounding. Returns stage name -> its results, in that order."""
    out = demo.out
    results: dict[str, dict] = {}
    results[RETRIEVAL] = demo.finetune(
        RETRIEVAL,
        RETRIEVAL,
        out / PRETRAIN,
        [f"data.train=[{w['retrieval_train']}]", f"data.val={w['retrieval_val']}", f"data.test={w['retrieval_test']}"],
    )
    results[VQA] = demo.finetune(
        VQA,
        VQA,
        out / PRETRAIN,
        [
            f"data.train=[{w['vqa_train']}]",
            f"data.val={w['vqa_val']}",
            f"data.test={w['vqa_test']}",
            f"data.answer_list={w['answer_list']}",
        ],
    )
    nlvr_src = out / PRETRAIN
    if nlvr_ta:
        demo.finetune(NLVR_TA, "nlvr_ta", out / PRETRAIN, [f"data.train=[{w[PRETRAIN]}]"])
        nlvr_src = out / "nlvr_ta"
    nlvr_files = [f"data.train=[{w['nlvr_train']}]", f"data.val={w['nlvr_dev']}", f"data.test={w['nlvr_test']}"]
    results[NLVR2] = demo.finetune(NLVR2, NLVR2, nlvr_src, nlvr_files)
    results["nlvr2_text_only"] = demo.finetune(NLVR2, "nlvr2_text_only", nlvr_src, [*nlvr_files, "nlvr.text_only=true"])
    ve_files = [f"data.train=[{w['ve_train']}]", f"data.val={w['ve_dev']}", f"data.test={w['ve_test']}"]
    results[VE] = demo.finetune(VE, VE, out / PRETRAIN, [*ve_files, *DEMO_VE_OVERRIDES])
    results["ve_hypothesis_only"] = demo.finetune(
        VE, "ve_hypothesis_only", out / PRETRAIN, [*ve_files, *DEMO_VE_OVERRIDES, "ve.hypothesis_only=true"]
    )
    results[GROUNDING] = demo.finetune(
        GROUNDING,
        GROUNDING,
        out / PRETRAIN,
        [f"data.train=[{w['grounding_train']}]", f"data.val={w['grounding_val']}", f"data.test={w['grounding_test']}"],
    )
    return results


def full_rows(r: dict) -> list[tuple]:
    """(task, metric, value, baseline, baseline value) of the full demo's table."""
    ret, vqa, nlvr, text_only, zs = r[RETRIEVAL], r[VQA], r[NLVR2], r["nlvr2_text_only"], r["zero_shot"]
    nlvr_kinds, text_only_name = ", ".join(DEMO_NLVR_TEMPLATES), "text-only model (images blanked)"
    return [
        ("retrieval (test, 1,000 images)", "r_mean", ret["test"]["r_mean"], "zero-shot, same checkpoint", zs["r_mean"]),
        ("retrieval (test)", "txt_r1", ret["test"]["txt_r1"], "zero-shot, same checkpoint", zs["txt_r1"]),
        ("retrieval (test)", "img_r1", ret["test"]["img_r1"], "zero-shot, same checkpoint", zs["img_r1"]),
        (
            "VQA (val, 600 questions)",
            "VQA accuracy",
            vqa["val"]["acc"],
            "most frequent answer per question type",
            vqa["val_baseline_most_frequent_per_type"]["acc"],
        ),
        (
            f"NLVR2 (test, {nlvr['test']['n']:,} statements: {nlvr_kinds})",
            "accuracy",
            nlvr["test"]["acc"],
            text_only_name,
            text_only["test"]["acc"],
        ),
        (
            f"NLVR2 (dev, {nlvr['val']['n']:,} statements: {nlvr_kinds})",
            "accuracy",
            nlvr["val"]["acc"],
            text_only_name,
            text_only["val"]["acc"],
        ),
        *ve_rows(r[VE], r["ve_hypothesis_only"]),
        *grounding_rows(r[GROUNDING]),
        *classification_rows(r["classification"]),
    ]


def ve_rows(ve: dict, hypothesis_only: dict) -> list[tuple]:
    """The SNLI-VE rows: test accuracy against the hypothesis-only model and the majority class."""
    task = f"SNLI-VE (test, {ve['test']['n']:,} triples)"
    return [
        (task, "accuracy", ve["test"]["acc"], "hypothesis-only model (images blanked)", hypothesis_only["test"]["acc"]),
        (task, "accuracy", ve["test"]["acc"], f"majority class ({ve['majority_class']})", ve["test"]["majority_acc"]),
    ]


def grounding_rows(res: dict) -> list[tuple]:
    """The grounding rows: test accuracy (Grad-CAM box, IoU >= 0.5) against a random candidate and
    the best fixed position fitted on the training boxes."""
    test = res["test"]
    task = f"grounding (test, {test['n']:,} expressions)"
    rows = [(task, "accuracy", test["accuracy"], "random candidate", test["random_candidate"])]
    if test.get("fixed_position"):
        rows.append((task, "accuracy", test["accuracy"], "best fixed position", test["fixed_position"]["accuracy"]))
    return rows


def classification_rows(res: dict) -> list[tuple]:
    """Zero-shot classification rows: top-1 by ITC and after the ITM re-rank, against the majority class."""
    rows = []
    for attr, rec in res.items():
        task = f"zero-shot classification: {attr} (test, {rec['n_images']:,} images, {rec['n_classes']} classes)"
        majority = f"majority class ({rec['classes'][rec['chance']['majority_class']]})"
        rows.append((task, "top-1 (ITC)", rec["itc"]["top1"], majority, rec["chance"]["majority"]))
        rerank = f"top-1 (ITM re-rank of the top {rec['rerank_k']})"
        rows.append((task, rerank, rec["rerank"]["top1"], majority, rec["chance"]["majority"]))
    return rows


def write_full_results(demo: FullDemo, stages: dict) -> dict:
    """The full demo's table (``results.md``, printed) and ``results.json`` (rows, every stage's
    results, minutes); returns the latter."""
    rows = full_rows(stages)
    header = ("task", "metric", "vlp tiny", "baseline", "baseline value", "margin")
    table = format_table(
        header,
        [(t, m, v, b, bv, f"{v - bv:+.2f}") for t, m, v, b, bv in rows],
        right=(False, False, True, False, True, True),
    )
    minutes = (time.perf_counter() - demo.t0) / 60
    results = {
        "rows": [dict(task=t, metric=m, value=v, baseline=b, baseline_value=bv) for t, m, v, b, bv in rows],
        **{k: stages[k] for k in FULL_STAGES if k not in (PRETRAIN, "nlvr_ta")},  # the stages with results
        "minutes": minutes,
        "stage_start_minutes": {k: (v - demo.t0) / 60 for k, v in demo.times.items()},
    }
    (demo.out / "results.json").write_text(json.dumps(results, indent=2))
    (demo.out / "results.md").write_text(table + "\n")
    print(
        f"\n{table}\n\ntotal {minutes:.1f} min. Outputs under {demo.out}/ (results.md, results.json, one folder per stage)"
    )
    return results
