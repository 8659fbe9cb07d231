"""Two ranks (``torch.distributed.run``, gloo on CPU) reading shards from servers on 127.0.0.1 (issue 42).

From moto's S3 server: a run killed mid-epoch and resumed gives the batches (every rank), the log
records and the weights of an uninterrupted run (scripts/soak.py's comparison); the two ranks read
disjoint shards; no file the runs write holds the server's credentials (the launched processes get
the endpoint and the fake keys through the environment only).

From the loopback HTTP server, one shard's every GET cut mid-body: the run finishes, the shard is
named once in the logs of both ranks together, and the run's bad samples are the samples it lost."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.data.shard_servers import S3_KEY, S3_SECRET, Fault, http_server, s3_server
from tests.data.test_img2dataset_shards import PER_SHARD, write_img2dataset
from tests.helpers import load_script

pytestmark = pytest.mark.multiprocess  # every test here launches two processes

soak = load_script("scripts/soak.py", "soak")
# 32 shards of one image, counted by their stats (32 pairs: one caption of each image an epoch),
# batches of 4 on 2 ranks: the 4 steps are epoch 0; checkpoints at steps 2 and 4, log records at 2 and 4
IMAGES = 32
SETUP = soak.Setup(steps=4, ckpt_every=2, log_every=2, processes=2)


def attempt_logs(folder: Path) -> str:
    return "".join(f"\n--- {p.name}:\n" + p.read_text()[-3000:] for p in sorted(folder.rglob("*.log")))


def test_two_ranks_on_s3_shards_read_disjoint_shards_and_resume_exactly_after_a_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shards = soak.make_shards(tmp_path / "world", IMAGES)  # 2 of the shards with a bad sample
    for name, v in json.loads((shards / "sizes.json").read_text()).items():  # img2dataset's counts
        (shards / name.replace(".tar", "_stats.json")).write_text(json.dumps({"successes": v["images"]}))
    with s3_server(monkeypatch, "shards", shards):  # the launched ranks inherit its AWS_* environment
        url = f"s3://shards/shard-{{00000..{IMAGES - 1:05d}}}.tar"
        ref = soak.reference(SETUP, url, tmp_path / "reference")
        # SIGKILL to the launcher and both ranks after step 3 (mid-epoch), resumed from step 2's checkpoint
        outcome = soak.inject(SETUP, url, ref, tmp_path / "run", soak.Fault("KILL", "step", 3))
    assert not outcome.problems, outcome.line(SETUP) + attempt_logs(tmp_path)
    assert outcome.resumed_at == 2 and soak.records(ref)[-1]["step"] == SETUP.steps
    assert f"{IMAGES} images, {IMAGES} pairs" in (ref / "batches.log").read_text()  # counts from the stats
    assert f"{SETUP.steps} batches of 4 per rank per epoch x 2 ranks" in (ref / "batches.log").read_text()
    # each rank reads its own half of the shards (one image each): no image on both ranks
    ids = soak.image_ids(ref / "batches")
    assert sorted(ids) == ["rank0.jsonl", "rank1.jsonl"] and all(sorted(b) == list(range(4)) for b in ids.values())
    read = [{i for batch in b.values() for i in batch} for b in ids.values()]
    assert read[0].isdisjoint(read[1]) and min(map(len, read)) >= 2 and read[0] | read[1] <= set(range(IMAGES)), read
    written = [p for p in tmp_path.rglob("*") if p.is_file() and "world" not in p.relative_to(tmp_path).parts]
    assert sum(p.name == "config.yaml" for p in written) == 2 and any(p.name == "attempt2.log" for p in written)
    leaks = [p for p in written if S3_KEY.encode() in p.read_bytes() or S3_SECRET.encode() in p.read_bytes()]
    assert leaks == []


def test_a_shard_cut_mid_stream_on_every_read_costs_its_samples_named_once(tmp_path: Path) -> None:
    """4 img2dataset shards of 5 images (one caption each: 20 pairs), batches of 4 on 2 ranks: one
    epoch is 2 steps. Every GET of one shard is cut after half its bytes; the reader retries it
    (reopening where it stopped), then counts the shard's samples as bad and reads its other shard
    again in their place."""
    folder = write_img2dataset(tmp_path / "cc")
    broken = "00002.tar"
    setup = replace(SETUP, steps=2, ckpt_every=2, log_every=1)
    with http_server(folder) as server:
        server.faults = [Fault(broken, "reset", after=(folder / broken).stat().st_size // 2)]
        run = soak.reference(setup, f"{server.url}/{{00000..00003}}.tar", tmp_path / "run")
    log = (run / "batches.log").read_text()
    assert log.count(f"{server.url}/{broken}") == 1, log
    named = next(line for line in log.splitlines() if broken in line)
    assert f"skipped a bad shard ({PER_SHARD} bad samples)" in named and "cannot read shard" in named
    assert "(after 5 tries)" in named
    # met twice (its reader, short of units, reads its two shards again), 5 tries each, named and counted once
    assert server.log.count(f"GET /{broken}") == 10
    lost = set(range(2 * PER_SHARD, 3 * PER_SHARD))  # the broken shard's image ids (shard order, then member)
    assert not lost & {i for b in soak.image_ids(run / "batches").values() for ids in b.values() for i in ids}
    records = soak.records(run)
    assert [r["step"] for r in records] == [1, 2] and sum(r["bad_samples"] for r in records) == PER_SHARD, records
