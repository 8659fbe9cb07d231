"""A dotted override given twice is refused in one line naming the key (issue 52, break 11): the last one
no longer wins silently. Many values of one key that differ only in digits are an unquoted brace
pattern the shell expanded (``data.train=[s3://b/{00000..01242}.tar]`` unquoted is 1,243 arguments):
the error says so and shows the pattern, quoted. The docs quote every brace pattern in a shell command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vlp.cli import main
from vlp.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/pretrain/shapes_tiny.yaml"


def one_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one ``vlp: error:`` line of ``vlp ARGV`` (status 2, nothing run)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vlp: error: "), err
    return err


def test_a_key_given_twice_is_refused_naming_it(capsys, tmp_path: Path) -> None:
    argv = ["pretrain", "--config", CONFIG, f"output_dir={tmp_path / 'run'}", "train.steps=5", "train.steps=7"]
    err = one_error(capsys, argv)
    assert "'train.steps'" in err and "given 2 times" in err and "train.steps=5" in err and "train.steps=7" in err
    assert not (tmp_path / "run").exists()


def test_the_shell_expanded_brace_pattern_of_the_docs_is_refused_with_a_hint(capsys, tmp_path: Path) -> None:
    """What bash makes of ``data.train=[s3://b/{00000..01242}.tar]`` unquoted: 1,243 arguments."""
    expanded = [f"data.train=[s3://b/{i:05d}.tar]" for i in range(1243)]
    err = one_error(capsys, ["pretrain", "--config", CONFIG, f"output_dir={tmp_path / 'run'}", *expanded])
    assert "'data.train' given 1243 times" in err
    assert "an unquoted brace pattern the shell expanded" in err
    assert "'data.train=[s3://b/{00000..01242}.tar]'" in err  # the pattern, quoted for the shell
    assert len(err) < 700  # one line, not 1,243 values


def test_train_num_samples_twice_and_resume_flag_with_the_override(capsys, tmp_path: Path) -> None:
    """Before: ``data.train_num_samples`` given twice was not even an error; ``--resume X`` is
    ``train.resume=X``, so both given is a key given twice."""
    run = f"output_dir={tmp_path / 'run'}"
    err = one_error(
        capsys, ["pretrain", "--config", CONFIG, run, "data.train_num_samples=8", "data.train_num_samples=9"]
    )
    assert "'data.train_num_samples' given 2 times" in err
    err = one_error(capsys, ["pretrain", "--config", CONFIG, run, "train.resume=auto", "--resume", "auto"])
    assert "'train.resume' given 2 times" in err and "--resume" in err


def test_demo_full_stage_overrides_twice_are_refused(capsys, tmp_path: Path) -> None:
    argv = ["demo", "--full", "--out", str(tmp_path / "demo"), "vqa:train.epochs=1", "vqa:train.epochs=2"]
    err = one_error(capsys, argv)
    assert "'vqa:train.epochs' given 2 times" in err and not (tmp_path / "demo").exists()


def test_distinct_keys_and_layered_overrides_in_code_are_accepted() -> None:
    from vlp.config.load import refuse_repeated_keys

    refuse_repeated_keys(["train.steps=5", "train.seed=1", "model.vision.depth=1"])  # nothing raised
    refuse_repeated_keys([])
    with pytest.raises(ConfigError, match="'a.b' given 3 times"):
        refuse_repeated_keys(["a.b=1", "a.b=2", "a.b = 3"])


def test_two_values_differing_in_digits_get_the_hint_too() -> None:
    from vlp.config.load import refuse_repeated_keys

    with pytest.raises(ConfigError) as e:
        refuse_repeated_keys(["data.train=[/d/cc/{0..1}.tar]".replace("{0..1}", d) for d in ("0", "1")])
    assert "'data.train=[/d/cc/{0..1}.tar]'" in str(e.value)
    for not_expanded in (["train.lr=1e-4", "train.lr=3e-4x"], ["train.steps=4", "train.steps=2"]):
        with pytest.raises(ConfigError) as e:  # not what bash writes out of {a..b}: no hint
            refuse_repeated_keys(not_expanded)
        assert "brace" not in str(e.value)
    with pytest.raises(ConfigError) as e:  # {12..9}: counting down, no zero padding
        refuse_repeated_keys([f"data.train=[/d/{i}.tar]" for i in (12, 11, 10, 9)])
    assert "'data.train=[/d/{12..9}.tar]'" in str(e.value)


BRACE = re.compile(r"\{\w+\.\.\w+\}")


def unquoted_brace_patterns(text: str) -> list[str]:
    """The lines of the code blocks of ``text`` (fenced, or indented by four spaces) with a brace
    pattern (``{00000..01242}``) outside single and double quotes, where a shell would expand it;
    comments count (a command in one is copied too)."""
    found, in_fence = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            in_fence = not in_fence
            continue
        if not (in_fence or line.startswith("    ")):
            continue
        quote = None
        for i, ch in enumerate(line):
            if quote:
                quote = None if ch == quote else quote
            elif ch in "'\"":
                quote = ch
            elif BRACE.match(line, i):
                found.append(line.strip())
                break
    return found


@pytest.mark.parametrize(
    "doc", sorted(p.relative_to(ROOT).as_posix() for p in [ROOT / "README.md", *ROOT.glob("docs/*.md")])
)
def test_every_brace_pattern_in_a_documented_command_is_quoted(doc: str) -> None:
    assert unquoted_brace_patterns((ROOT / doc).read_text()) == []
