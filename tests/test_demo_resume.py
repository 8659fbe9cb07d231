"""No command deletes a checkpoint, and every stop message's advice works for the command that printed
it (issue 52, break 12). Before: an interrupted ``vlp demo`` said "run the same command with --resume
auto", which ``vlp demo`` did not take; ``train.resume=auto`` deleted ``demo_out/run``, checkpoint
included, then failed "output_dir ... does not exist"; ``make demo`` exited 0 after SIGTERM with no table.

Now ``vlp demo --resume auto`` (and ``train.resume=auto``) continue the interrupted run; without it a
folder holding a checkpoint is refused, never deleted; a stopped demo exits 128 + the signal's number
(``make demo`` fails); and for every command whose stop prints advice, that advice parses with the
command's own parser and reaches the run as a resume."""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.helpers import ROOT
from vlp.cli import build_parser, main
from vlp.cli.train import finetune_commands
from vlp.errors import DataError
from vlp.train.preemption import SCRIPT_RESUME, StopRequest, exit_status, preempted, stopped_at

TINY = [
    "train.steps=6",
    "train.log_every=1",
    "model.vision.depth=1",
    "model.text.layers=1",
    "model.text.fusion_layers=1",
    "data.num_workers=0",
    "data.batch_size=8",
    "train.progress=false",
    "eval.k_test=4",
]


@pytest.fixture
def small_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    """``vlp demo`` on 8 test images (the command's own test split is 1,000)."""
    import vlp.runs.bench.demo as demo

    monkeypatch.setattr(demo, "run_demo", functools.partial(demo.run_demo, n_test=8))


def sigterm_before_step(monkeypatch: pytest.MonkeyPatch, at: int) -> None:
    """A SIGTERM to this process just before the loop's optimizer step ``at`` (0-based): the run
    stops after that step with a checkpoint, as a scheduler's preemption does."""
    import vlp.train.loop as loop

    real = loop.train_step

    def step(*a: Any, **kw: Any) -> Any:
        if a[6] == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **kw)

    monkeypatch.setattr(loop, "train_step", step)


#: the img_r1 row of the demo's printed table (vlp.metrics_table pads its columns)
TABLE_ROW = re.compile(r"^\| img_r1 +\|", re.M)


def demo_argv(out: Path) -> list[str]:
    return ["demo", "--out", str(out), "--images", "16", *TINY]


def stopped_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd) -> tuple[list[str], Path, str]:
    """A demo stopped by SIGTERM after step 3 of 6: its argv, its checkpoint and what it printed."""
    sigterm_before_step(monkeypatch, 2)
    argv = demo_argv(tmp_path / "demo")
    assert main(argv) == 128 + signal.SIGTERM  # stopped, no table: make demo fails
    err = capfd.readouterr().err
    ckpt = tmp_path / "demo" / "run" / "checkpoints" / "step_0000003"
    assert (ckpt / "model.safetensors").is_file() and not (tmp_path / "demo" / "results.md").exists()
    return argv, ckpt, err


def undo_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    import vlp.train.loop as loop
    import vlp.train.step as step

    monkeypatch.setattr(loop, "train_step", step.train_step)


def test_an_interrupted_demo_resumes_with_the_advice_it_prints(small_demo, tmp_path, monkeypatch, capfd) -> None:
    argv, ckpt, err = stopped_demo(tmp_path, monkeypatch, capfd)
    advice = re.search(r"Resume: run the same command with (--resume auto)", err)
    assert advice and f"stopped by SIGTERM after step 3 of 6; checkpoint {ckpt}" in err, err[-3000:]
    undo_stop(monkeypatch)
    assert main([*argv, *advice.group(1).split()]) == 0
    out = capfd.readouterr().out
    assert f"resumed from {ckpt} at step 3 of 6" in out and len(TABLE_ROW.findall(out)) == 1
    assert (tmp_path / "demo" / "results.md").is_file()


def test_a_demo_run_with_a_checkpoint_is_never_deleted(small_demo, tmp_path, monkeypatch, capfd) -> None:
    argv, ckpt, _ = stopped_demo(tmp_path, monkeypatch, capfd)
    undo_stop(monkeypatch)
    assert main(argv) == 2  # without --resume: refused, in one line, the checkpoint kept
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'demo' / 'run'} holds the checkpoints of an earlier demo run" in err
    assert "--resume auto" in err and (ckpt / "model.safetensors").is_file()
    # the override the old advice named: it continues too (it deleted the run before)
    assert main([*argv, "train.resume=auto"]) == 0
    assert f"resumed from {ckpt} at step 3 of 6" in capfd.readouterr().out


def test_a_demo_with_resume_on_a_fresh_folder_starts_and_a_finished_one_is_evaluated_again(
    small_demo, tmp_path, capfd
) -> None:
    """``make demo`` passes ``--resume auto``: the first run starts from nothing, a second one trains
    no step and prints the table again."""
    argv = [*demo_argv(tmp_path / "demo"), "--resume", "auto"]
    assert main(argv) == 0
    assert main(argv) == 0
    out = capfd.readouterr().out
    assert "resumed from" in out and len(TABLE_ROW.findall(out)) == 2


@pytest.mark.parametrize(
    "target, command", [("demo", "vlp demo --out demo_out"), ("demo-full", "vlp demo --full --out demo_full")]
)
def test_make_demo_fails_when_the_demo_does_and_continues_an_interrupted_one(target: str, command: str) -> None:
    """``make demo``'s (and ``make demo-full``'s) recipe is the one ``vlp demo`` command, nothing that
    hides its status, with ``--resume auto`` (the advice a stopped demo prints: running the target again
    follows it; without it a second ``make demo-full`` is refused, its stages holding checkpoints)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under make test
    recipe = subprocess.run(
        ["make", "--no-print-directory", "-n", "-o", "setup", "-o", ".venv/.installed", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    assert recipe.returncode == 0, recipe.stderr
    lines = [x for x in recipe.stdout.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].endswith(f"/bin/{command} --resume auto"), lines
    assert "||" not in lines[0] and not lines[0].startswith("-")


def test_the_full_demo_refuses_to_delete_a_stage_with_checkpoints(tmp_path: Path, monkeypatch) -> None:
    """``vlp demo --full`` removed every stage's folder (``--reuse``: every unfinished one), an
    interrupted stage's checkpoints with it, and took a pretraining stage with any checkpoint for a
    finished one. Now a stage with checkpoints is refused without ``--resume auto``; with it, the
    interrupted pretraining resumes (``train.resume=auto``), finished stages are kept."""
    import vlp.runs.bench.demo as demo
    from vlp.errors import ConfigError

    out = tmp_path / "full"
    step = out / "pretrain" / "checkpoints" / "step_0000002"
    step.mkdir(parents=True)
    (step / "model.safetensors").write_bytes(b"")
    (out / "vqa").mkdir()
    (out / "vqa" / "results.json").write_text("{}")
    full = demo.FullDemo(out, 0, {}, resume=False, n_stages=3)
    with pytest.raises(ConfigError, match=r"holds the checkpoints of an earlier demo run.*--resume auto"):
        full.clear()
    assert step.is_dir()
    resumed = demo.FullDemo(out, 0, {}, resume=True, n_stages=3)
    resumed.clear()
    assert step.is_dir() and (out / "vqa" / "results.json").is_file()
    assert not resumed.finished("pretrain") and resumed.finished("vqa")
    assert resumed.resume_overrides("pretrain") == ["train.resume=auto"] and resumed.resume_overrides("ve") == []


# ------------------------------------------------------------------ every command's advice works for it


def commands() -> list[tuple[list[str], str, str]]:
    """(argv, the run function it calls as ``module:name``, how its parsed options hold a resume)."""
    pretrain = ["--config", "configs/pretrain/shapes_tiny.yaml"]
    out = [
        (["pretrain", *pretrain], "vlp.runs.training.pretrain:run_pretrain", "resume"),
        (["train-helper", *pretrain], "vlp.runs.training.pretrain:run_train_helper", "resume"),
        (
            ["pretrain", "nlvr-ta", "--config", "configs/finetune/shapes_nlvr_ta.yaml"],
            "vlp.runs.training.finetune:run_finetune",
            "resume",
        ),
        (["demo", "--out", "d"], "vlp.runs.bench.demo:run_demo", "demo_resume"),
        (["demo", "--full", "--out", "d"], "vlp.runs.bench.demo:run_demo_full", "demo_resume"),
    ]
    for task, _ in finetune_commands():
        config = f"configs/finetune/shapes_{task}.yaml"
        out.append((["finetune", task, "--config", config], "vlp.runs.training.finetune:run_finetune", "resume"))
    return out


def stub(monkeypatch: pytest.MonkeyPatch, target: str, effect: Callable[..., Any]) -> list[dict[str, Any]]:
    """Replace the run function ``module:name`` by one with its signature that records its arguments
    and then does ``effect(**arguments)``; returns the records."""
    import importlib

    module_name, name = target.split(":")
    module = importlib.import_module(module_name)
    real = getattr(module, name)
    calls: list[dict[str, Any]] = []

    @functools.wraps(real)
    def fake(*a: Any, **kw: Any) -> Any:
        calls.append({"args": a, **kw})
        return effect(*a, **kw)

    monkeypatch.setattr(module, name, fake)
    return calls


def stop(*_: Any, **__: Any) -> Any:
    """What the loop raises when SIGTERM stops a run after step 3 of 9."""
    request = StopRequest(1.0, signals=[signal.SIGTERM])
    raise preempted(request, 3, 9, Path("RUN/checkpoints/step_0000003"))


def resumed(call: dict[str, Any]) -> bool:
    """Whether a run function was asked to resume: a config with ``train.resume=auto``, or ``resume=True``."""
    if call.get("resume") is True:
        return True
    cfg = call["args"][0] if call["args"] else None
    return getattr(getattr(cfg, "train", None), "resume", None) == "auto"


@pytest.mark.parametrize("argv, target, dest", commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_the_resume_advice_a_command_prints_is_accepted_by_it(argv, target, dest, monkeypatch, capsys) -> None:
    stub(monkeypatch, target, stop)
    status = main(argv)
    err = capsys.readouterr().err
    assert status == (128 + signal.SIGTERM if argv[0] == "demo" else 0), err
    advice = re.search(r"Resume: run the same command with (--resume \S+)(?: \(or (train\.resume=[^)\s]+)\))?", err)
    assert advice, err
    for words in [advice.group(1).split(), *([[advice.group(2)]] if advice.group(2) else [])]:
        parsed = build_parser().parse_args(
            [*argv, *words] if argv[:2] != ["pretrain", "nlvr-ta"] else ["pretrain-nlvr-ta", *argv[2:], *words]
        )
        assert getattr(parsed, dest, None) == "auto" or "train.resume=auto" in parsed.overrides
        calls = stub(monkeypatch, target, lambda *a, **k: {"checkpoint": "c"} if "finetune" in target else Path("r"))
        assert main([*argv, *words]) == 0 and len(calls) == 1 and resumed(calls[0]), (words, calls)


def test_a_stop_inside_an_experiment_script_advises_running_the_script_again(capsys) -> None:
    def data_stop() -> int:
        raise DataError(f"shards [...] hold no readable samples; {stopped_at(3, 9, Path('c'))}")

    with pytest.raises(DataError, match=f"Resume: {SCRIPT_RESUME}$"):
        exit_status(data_stop, "x.py")
