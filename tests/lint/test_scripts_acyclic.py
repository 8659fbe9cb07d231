"""No import cycle among the scripts of one folder of scripts/ (they import each other by bare module
name, as ``python scripts/experiments/x.py`` puts the folder on ``sys.path``); imports inside functions
count, as import-linter counts them in vlp/."""

from __future__ import annotations

import ast
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def imports_of(path: Path, siblings: set[str]) -> set[str]:
    """The sibling modules ``path`` imports anywhere in it (top level or inside a function)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & siblings - {path.stem}


def cycles(folder: Path) -> list[list[str]]:
    """Every import cycle among ``folder``'s modules, each once, as the list of modules on it."""
    mods = {p.stem: p for p in folder.glob("*.py")}
    graph = {m: imports_of(p, set(mods)) for m, p in mods.items()}
    found: list[list[str]] = []

    def walk(m: str, path: list[str]) -> None:
        for n in sorted(graph[m]):
            if n == path[0]:
                if min(path) == path[0]:
                    found.append(path)
            elif n not in path and n > path[0]:
                walk(n, [*path, n])

    for m in sorted(graph):
        walk(m, [m])
    return found


def test_no_folder_of_scripts_has_an_import_cycle() -> None:
    folders = {p.parent for p in SCRIPTS.rglob("*.py")}
    assert {str(f.relative_to(SCRIPTS)): cycles(f) for f in folders if cycles(f)} == {}


def test_the_check_finds_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from c import x\n")
    (tmp_path / "c.py").write_text("from a import y\n")
    (tmp_path / "d.py").write_text("import a\n")
    assert cycles(tmp_path) == [["a", "b", "c"]]
