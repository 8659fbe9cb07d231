"""A kind's name is written once (issue 43): the modules under vlp/ that select behaviour by a kind
import its constant from :mod:`vlp.kinds`, so no built-in kind name is a string literal (docstrings
excluded) in more than :data:`MAX_FILES` files."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from vlp.kinds import KINDS, NLVR
from vlp.models.build import MODEL_BUILDERS

VLP = Path(__file__).parents[2] / "vlp"
#: the files a name may be a literal in: kinds.py and the separate concepts spelled the same
#: (data.formats' annotation kinds, data.downstream_formats' dataset tags, ...)
MAX_FILES = 3
#: names that are not kinds but were written all over vlp/ the same way: the dual encoder
#: architecture, the zero-shot classification evaluation
OTHER_NAMES = ("dual", "classification")


def docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of the module, its classes and functions."""
    scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, scopes)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }


def literal_files(root: Path, names: set[str]) -> dict[str, list[str]]:
    """Name -> the sorted files (relative to ``root``'s parent) under ``root`` holding it as a
    string literal outside docstrings; names found nowhere are absent."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        skip = docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in skip:
                found[node.value].add(str(path.relative_to(root.parent)))
    return {name: sorted(files) for name, files in found.items()}


def built_in_kind_names() -> set[str]:
    """The names of the built-in kinds (those whose model builder is defined in vlp), NLVR's short
    name and :data:`OTHER_NAMES`."""
    built_in = {n for n in KINDS.names() if n in MODEL_BUILDERS and MODEL_BUILDERS.get(n).__module__.startswith("vlp.")}
    return built_in | {NLVR, *OTHER_NAMES}


def test_each_kind_name_is_a_literal_in_at_most_three_files() -> None:
    names = built_in_kind_names()
    assert {"pretrain", "retrieval", "vqa", "nlvr2", "ve", "grounding"} <= names
    spread = {name: files for name, files in literal_files(VLP, names).items() if len(files) > MAX_FILES}
    assert not spread, "kind names written as literals in more than 3 files (import the constant of vlp.kinds):\n" + (
        "\n".join(f"  {name}: {', '.join(files)}" for name, files in sorted(spread.items()))
    )


def test_the_counter_finds_a_literal_and_skips_docstrings(tmp_path: Path) -> None:
    pkg = tmp_path / "vlp"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text('"""About "vqa" and vqa."""\n\nKIND = "vqa"\n')
    (pkg / "sub" / "b.py").write_text('def f(k):\n    """vqa"""\n    return k == "vqa" or k == "ve"\n')
    (pkg / "c.py").write_text('def g():\n    """vqa"""\n    return "vqa-plan"\n')
    assert literal_files(pkg, {"vqa", "ve", "grounding"}) == {
        "vqa": ["vlp/a.py", "vlp/sub/b.py"],
        "ve": ["vlp/sub/b.py"],
    }
