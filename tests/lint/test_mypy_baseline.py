"""The type-check baseline of `make lint` only tightens (scripts/lint/mypy_baseline.py)."""

from tests.helpers import load_script


def load():
    return load_script("scripts/lint/mypy_baseline.py")


def test_a_file_above_its_baseline_a_new_file_with_errors_and_a_strict_file_fail():
    judge = load().judge
    baseline = {"vlp/train/loop.py": 3, "vlp/losses/ltd.py": 2}
    counts = {"vlp/train/loop.py": 4, "vlp/data/new.py": 1, "vlp/losses/ltd.py": 1, "vlp/models/albef.py": 0}
    worse, better = judge(counts, baseline, ["vlp/losses/", "vlp/weights.py"])
    # loop.py above its 3; a file the baseline does not list may have none; a strict module none at all,
    # whatever the baseline says
    assert worse == {"vlp/train/loop.py": (4, 3), "vlp/data/new.py": (1, 0), "vlp/losses/ltd.py": (1, 0)}
    assert better == {"vlp/losses/ltd.py": (1, 2)}


def test_at_or_below_the_baseline_passes_and_the_gain_is_reported():
    judge = load().judge
    worse, better = judge({"vlp/api.py": 7}, {"vlp/api.py": 9, "vlp/cli.py": 1}, ["vlp/losses/"])
    assert worse == {}
    assert better == {"vlp/api.py": (7, 9), "vlp/cli.py": (0, 1)}


def test_the_strict_modules_are_read_from_pyproject():
    strict = load().strict_files()
    assert "vlp/losses/" in strict and "vlp/config/" in strict and "vlp/eval/metrics.py" in strict
    assert "vlp/weights.py" in strict and "vlp/errors.py" in strict
