"""The fault-injection suite (issue 41): a ``vlp pretrain`` run on shards with bad samples (an image
that does not decode, a malformed JSON member; a reader meets them again when it re-reads its
shards), ``train.ckpt_every=3`` and ``train.log_every=4``, stopped at every phase of writing a
checkpoint (:data:`vlp.weights.CHECKPOINT_PHASES`) and right after training steps drawn at random,
with SIGKILL and SIGTERM, then resumed with ``--resume auto``. After each resume, compared with one
uninterrupted run of the same configuration (shared by the module): every batch any attempt fetched,
the ``metrics.jsonl`` records to the last bit (losses, learning rate and bad samples of every log
window; wall-clock fields aside), the run's sample counts in the final ``state.json``, the final
weights and training state (``scripts/soak.py``, whose parts these are, draws many more faults).

One process runs are forked from the test process; the two-process case launches
``torch.distributed.run`` (gloo on CPU) three times and is marked ``multiprocess``."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import load_script

soak = load_script("scripts/soak.py", "soak")
SETUP = soak.Setup()  # 12 steps of batches of 4, checkpoints at 3, 6, 9 and 12, log records at 4, 8 and 12
_draw = random.Random(41)  # the "random" steps: drawn once, the same in every run of the suite
FAULTS = [
    # every phase of the checkpoint of step 6, in the middle of the window of steps 5-8: before the
    # rename the resume starts from step 3 (itself inside the window of steps 1-4), after it from 6
    *(soak.Fault("KILL", phase, 6) for phase in soak.CHECKPOINT_PHASES),
    soak.Fault("TERM", "manifest", 9),  # recorded during the save, acted on after step 10
    soak.Fault("TERM", "weights", 12),  # the last save: the signal's default action ends the process
    soak.Fault("KILL", "step", _draw.randrange(1, SETUP.steps)),
    soak.Fault("TERM", "step", _draw.randrange(1, SETUP.steps)),
]


def check(setup, shards: Path, ref: Path, run: Path, fault) -> None:
    outcome = soak.inject(setup, shards, ref, run, fault)
    logs = "".join(f"\n--- {p.name}:\n" + p.read_text()[-3000:] for p in sorted(run.glob("attempt*.log")))
    assert not outcome.problems, outcome.line(setup) + logs
    assert outcome.resumed_at == setup.resumed_at(fault)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return soak.make_shards(tmp_path_factory.mktemp("fault_world"))


@pytest.fixture(scope="module")
def reference(shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run (in this process: the forked runs then share its imports)."""
    ref = soak.reference(SETUP, shards, tmp_path_factory.mktemp("fault_reference"))
    assert soak.records(ref)[-1]["step"] == SETUP.steps
    return ref


def test_the_reference_meets_bad_samples_in_several_windows(reference: Path) -> None:
    """The world does what the suite needs: bad samples in more than one log window, counted once each."""
    bad = [r["bad_samples"] for r in soak.records(reference)]
    assert sum(b > 0 for b in bad) >= 2 and sum(bad) >= 3
    log = (reference / "batches.log").read_text()
    assert log.count("skipped a bad sample") == sum(bad)


@pytest.mark.parametrize("fault", FAULTS, ids=str)
def test_a_stopped_run_resumes_as_if_never_stopped(fault, shards: Path, reference: Path, tmp_path: Path) -> None:
    check(SETUP, shards, reference, tmp_path / "run", fault)


@pytest.mark.multiprocess
def test_two_processes_killed_after_the_rename_resume_as_if_never_killed(shards: Path, tmp_path: Path) -> None:
    """Two ranks, each with its own readers, bad samples and part of the open window; SIGKILL to
    the launcher and both ranks once step 6's checkpoint has its final name."""
    setup = replace(SETUP, processes=2)
    ref = soak.reference(setup, shards, tmp_path / "reference")
    check(setup, shards, ref, tmp_path / "run", soak.Fault("KILL", "renamed", 6))


def test_a_killing_rank_kills_the_launcher_before_any_rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Both ranks reach a ``KILL@step`` fault at once (the step ends in a collective). If each killed
    the other rank first, each could die before reaching the launcher, which then outlives its ranks
    and exits 1 instead of -9 (seen in CI). The launcher's group comes first, this rank's own last;
    the group ids are chosen so that a set of them iterates ranks first."""
    launcher, ranks, groups = 15, [2, 3], {15: 15, 2: 2, 3: 3}
    children = tmp_path / "children"
    children.write_text(" ".join(map(str, ranks)))
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(soak.os, "getppid", lambda: launcher)
    monkeypatch.setattr(soak.os, "getpgrp", lambda: 2)
    monkeypatch.setattr(soak.os, "getpgid", groups.__getitem__)
    monkeypatch.setattr(soak, "children_file", lambda pid: children)
    assert soak.job_groups() == [15, 3, 2]


def test_a_killing_rank_goes_on_when_a_group_is_gone_already(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The launcher's group, killed and reaped after the other rank's kill, no longer exists: this
    rank still kills the remaining groups and itself."""
    import vlp.train.loop as loop

    def fake_step(step: int) -> str:
        return f"step {step}"

    sent: list[tuple[str, int]] = []

    def killpg(group: int, sig: int) -> None:
        if group == 15:
            raise ProcessLookupError(group)
        sent.append(("group", group))

    monkeypatch.setattr(loop, "train_step", fake_step)
    monkeypatch.setattr(soak, "job_groups", lambda: [15, 3, 2])
    monkeypatch.setattr(soak.os, "killpg", killpg)
    monkeypatch.setattr(soak.os, "kill", lambda pid, sig: sent.append(("self", sig)))
    soak.arm(soak.Fault("KILL", "step", 2), tmp_path / "fired")
    assert loop.train_step(step=0) == "step 0" and not sent  # not yet: after step 2
    assert loop.train_step(step=1) == "step 1"
    assert sent == [("group", 3), ("group", 2), ("self", soak.signal.SIGKILL)]
    assert (tmp_path / "fired").read_text() == "KILL@step:2"
