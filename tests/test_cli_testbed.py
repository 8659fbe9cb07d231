"""The testbed's command lines (issue 19): world options, false negatives, the oracle cache and the
helper diagnostics, the LTD floor, probes and minimal pairs, grouped retrieval metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import dual_checkpoint
from vlp.cli import main
from vlp.features.targets import write_targets
from vlp.lab.false_negatives import false_negative_share
from vlp.world.scene import COLORS


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("w") / "world"
    rc = main(
        [
            "make-world",
            "--out",
            str(root),
            "--images",
            "64",
            "--val-images",
            "4",
            "--test-images",
            "16",
            "--caption-kinds",
            "object,count",
            "--caption-kinds",
            "scene",
            "--caption-kinds",
            "scene:2,count",
            "--helper-images",
            "8",
        ]
    )
    assert rc == 0
    return root


def test_make_world_writes_the_caption_mixes_and_the_helper_split(world: Path) -> None:
    mix = json.loads((world / "pretrain_kinds_object+count.json").read_text())
    scene_only = json.loads((world / "pretrain_kinds_scene.json").read_text())
    assert len(mix) == 64 and len(scene_only) == 64
    assert all(isinstance(e["caption"], str) for e in scene_only)  # one scene caption per image
    weighted = json.loads((world / "pretrain_kinds_scene-x2+count.json").read_text())
    assert [e["caption"][:2] for e in weighted] == [[e["caption"]] * 2 for e in scene_only]
    helper = json.loads((world / "helper_split.json").read_text())
    assert len(helper) == 8 and all(len(e["caption"]) == 5 for e in helper)
    assert {Path(e["image"]).parent.name for e in helper} == {"helper"}


def test_bad_caption_kind_is_one_clear_error(world: Path, tmp_path: Path, capsys) -> None:
    rc = main(
        ["make-world", "--out", str(tmp_path / "w"), "--images", "8", "--test-images", "4", "--caption-kinds", "colour"]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "--caption-kinds 'colour'" in err and "unknown caption kind 'colour'" in err
    rc = main(
        [
            "make-world",
            "--out",
            str(tmp_path / "v"),
            "--images",
            "8",
            "--test-images",
            "4",
            "--caption-kinds",
            "scene:x",
        ]
    )
    assert rc == 2
    assert "'scene:x': expected KIND or KIND:N with a whole number N >= 1" in capsys.readouterr().err


def test_false_negatives_command_prints_and_writes_the_library_numbers(world: Path, tmp_path: Path, capsys) -> None:
    data = world / "pretrain_kinds_object+count.json"
    out = tmp_path / "fn.json"
    args = ["--world", str(world), "--data", str(data), "--batch-size", "16", "--queue", "0", "32", "--batches", "5"]
    assert main(["analyze", "false-negatives", *args, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    expected = false_negative_share(data, world, 16, queue_size=32, batches=5)
    assert [r["queue_size"] for r in rows] == [0, 32]
    assert rows[1]["i2t_share"] == pytest.approx(expected["i2t_share"])
    assert f"{100 * rows[0]['in_batch_share']:.1f}% of in-batch negatives are false" in capsys.readouterr().out


def test_oracle_cache_and_helper_diagnostics(world: Path, tmp_path: Path, capsys) -> None:
    data = str(world / "pretrain_kinds_object+count.json")
    cache = tmp_path / "oracle"
    args = ["--oracle", "exact", "--world", str(world), "--data", data, "--out", str(cache)]
    assert main(["cache-helper-features", *args]) == 0
    assert json.loads((cache / "index.json").read_text())["kind"] == "oracle-exact"
    out = tmp_path / "diag"
    rc = main(
        ["analyze", "helper", "--cache", str(cache), "--world", str(world), "--data", data, "--out", str(out)]
        + ["--batch-size", "16", "--batches", "4", "--target-weight", "0.2"]
    )
    assert rc == 0
    rep = json.loads((out / "helper_diagnostics.json").read_text())
    assert rep["helper_auc"]["in_batch"] == 1.0  # the exact oracle separates perfectly
    assert rep["weights"]["target_weight"]["false_negatives"]["median"] == pytest.approx(0.2, abs=1e-3)
    assert "helper ROC-AUC        1.0 in batch" in capsys.readouterr().out
    # an oracle without its world, or both sources at once: one clear error
    assert main(["cache-helper-features", "--oracle", "exact", "--data", data, "--out", str(tmp_path / "x")]) == 2
    assert main(["cache-helper-features", "--helper", "h", *args[:-1], str(tmp_path / "y")]) == 2


def test_ltd_floor_probes_and_minimal_pairs_commands(world: Path, tmp_path: Path, capsys) -> None:
    entries = json.loads((world / "pretrain.json").read_text())
    texts = sorted({c for e in entries for c in e["caption"]})
    vectors = torch.tensor([[1.0] + [float(c in t.split()) for c in COLORS] for t in texts])
    targets = write_targets(tmp_path / "t.safetensors", texts, vectors, "test-encoder", [str(world / "pretrain.json")])
    rc = main(
        ["analyze", "ltd-floor", "--targets", str(targets), "--data", str(world / "pretrain.json")]
        + ["--out", str(tmp_path / "floor"), "--attributes", "color", "size", "caption"]
    )
    assert rc == 0
    floors = json.loads((tmp_path / "floor" / "ltd_floor.json").read_text())["floors"]
    assert set(floors) == {"color", "size", "caption"} and floors["size"]["floor"] == pytest.approx(0.0, abs=1e-12)

    run = tmp_path / "run"
    dual_checkpoint(run)
    assert (
        main(["analyze", "probes", "--checkpoint", str(run), "--world", str(world), "--out", str(tmp_path / "p")]) == 0
    )
    probes = json.loads((tmp_path / "p" / "probes.json").read_text())["attributes"]
    assert "color" in probes and (tmp_path / "p" / "probes.png").is_file()
    rc = main(
        ["analyze", "minimal-pairs", "--checkpoint", str(run), "--world", str(world)]
        + ["--out", str(tmp_path / "m"), "--captions", "4"]
    )
    assert rc == 0
    pairs = json.loads((tmp_path / "m" / "minimal_pairs.json").read_text())
    assert pairs["n_captions"] == 4 and 0.0 <= pairs["attributes"]["all"]["accuracy"] <= 1.0
    out = capsys.readouterr().out
    assert "probe accuracy" in out and "minimal-pair accuracy" in out
