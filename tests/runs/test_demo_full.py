"""``vlp demo --full`` wired end to end on a tiny world: every stage runs, the table has a row per
task with its baseline, and a rerun with ``reuse`` keeps the finished stages."""

from __future__ import annotations

import json
from pathlib import Path

from vlp.runs.bench.demo import CLASSIFICATION_ATTRS, FULL_STAGES, run_demo_full

PRETRAIN = ["model.vision.depth=1", "model.text.layers=1", "model.text.fusion_layers=1", "model.embed_dim=32"]
FINETUNE = ["train.epochs=null", "train.steps=2", "train.progress=false", "data.num_workers=0", "data.batch_size=8"]


def test_full_demo_runs_every_stage_and_writes_one_table(tmp_path: Path, capsys) -> None:
    stages = {name: list(FINETUNE) for name in FULL_STAGES if name not in ("pretrain", "zero_shot", "classification")}
    stages["pretrain"] = [*PRETRAIN, "train.progress=false", "data.num_workers=0", "data.batch_size=8"]
    stages["vqa"] = [*FINETUNE, "vqa.k_test=4"]
    stages["retrieval"] = [*FINETUNE, "eval.k_test=4"]
    stages["zero_shot"] = ["eval.k_test=4"]
    res = run_demo_full(tmp_path, n_train=16, n_val=4, n_test=8, pretrain_steps=2, stage_overrides=stages)
    headers = [line.split("]")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("== [")]
    n = len(FULL_STAGES)  # the world and every stage but the optional text-assignment one
    assert headers == [f"== [{i}/{n}" for i in range(1, n + 1)]
    tasks = [r["task"] for r in res["rows"]]
    assert sum(t.startswith("SNLI-VE (test") for t in tasks) == 2
    for attr in CLASSIFICATION_ATTRS:
        rows = [r for r in res["rows"] if r["task"].startswith(f"zero-shot classification: {attr} ")]
        assert [r["metric"] for r in rows] == ["top-1 (ITC)", "top-1 (ITM re-rank of the top 3)"]
        rec = res["classification"][attr]
        assert rows[0]["value"] == rec["itc"]["top1"] and rows[0]["baseline_value"] == rec["chance"]["majority"]
        assert rows[0]["baseline"] == f"majority class ({rec['classes'][rec['chance']['majority_class']]})"
    ground = [r for r in res["rows"] if r["task"].startswith("grounding (test")]
    assert [r["baseline"] for r in ground] == ["random candidate", "best fixed position"]
    assert ground[0]["value"] == res["grounding"]["test"]["accuracy"]
    ve, hyp = res["ve"], res["ve_hypothesis_only"]
    assert hyp["hypothesis_only"] is True and ve["hypothesis_only"] is False
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == res["rows"]
    table = (tmp_path / "results.md").read_text().splitlines()
    assert len(table) == 2 + len(res["rows"])
    # a rerun with reuse keeps every finished stage (same results, nothing retrained)
    stamp = (tmp_path / "ve" / "results.json").stat().st_mtime_ns
    again = run_demo_full(tmp_path, n_train=16, n_val=4, n_test=8, pretrain_steps=2, stage_overrides=stages, reuse=True)
    assert again["rows"] == res["rows"] and (tmp_path / "ve" / "results.json").stat().st_mtime_ns == stamp
