"""A resume compares its config with the one the run was started with (issue 29, part 4): changes
that alter the run (batch size, seed, model shape, text length) are refused in one error listing
them, unless named in ``train.resume_allow_changes``; logging and speed knobs may change; what
changed is recorded in ``run_info.json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlp.config import ConfigError, PretrainConfig, apply_overrides
from vlp.config.resume import resume_changes
from vlp.runs.training.run_dir import prepare_run_dir


@pytest.fixture
def started(tmp_path: Path) -> PretrainConfig:
    """A config whose run directory was prepared (config.yaml written), as a first start does."""
    cfg = apply_overrides(PretrainConfig(), [f"output_dir={tmp_path / 'run'}", "data.batch_size=8", "train.seed=3"])
    prepare_run_dir(cfg)
    return cfg


def resumed(cfg: PretrainConfig, *overrides: str) -> PretrainConfig:
    return apply_overrides(cfg, ["train.resume=auto", *overrides])


def test_the_same_config_resumes_and_records_no_change(started: PretrainConfig) -> None:
    run = prepare_run_dir(resumed(started))
    info = json.loads((run / "run_info.json").read_text())
    assert info["resumes"][-1]["config_changes"] == {}


def test_changes_that_alter_the_run_are_refused_in_one_error(started: PretrainConfig) -> None:
    run = Path(started.output_dir)
    before = (run / "config.yaml").read_text()
    new = resumed(started, "data.batch_size=16", "train.seed=4", "model.text.max_len=20", "model.vision.depth=2")
    with pytest.raises(ConfigError) as e:
        prepare_run_dir(new)
    msg = str(e.value)
    for part in (
        "data.batch_size: 8 -> 16",
        "train.seed: 3 -> 4",
        "model.text.max_len: 30 -> 20",
        "model.vision.depth",
    ):
        assert part in msg
    assert "4 key(s) that alter the run" in msg and str(run / "config.yaml") in msg
    assert "train.resume_allow_changes=[model.vision.depth,model.text.max_len,data.batch_size,train.seed]" in msg
    assert (run / "config.yaml").read_text() == before  # nothing written


def test_named_changes_are_accepted_and_recorded(started: PretrainConfig) -> None:
    new = resumed(
        started,
        "data.batch_size=16",
        "model.text.max_len=20",
        "train.resume_allow_changes=[data.batch_size,model.text]",
    )
    run = prepare_run_dir(new)
    info = json.loads((run / "run_info.json").read_text())
    changes = info["resumes"][-1]["config_changes"]
    assert changes["data.batch_size"] == [8, 16] and changes["model.text.max_len"] == [30, 20]
    assert "batch_size: 16" in (run / "config.yaml").read_text()


def test_logging_speed_and_eval_keys_may_change(started: PretrainConfig) -> None:
    new = resumed(started, "train.progress=false", "train.compile=blocks", "train.keep_last=3", "eval.batch_size=4")
    run = prepare_run_dir(new)
    changes = json.loads((run / "run_info.json").read_text())["resumes"][-1]["config_changes"]
    assert changes["train.compile"] == ["off", "blocks"] and changes["eval.batch_size"] == [128, 4]


def test_worker_count_may_change_for_json_data_but_not_for_a_shard_stream() -> None:
    saved = {"data": {"format": "json", "num_workers": 2}}
    assert resume_changes(saved, {"data": {"format": "json", "num_workers": 4}}, [], "c.yaml") == {
        "data.num_workers": (2, 4)
    }
    moved = resume_changes({"output_dir": "/old/run"}, {"output_dir": "/new/run"}, [], "c.yaml")
    assert moved == {"output_dir": ("/old/run", "/new/run")}  # a run directory copied elsewhere
    shards = {"data": {"format": "webdataset", "num_workers": 2}}
    with pytest.raises(ConfigError, match=r"data.num_workers: 2 -> 4"):
        resume_changes(shards, {"data": {"format": "webdataset", "num_workers": 4}}, [], "c.yaml")


def test_an_unknown_allowed_key_is_refused(started: PretrainConfig) -> None:
    with pytest.raises(ConfigError, match=r"resume_allow_changes': no such config key or section: \['data.batch'\]"):
        prepare_run_dir(resumed(started, "train.resume_allow_changes=[data.batch]"))


def test_the_config_of_the_run_holding_a_named_checkpoint_is_compared(started: PretrainConfig, tmp_path: Path) -> None:
    step = Path(started.output_dir) / "checkpoints" / "step_0000002"
    step.mkdir(parents=True)
    elsewhere = tmp_path / "continued"
    elsewhere.mkdir()
    new = apply_overrides(started, [f"output_dir={elsewhere}", f"train.resume={step}", "train.seed=9"])
    with pytest.raises(ConfigError, match=r"train.seed: 3 -> 9"):
        prepare_run_dir(new)


def test_a_run_killed_before_its_first_checkpoint_points_to_resume_auto(tmp_path: Path) -> None:
    from vlp.errors import DataError

    cfg = apply_overrides(PretrainConfig(), [f"output_dir={tmp_path / 'run'}"])
    run = prepare_run_dir(cfg)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')  # killed after a step, before a checkpoint
    with pytest.raises(DataError, match=r"already holds a run .*--resume auto starts it again from step 0"):
        prepare_run_dir(cfg)
    assert prepare_run_dir(resumed(cfg)) == run  # and that is accepted


@pytest.fixture
def checkpointed(tmp_path: Path) -> PretrainConfig:
    """A started run of the tiny preset (batch 8, seed 3) with a verified checkpoint at step 2 whose
    state.json carries that config, as training writes it."""
    from tests.helpers import ROOT, SHAPES_TINY, untrained_checkpoint
    from vlp.config import load_config

    overrides = [f"output_dir={tmp_path / 'run'}", "data.batch_size=8", "train.seed=3"]
    cfg = load_config(PretrainConfig, ROOT / SHAPES_TINY, overrides)
    run = prepare_run_dir(cfg)
    untrained_checkpoint(run / "checkpoints" / "step_0000002", overrides)
    return cfg


@pytest.mark.parametrize("edit", ["config.yaml edited", "config.yaml deleted"])
def test_a_resume_is_compared_with_the_config_in_its_checkpoint(checkpointed: PretrainConfig, edit: str) -> None:
    """Issue 41, item 1: the run's config.yaml is mutable; the checkpoint's state.json is what was trained."""
    run = Path(checkpointed.output_dir)
    saved = run / "config.yaml"
    if edit == "config.yaml edited":
        saved.write_text(saved.read_text().replace("batch_size: 8", "batch_size: 16").replace("seed: 3", "seed: 1"))
    else:
        saved.unlink()
    new = resumed(checkpointed, "data.batch_size=16", "train.seed=1")
    with pytest.raises(ConfigError) as e:
        prepare_run_dir(new)
    msg = str(e.value)
    assert "data.batch_size: 8 -> 16" in msg and "train.seed: 3 -> 1" in msg
    assert str(run / "checkpoints" / "step_0000002" / "state.json") in msg


def test_a_checkpoint_copied_out_of_its_run_is_compared_with_its_own_config(
    checkpointed: PretrainConfig, tmp_path: Path
) -> None:
    import shutil

    copy = tmp_path / "copied" / "step_0000002"
    shutil.copytree(Path(checkpointed.output_dir) / "checkpoints" / "step_0000002", copy)
    elsewhere = tmp_path / "continued"
    elsewhere.mkdir()
    new = apply_overrides(checkpointed, [f"output_dir={elsewhere}", f"train.resume={copy}", "train.seed=9"])
    with pytest.raises(ConfigError, match=r"train.seed: 3 -> 9"):
        prepare_run_dir(new)
    ok = apply_overrides(checkpointed, [f"output_dir={elsewhere}", f"train.resume={copy}"])
    info = json.loads((prepare_run_dir(ok) / "run_info.json").read_text())
    # a new run directory: its run_info.json starts here, with the changes to the checkpoint's config
    assert info["config_changes"] == {"output_dir": [checkpointed.output_dir, str(elsewhere)]}
