"""Retrieval evaluation over several processes: two CPU processes (gloo, torchrun) give the metrics of
one; the split of ITM pairs over ranks is balanced and covers every pair once.

The checkpoint is an untrained tiny ALBEF (evaluation needs only weights + config); 7 test images
and 35 captions, so the encoding shards are uneven (3 + 4 images, 17 + 18 captions).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from tests.helpers import NO_TASKS, TINY_ALBEF_32, launch, untrained_checkpoint
from vlp.dist import fetch_rows, gather_rows, shard_bounds
from vlp.eval.retrieval import split_pairs
from vlp.runs.evaluation.image_text_retrieval import run_evaluate_retrieval

WORLD = dict(seed=3, n_train=0, n_val=0, n_test=7, image_size=32, **NO_TASKS)
EVAL = ["eval.k_test=4", "eval.itm_batch_size=5"]


@pytest.fixture(scope="module")
def tiny(world: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], Path]:
    return world, untrained_checkpoint(tmp_path_factory.mktemp("eval_dist") / "ckpt", TINY_ALBEF_32)


@pytest.mark.multiprocess
def test_two_processes_write_the_metrics_of_one(tiny: tuple[dict[str, Path], Path], tmp_path: Path) -> None:
    world, ckpt = tiny
    files = ["--data", str(world["retrieval_test"]), "--relevance", str(world["relevance_test"])]
    files += ["--graded-relevance", str(world["relevance_graded_test"])]
    run_evaluate_retrieval(
        ckpt,
        world["retrieval_test"],
        world["relevance_test"],
        tmp_path / "one",
        overrides=EVAL,
        show_progress=False,
        graded_relevance=world["relevance_graded_test"],
    )
    args = ["-m", "vlp.cli", "evaluate", "retrieval", "--checkpoint", str(ckpt), *files]
    res = launch([*args, "--out", str(tmp_path / "two"), *EVAL], processes=2, timeout=300)
    assert res.stdout.count("wrote ") == 1  # rank 0 alone prints
    one, two = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("one", "two"))
    assert (one.pop("processes"), two.pop("processes")) == (1, 2)
    assert two.keys() == one.keys() and "img_ndcg25" in one and one["itm_pairs"] > 7 * 4
    for k, v in one.items():
        assert two[k] == (pytest.approx(v, abs=1e-6) if isinstance(v, float) else v), k


def _check_split(pair_img: torch.Tensor, world: int) -> list[int]:
    """Assert the split's promises; returns the pairs per rank."""
    b = split_pairs(pair_img, world)
    assert len(b) == world + 1 and b[0] == 0 and b[-1] == len(pair_img)
    assert all(x <= y for x, y in zip(b, b[1:]))  # contiguous shares: every pair exactly once
    for cut in b[1:-1]:  # never inside an image's pairs
        assert cut in (0, len(pair_img)) or pair_img[cut - 1] != pair_img[cut]
    loads = [y - x for x, y in zip(b, b[1:])]
    most = int(torch.bincount(pair_img).max()) if len(pair_img) else 0
    assert max(loads) - min(loads) <= most
    return loads


def test_split_pairs_is_balanced_by_pair_count_and_covers_every_pair_once() -> None:
    rng = random.Random(0)
    for _ in range(300):
        counts = [rng.choice([1, 2, 3, 8, 40]) for _ in range(rng.randint(1, 12))]
        _check_split(torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts)), rng.randint(1, 6))
    # rows would give [40+1 | 1+1] (42 vs 2); pair counts give 40 vs 3
    assert _check_split(torch.repeat_interleave(torch.arange(4), torch.tensor([40, 1, 1, 1])), 2) == [40, 3]
    # the image boundary nearest to each ideal cut (8, 16, 24) would give 11, 9, 1, 11: a spread of 10 > 9
    counts = [1, 1, 9, 9, 1, 9, 1, 1]
    assert _check_split(torch.repeat_interleave(torch.arange(8), torch.tensor(counts)), 4) == [11, 10, 9, 2]
    assert _check_split(torch.arange(3), 5) == [1, 1, 1, 0, 0]  # more ranks than images: some idle
    assert split_pairs(torch.zeros(0, dtype=torch.long), 3) == [0, 0, 0, 0]


def test_row_helpers_on_one_process_are_identities() -> None:
    assert shard_bounds(7, 2) == [0, 3, 7] and shard_bounds(2, 4) == [0, 0, 1, 1, 2]
    x = torch.arange(12.0).view(6, 2)
    assert torch.equal(gather_rows(x, [0, 6]), x)
    assert torch.equal(fetch_rows(x, [0, 6], [torch.tensor([1, 4])]), x[[1, 4]])
