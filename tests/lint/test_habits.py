"""The habits `make lint` checks (scripts/lint/habits.py): each kind of break is found in a small
tree written here, named by file and line, and what keeps the habit passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import load_script


@pytest.fixture()
def habits():
    return load_script("scripts/lint/habits.py")


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def function(name: str, body_lines: int, doc: bool = True) -> str:
    """A function of ``body_lines + 1`` lines (``def`` included; the docstring is one of them)."""
    body = (['    """Doc."""'] if doc else ["    x = 0"]) + ["    x = 1"] * (body_lines - 1)
    return "\n".join([f"def {name}():", *body, ""]) + "\n"


def test_each_break_is_named_by_file_and_line(habits, tmp_path: Path) -> None:
    write(tmp_path, "vlp/lab/long.py", "import os\n\n" + function("fine", 79) + function("too_long", 80))
    write(tmp_path, "scripts/big.py", "x = 1\n" * 601)
    write(tmp_path, "vlp/data/loader.py", function("documented", 3) + function("undocumented", 3, doc=False))
    write(
        tmp_path,
        "vlp/data/model.py",
        "class Thing:\n    def act(self):\n        pass\n\n    def _quiet(self):\n        pass\n",
    )
    write(tmp_path, "vlp/runs/uses.py", "from vlp.data.loader import _helper\nfrom .sibling import _other\n")
    write(tmp_path, "vlp/lab/third.py", "from torch.utils._python_dispatch import _disable_current_modes\n")
    assert [str(b) for b in habits.check(tmp_path)] == [
        "vlp/data/loader.py:6: public undocumented has no docstring",
        "vlp/data/model.py:2: public Thing.act has no docstring",
        "vlp/lab/long.py:84: too_long is 81 lines, over 80: split it into named steps",
        "vlp/runs/uses.py:1: imports _helper from vlp.data.loader: give it a public name",
        "vlp/runs/uses.py:2: imports _other from .sibling: give it a public name",
        "scripts/big.py:1: 601 lines, over 600: split the file by concept",
    ]
    assert habits.main([str(tmp_path)]) == 1


def test_docstrings_are_asked_only_in_the_documented_packages(habits, tmp_path: Path) -> None:
    write(tmp_path, "vlp/lab/tool.py", function("undocumented", 3, doc=False))
    write(tmp_path, "vlp/train/loop.py", function("_private_helper", 3, doc=False) + function("step", 3))
    assert habits.check(tmp_path) == [] and habits.main([str(tmp_path)]) == 0


def test_the_allow_list_is_short_and_names_what_exists(habits, tmp_path: Path, monkeypatch) -> None:
    write(tmp_path, "scripts/big.py", "x = 1\n" * 601 + function("long", 90))
    monkeypatch.setattr(habits, "ALLOWED", {"scripts/big.py": "why", "scripts/big.py::long": "why"})
    assert habits.check(tmp_path) == []
    monkeypatch.setattr(habits, "ALLOWED", {f"scripts/f{i}.py": "why" for i in range(4)})
    found = [str(b) for b in habits.check(tmp_path)]
    assert found[0] == "scripts/lint/habits.py:1: 4 allowed exceptions, at most 3"
    assert "scripts/lint/habits.py:1: ALLOWED names scripts/f0.py, which does not exist" in found


def test_library_code_logs_instead_of_printing(habits, tmp_path: Path, monkeypatch) -> None:
    """A ``print`` planted in a library module is a break; the command line, the progress bar and the
    scripts print; a method named ``print`` is not the builtin."""
    write(tmp_path, "vlp/data/loud.py", "import sys\n\n\ndef _f():\n    print('hi', file=sys.stderr)\n")
    write(tmp_path, "vlp/cli/train.py", "print('the command line prints')\n")
    write(tmp_path, "vlp/progress.py", "print('so does the progress bar')\n")
    write(tmp_path, "vlp/clip.py", "print('vlp/cli/ is a folder, not a prefix')\n")
    write(tmp_path, "vlp/models/table.py", "def show(t):\n    t.print()\n")
    write(tmp_path, "scripts/tool.py", "print('scripts are programs')\n")
    why = "print() in library code: log it (logger = logging.getLogger(__name__); logger.info / logger.warning)"
    assert [str(b) for b in habits.check(tmp_path)] == [f"vlp/clip.py:1: {why}", f"vlp/data/loud.py:5: {why}"]
    assert habits.main([str(tmp_path)]) == 1


def test_this_checkout_prints_only_from_the_command_line_and_the_progress_bar(habits) -> None:
    assert habits.PRINTS == ("vlp/cli/", "vlp/progress.py")
    root = Path(__file__).resolve().parents[2]
    assert [b for b in habits.check(root) if "print" in b.what] == []
