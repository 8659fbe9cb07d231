"""A few steps of every downstream task through the command line, from a tiny pretrained checkpoint."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import FT, QUICK, TINY_ALBEF, splits
from vlp.checkpoint import load_model
from vlp.cli import main
from vlp.models.albef import ALBEF
from vlp.models.nlvr import NLVRModel
from vlp.models.vqa import VQAModel

WORLD = dict(seed=5, n_train=32, n_val=6, n_test=8)
PRETRAIN = [*TINY_ALBEF, "model.queue_size=32", "model.embed_dim=32", *QUICK, "train.steps=2"]


def _ft(task, world, pretrained, out, *extra):
    cfg = f"configs/finetune/shapes_{task.replace('-', '_')}.yaml"
    head = ["pretrain", "nlvr-ta"] if task == "nlvr-ta" else ["finetune", task]
    return main([*head, "--config", cfg, f"output_dir={out}", f"pretrained={pretrained}", *FT, *extra])


def test_retrieval_finetune_runs_validates_and_keeps_best(world, pretrained, tmp_path, capsys):
    out = tmp_path / "ret"
    assert _ft("retrieval", world, pretrained, out, *splits(world, "retrieval"), "eval.k_test=4") == 0
    val = [json.loads(line) for line in (out / "val_metrics.jsonl").read_text().splitlines()]
    assert [v["step"] for v in val] == [2, 4]
    best = max(val, key=lambda v: v["r_mean"])  # ties keep the first
    state = json.loads((out / "checkpoints" / "best" / "state.json").read_text())
    assert state["best"]["step"] == best["step"] and state["best"]["value"] == pytest.approx(best["r_mean"])
    assert state["task"] == "retrieval" and state["model"]["vision"]["img_size"] == 80
    res = json.loads((out / "results.json").read_text())
    assert set(res) >= {"val", "test"} and 0 <= res["test"]["r_mean"] <= 100
    assert (out / "test" / "retrieval_examples.png").is_file()
    # the fine-tuned checkpoint is a retrieval ALBEF (no MLM head) at 80 px: pos_embed 1 + 10x10
    sd = load_file(str(out / "checkpoints" / "step_0000004" / "model.safetensors"))
    assert sd["vision.pos_embed"].shape[1] == 101 and not any(k.startswith("mlm_head") for k in sd)
    assert (sd["queue.ids"] >= -100).all() and (sd["queue.ids"] != -100).sum() == 4 * 8  # 4 steps x batch 8
    model, cfg, _ = load_model(out / "checkpoints" / "best", torch.device("cpu"))
    assert isinstance(model, ALBEF) and model.mlm_head is None and cfg.model.vision.img_size == 80
    # its evaluation preprocessing is saved next to the model: 80 px, the fine-tuning run's data.max_len
    pre = json.loads((out / "checkpoints" / "best" / "preprocessor.json").read_text())
    assert (pre["image_size"], pre["max_len"], pre["caption_cleaning"]) == (80, 32, "pre_caption")
    # and it evaluates like any checkpoint; the ALBEF protocol preset takes exactly this kind
    ev = ["evaluate", "retrieval", "--data", str(world["retrieval_test"])]
    best = ["--checkpoint", str(out / "checkpoints" / "best"), "--preset", "albef-flickr"]
    assert main([*ev, *best, "--out", str(tmp_path / "ev")]) == 2  # k_test 128 > the 8 test images: refused up front
    assert "config key 'eval.k_test': 128 candidates per query" in capsys.readouterr().err
    assert not (tmp_path / "ev").exists()
    assert main([*ev, *best, "--out", str(tmp_path / "ev"), "eval.k_test=8"]) == 0
    m = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert (m["k_test"], m["score"], m["image_size"], m["checkpoint_kind"]) == (8, "itm", 80, "retrieval")
    assert main([*ev, "--checkpoint", str(out), "--out", str(tmp_path / "x"), "--preset", "zero-shot"]) == 2
    assert (
        main(
            [
                *ev,
                "--checkpoint",
                str(pretrained),
                "--out",
                str(tmp_path / "zs"),
                "--preset",
                "zero-shot",
                "eval.k_test=4",
            ]
        )
        == 0
    )
    m = json.loads((tmp_path / "zs" / "metrics.json").read_text())
    assert (m["image_size"], m["score"], m["checkpoint_kind"]) == (64, "itm", "pretrain")


def test_vqa_finetune_writes_official_predictions(world, pretrained, tmp_path):
    out = tmp_path / "vqa"
    assert _ft("vqa", world, pretrained, out, *splits(world, "vqa"), f"data.answer_list={world['answer_list']}") == 0
    res = json.loads((out / "results.json").read_text())
    assert 0 <= res["val"]["acc"] <= 100 and "acc" in res["val_baseline_most_frequent_per_type"]
    # the world's answers are plain words and digits: the leave-one-out average can only lower the score
    assert 0 < res["val"]["acc_official"] <= res["val"]["acc"] + 1e-6
    preds = json.loads((out / "vqa_test_predictions.json").read_text())
    test_q = json.loads(world["vqa_test"].read_text())
    answers = set(json.loads(world["answer_list"].read_text()))
    assert [p["question_id"] for p in preds] == [q["question_id"] for q in test_q]
    assert all(set(p) == {"question_id", "answer"} and p["answer"] in answers for p in preds)
    model, _, _ = load_model(out, torch.device("cpu"))
    assert isinstance(model, VQAModel)
    pre = json.loads((out / "checkpoints" / "step_0000004" / "preprocessor.json").read_text())
    assert pre["caption_cleaning"] == "pre_question" and pre["answer_max_len"] is not None


def test_nlvr_text_assignment_then_finetune(world, pretrained, tmp_path):
    ta = tmp_path / "ta"
    assert _ft("nlvr-ta", world, pretrained, ta, f"data.train=[{world['pretrain']}]") == 0
    ta_state = load_file(str(ta / "checkpoints" / "step_0000004" / "model.safetensors"))
    assert not any(k.startswith("momentum.twin.") for k in ta_state) and "ta_head.weight" in ta_state
    out = tmp_path / "nlvr"
    assert _ft("nlvr2", world, ta, out, *splits(world, "nlvr", "dev")) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["test"]["n"] == len(json.loads(world["nlvr_test"].read_text())) and 0 <= res["test"]["acc"] <= 100
    model, _, _ = load_model(out, torch.device("cpu"))
    assert isinstance(model, NLVRModel) and len(model.fusion.layer) == 2
    # momentum twins exist in the fine-tuned checkpoint (created after loading the TA weights)
    sd = load_file(str(out / "checkpoints" / "step_0000004" / "model.safetensors"))
    assert any(k.startswith("momentum.twin.fusion.layer.1.") for k in sd)


def test_finetune_errors_name_the_key(world, pretrained, tmp_path, capsys):
    assert (
        main(
            [
                "finetune",
                "retrieval",
                "--config",
                "configs/finetune/shapes_retrieval.yaml",
                f"data.train=[{world['retrieval_train']}]",
            ]
        )
        == 2
    )
    assert "'pretrained'" in capsys.readouterr().err
    assert main(["finetune", "vqa", "--config", "configs/finetune/shapes_retrieval.yaml"]) == 2
    assert "config key 'task' is 'retrieval'" in capsys.readouterr().err
    assert (
        main(
            [
                "finetune",
                "vqa",
                "--config",
                "configs/finetune/shapes_vqa.yaml",
                f"pretrained={pretrained}",
                f"output_dir={tmp_path / 'v'}",
                f"data.train=[{world['vqa_train']}]",
            ]
        )
        == 2
    )
    assert "data.answer_list" in capsys.readouterr().err


def test_retrieval_finetune_with_ltd_and_srcl(world, pretrained, tmp_path):
    targets = tmp_path / "targets.safetensors"
    assert main(["make-targets", "--data", str(world["retrieval_train"]), "--out", str(targets)]) == 0
    out = tmp_path / "ret_ltd"
    train = f"data.train=[{world['retrieval_train']}]"
    ltd = ["loss.ltd.mode=constraint", f"loss.ltd.targets={targets}"]
    srcl = ["loss.regulation=srcl", "loss.srcl.delta=1.0"]
    assert _ft("retrieval", world, pretrained, out, train, *ltd, *srcl, "loss.ltd.hidden=32") == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("ltd_rec" in r and "ltd_lambda" in r for r in rows), rows[0].keys()
    assert all(r["srcl_alpha_h"] == 0.0 for r in rows)  # fine-tuning regulates with the live model only
    assert all(0.0 <= r["ltd_rec"] <= 2.0 for r in rows)
    task_state = load_file(str(out / "checkpoints" / "step_0000004" / "task_state.safetensors"))
    assert any(k.startswith("reconstruction.") for k in task_state)
    assert not (out / "val_metrics.jsonl").exists()  # no data.val: no validation, no best checkpoint


def test_retrieval_finetune_reports_val_and_test_in_eval_mode(world, pretrained, tmp_path):
    """Text dropout 0.3 and learning rate 0 (the weights never change): every validation and the
    final val / test evaluation of the best checkpoint give the scores of an eval-mode evaluation
    (the model left in train mode by the loop is switched to eval mode, and back)."""
    from vlp.runs.evaluation.image_text_retrieval import run_evaluate_retrieval

    out = tmp_path / "ret_dropout"
    still = ["model_overrides=[text.dropout=0.3]", "train.lr=0", "train.min_lr=0", "train.warmup_lr=0"]
    extra = [*splits(world, "retrieval"), "eval.k_test=4", *still, "eval.itm_batch_size=16"]
    assert _ft("retrieval", world, pretrained, out, *extra) == 0
    val = [json.loads(line) for line in (out / "val_metrics.jsonl").read_text().splitlines()]
    res = json.loads((out / "results.json").read_text())
    best = out / "checkpoints" / "best"
    assert json.loads((best / "state.json").read_text())["model"]["text"]["dropout"] == 0.3
    for v in val:
        assert {k: v[k] for k in res["val"]} == res["val"]  # same weights, same metrics, every time
    for name in ("val", "test"):
        ref = run_evaluate_retrieval(
            best,
            world[f"retrieval_{name}"],
            None,
            tmp_path / f"ref_{name}",
            overrides=["eval.batch_size=16"],
            show_progress=False,
        )
        assert ref.metrics == res[name]
