"""``vlp demo``'s path on a tiny world: the weighted caption mix, the showcase overrides, the table."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.helpers import table_rows
from vlp.runs.bench.demo import DEMO_CAPTION_REPEATS, DEMO_OVERRIDES, run_demo

TINY = ["train.steps=2", "model.vision.depth=1", "data.num_workers=0", "train.log_every=1", "eval.k_test=4"]


def test_demo_trains_on_the_weighted_mix_with_the_showcase_settings(tmp_path: Path) -> None:
    metrics = run_demo(tmp_path, n_train=16, n_test=8, overrides=TINY)
    world, run = tmp_path / "world", tmp_path / "run"
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    mix = world / "pretrain_kinds_scene-x4+object+relation+count.json"
    assert DEMO_CAPTION_REPEATS == {"scene": 4} and cfg["data"]["train"] == [str(mix)]
    assert "model.vision.img_size=48" in DEMO_OVERRIDES and cfg["model"]["vision"]["img_size"] == 48
    assert cfg["eval"]["score"] == "itc" and cfg["train"]["steps"] == 2  # the caller's overrides come last
    scenes = json.loads((world / "scenes.json").read_text())["splits"]["train"]
    for entry, rec in zip(json.loads(mix.read_text()), scenes):
        texts = [c["text"] for c in rec["captions"]]
        assert entry["caption"] == [texts[0]] * 4 + texts[1:]  # the scene caption first, 4 times
    # the table: recall keys, chance and the per-kind rows from the world's caption groups
    table = table_rows((tmp_path / "results.md").read_text())
    assert {"img_r1", "img_r1@scene", "img_r5_rel@generic", "txt_map_at_r"} <= set(table)
    assert table["img_map_at_r"] == [f"{metrics['img_map_at_r']:.2f}", "", ""]
    assert table["metric"] == ["vlp tiny", "chance", "x chance"] and table["img_r1"][2].endswith("x")
    assert metrics["img_r1@scene"] == json.loads((tmp_path / "metrics.json").read_text())["img_r1@scene"]
