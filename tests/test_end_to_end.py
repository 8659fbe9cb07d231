"""A short pretrain + evaluate run through the command line, on a small shapes world."""

import json

import pytest
import yaml

from tests.helpers import pretrain
from vlp.cli import main
from vlp.train.logging import read_metrics

PRETRAIN = [
    "model.vision.depth=2",
    "model.text.layers=1",
    "model.text.fusion_layers=1",
    "model.queue_size=64",
    "data.batch_size=16",
    "data.num_workers=0",
    "train.steps=30",
    "train.log_every=5",
    "train.warmup_steps=5",
    "train.lr=5e-4",
    "train.progress=false",
    "loss.alpha_ramp_steps=10",
]
WORLD = dict(seed=3, n_train=96, n_val=8, n_test=24)


def test_pretrain_writes_run_dir_and_learns(pretrained):
    cfg = yaml.safe_load((pretrained / "config.yaml").read_text())
    assert cfg["train"]["steps"] == 30 and cfg["model"]["vision"]["depth"] == 2
    rows = read_metrics(pretrained / "metrics.jsonl")
    assert [r["step"] for r in rows] == [5, 10, 15, 20, 25, 30]
    assert all(r["pairs_per_s"] > 0 for r in rows)
    first, last = rows[0], rows[-1]
    assert last["mlm"] < first["mlm"] - 1.0  # from ~ln(30522) = 10.3 towards the caption vocabulary
    assert last["loss"] < first["loss"]
    assert last["alpha"] == pytest.approx(0.4)  # ramp over 10 steps is complete
    assert 0.001 <= last["temp"] <= 0.5
    assert (pretrained / "checkpoints" / "step_0000030" / "model.safetensors").is_file()
    state = json.loads((pretrained / "checkpoints" / "step_0000030" / "state.json").read_text())
    assert state["step"] == 30 and state["task"] == "pretrain"


def test_evaluate_retrieval_cli(pretrained, world, tmp_path):
    out = tmp_path / "eval"
    rc = main(
        [
            "evaluate",
            "retrieval",
            "--checkpoint",
            str(pretrained),
            "--data",
            str(world["retrieval_test"]),
            "--relevance",
            str(world["relevance_test"]),
            "--caption-groups",
            str(world["caption_kinds_test"]),
            "--out",
            str(out),
            "eval.k_test=4",
            "eval.score=itm",
        ]
    )
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    # per caption kind: one scene caption per image, four generic ones
    assert m["n_queries@scene"] == 24 and m["n_queries@generic"] == 96
    assert 0.0 <= m["img_r_precision@generic"] <= 100.0
    keys = "txt_r1 txt_r5 txt_r10 txt_r_mean img_r1 img_r5 img_r10 img_r_mean r_mean rsum".split()
    assert all(k in m for k in keys)
    assert all(0.0 <= m[k] <= 100.0 for k in keys if k != "rsum")
    assert m["txt_r1"] <= m["txt_r5"] <= m["txt_r10"] and m["img_r1"] <= m["img_r5"] <= m["img_r10"]
    assert m["r_mean"] == pytest.approx((m["txt_r_mean"] + m["img_r_mean"]) / 2)
    # relevance-aware recall counts every true image, so it can only be higher
    assert m["img_r1_rel"] >= m["img_r1"] and m["img_r5_rel"] >= m["img_r5"]
    assert 0.0 <= m["img_r_precision"] <= 100.0
    assert m["n_images"] == 24 and m["n_texts"] == 120 and m["k_test"] == 4 and m["score"] == "itm"
    assert (out / "retrieval_examples.png").stat().st_size > 10_000


def test_cli_user_errors_are_one_clear_line(world, tmp_path, capsys):
    rc = main(["pretrain", "--config", "configs/pretrain/shapes_tiny.yaml", "train.stepz=3"])
    assert rc == 2
    assert "train.stepz" in capsys.readouterr().err
    bad = tmp_path / "ann.json"
    bad.write_text(json.dumps([{"image": "nope.png", "caption": "a red circle"}]))
    rc = main(
        [
            "pretrain",
            "--config",
            "configs/pretrain/shapes_tiny.yaml",
            f"data.train=[{bad}]",
            f"output_dir={tmp_path / 'r'}",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "ann.json entry 0" in err and "nope.png" in err
    rc = main(["evaluate", "retrieval", "--checkpoint", str(tmp_path), "--data", "x.json", "--out", str(tmp_path)])
    assert rc == 2 and "no checkpoint here" in capsys.readouterr().err
    rc = main(["make-world", "--out", str(tmp_path / "w"), "--images", "2", "--nlvr-templates", "both,fewer"])
    assert rc == 2 and "--nlvr-templates 'both,fewer': NLVR templates ['fewer']" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()  # refused before any file is written


def test_existing_run_is_never_overwritten(pretrained, world, capsys):
    before = (pretrained / "metrics.jsonl").read_bytes()
    rc = pretrain(pretrained, world["pretrain"], *PRETRAIN)
    assert rc == 2 and "already holds a run" in capsys.readouterr().err
    assert (pretrained / "metrics.jsonl").read_bytes() == before
