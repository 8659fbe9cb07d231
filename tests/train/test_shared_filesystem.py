"""Multi-process checkpoints need the run directory on a filesystem every rank sees (defect 10):
each rank writes its own training-state files under it. ``train()`` checks that at its start: rank
0 writes a marker with a random token, every rank must read that token back. A non-shared
filesystem is simulated with a different output directory per rank."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from tests.helpers import launch
from vlp.train.checkpoints import SHARED_FS_MARKER, check_shared_filesystem

# Calls the check directly, on 2 gloo processes: argv[1] is the run directory, "{rank}" in it is
# replaced by the process's rank; argv[2], if given, a stale marker written into rank 1's directory
# beforehand. Each rank writes RESULTS/rank_R.txt: "rank R: ok" or "rank R: error: MESSAGE".
SCRIPT = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    from vlp.config import ConfigError
    from vlp.dist import destroy_group
    from vlp.train.checkpoints import SHARED_FS_MARKER, check_shared_filesystem

    dist.init_process_group("gloo")
    r = dist.get_rank()
    run_dir = sys.argv[1].format(rank=r)
    if len(sys.argv) > 2 and r == 1:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, SHARED_FS_MARKER), "w") as f:
            f.write(sys.argv[2])
    dist.barrier()
    try:
        check_shared_filesystem(run_dir, torch.device("cpu"))
        result = f"rank {r}: ok"
    except ConfigError as e:
        result = f"rank {r}: error: {e}"
    with open(os.path.join(os.environ["RESULTS"], f"rank_{r}.txt"), "w") as f:
        f.write(result)
    destroy_group()
""")


def run_check(tmp_path: Path, run_dir: str, *stale: str) -> list[str]:
    script, results = tmp_path / "check.py", tmp_path / "results"
    script.write_text(SCRIPT)
    results.mkdir()
    launch([str(script), run_dir, *stale], processes=2, env={"RESULTS": str(results)}, timeout=300)
    return [(results / f"rank_{r}.txt").read_text() for r in (0, 1)]


def test_one_process_checks_nothing(tmp_path):
    check_shared_filesystem(tmp_path / "run", torch.device("cpu"))
    assert not (tmp_path / "run").exists()


def test_a_shared_directory_passes_and_the_marker_is_removed(tmp_path):
    run = tmp_path / "run"
    assert run_check(tmp_path, str(run)) == ["rank 0: ok", "rank 1: ok"]
    assert run.is_dir() and list(run.iterdir()) == []


def test_per_rank_directories_fail_on_every_rank_naming_the_directory(tmp_path):
    lines = run_check(tmp_path, str(tmp_path / "rank_{rank}"))
    assert [line[:15] for line in lines] == ["rank 0: error: ", "rank 1: error: "]
    for r, line in enumerate(lines):
        assert f"output_dir {tmp_path / f'rank_{r}'}: " in line
        assert "rank 1 of 2 processes could not read" in line
        assert "a filesystem shared by every node" in line
    assert list((tmp_path / "rank_0").iterdir()) == []  # rank 0's marker removed


def test_a_stale_marker_of_another_check_does_not_count(tmp_path):
    lines = run_check(tmp_path, str(tmp_path / "rank_{rank}"), "12345")
    assert [line[:15] for line in lines] == ["rank 0: error: ", "rank 1: error: "]
    assert all("rank 1 of 2 processes could not read" in line for line in lines)


@pytest.mark.multiprocess
def test_pretrain_on_two_processes_without_a_shared_output_dir_stops_before_training(
    tmp_path, launch_pretrain, tiny_model, pairs_file
):
    res = launch_pretrain(
        [
            "--config",
            "configs/pretrain/shapes_tiny.yaml",
            f"output_dir={tmp_path}/rank_${{oc.env:LOCAL_RANK}}",
            f"data.train=[{pairs_file}]",
            "data.batch_size=4",
            "data.num_workers=0",
            "train.steps=2",
            "train.ckpt_every=1",
            "train.progress=false",
            *tiny_model,
        ],
        processes=2,
        check=False,
    )
    assert res.returncode != 0
    for r in (0, 1):
        run = tmp_path / f"rank_{r}"
        assert f"vlp: error: output_dir {run}: rank 1 of 2 processes could not read" in res.stderr
        assert not list((run / "checkpoints").glob("step_*")) and not (run / "metrics.jsonl").exists()
        assert not (run / SHARED_FS_MARKER).exists()
    assert "checkpoints need a filesystem shared by every node" in res.stderr
