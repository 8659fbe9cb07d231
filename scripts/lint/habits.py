"""The written habits of docs/architecture.md ("Habits"), checked: ``make lint`` fails on a break.

    python scripts/lint/habits.py            # vlp/ and scripts/ of this checkout; exit status 1 on a break

- **lengths**: no function over :data:`MAX_FUNCTION` lines (``def`` to its last line, decorators
  excluded) and no file over :data:`MAX_FILE` lines, in ``vlp/`` and ``scripts/``;
- **docstrings**: every public function, and every public method of a public class, in the packages of
  :data:`DOCUMENTED` has one (public: the name does not start with ``_``; dunders are not counted);
- **private names stay in their module**: no ``from vlp.X import _name`` (or ``from .X import _name``)
  in ``vlp/`` and ``scripts/``: a helper that another module needs gets a public name. Private names of
  third-party packages are not vlp's to rename and are not checked;
- **library code logs**: no ``print(...)`` call in ``vlp/`` outside :data:`PRINTS` (the command line
  and the progress bar): every other module logs on ``logging.getLogger(__name__)``, which ``vlp``
  prints (:mod:`vlp.console`) and a Python user levels or silences.

:data:`ALLOWED` is the allow-list: at most :data:`MAX_ALLOWED` entries, each with the reason it stays.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

MAX_FUNCTION = 80
MAX_FILE = 600
ROOTS = ("vlp", "scripts")
DOCUMENTED = ("vlp/data", "vlp/train", "vlp/features", "vlp/config", "vlp/remote", "vlp/prepare")
MAX_ALLOWED = 3
#: "path" (a long file) or "path::function" (a long function) -> why it stays; at most MAX_ALLOWED
ALLOWED: dict[str, str] = {}
#: what may call ``print``: a folder (ending in ``/``) or a file of vlp/
PRINTS = ("vlp/cli/", "vlp/progress.py")


@dataclass(frozen=True)
class Break:
    """One break of a habit: where (``path:line``), and what."""

    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def length_breaks(rel: str, source: str, tree: ast.AST) -> list[Break]:
    """The file's length over :data:`MAX_FILE` and each function over :data:`MAX_FUNCTION`, unless allowed."""
    out = []
    lines = source.count("\n")
    if lines > MAX_FILE and rel not in ALLOWED:
        out.append(Break(rel, 1, f"{lines} lines, over {MAX_FILE}: split the file by concept"))
    for f in _functions(tree):
        n = (f.end_lineno or f.lineno) - f.lineno + 1
        if n > MAX_FUNCTION and f"{rel}::{f.name}" not in ALLOWED:
            out.append(Break(rel, f.lineno, f"{f.name} is {n} lines, over {MAX_FUNCTION}: split it into named steps"))
    return out


def _public(name: str) -> bool:
    return not name.startswith("_")


def docstring_breaks(rel: str, tree: ast.Module) -> list[Break]:
    """Public top-level functions and public methods of public classes without a docstring."""
    out = []
    for node in tree.body:
        members: list[tuple[str, ast.AST]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            members = [(node.name, node)]
        elif isinstance(node, ast.ClassDef) and _public(node.name):
            members = [
                (f"{node.name}.{m.name}", m)
                for m in node.body
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
        for name, f in members:
            assert isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            if _public(f.name) and ast.get_docstring(f) is None:
                out.append(Break(rel, f.lineno, f"public {name} has no docstring"))
    return out


def private_import_breaks(rel: str, tree: ast.AST) -> list[Break]:
    """``from vlp.X import _name`` and relative imports of a ``_name``: another module's private helper."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        ours = node.level > 0 or (node.module or "").split(".")[0] == "vlp"
        for alias in node.names if ours else ():
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                where = "." * node.level + (node.module or "")
                out.append(Break(rel, node.lineno, f"imports {alias.name} from {where}: give it a public name"))
    return out


def _prints(tree: ast.AST) -> list[int]:
    """The lines of the calls of the builtin ``print`` (by its bare name) in ``tree``."""
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"
    ]


def print_breaks(rel: str, tree: ast.AST) -> list[Break]:
    """Each ``print(...)`` of a vlp/ module outside :data:`PRINTS`."""
    may = any(rel.startswith(p) if p.endswith("/") else rel == p for p in PRINTS)
    if may or not rel.startswith("vlp/"):
        return []
    lines = _prints(tree)
    why = "print() in library code: log it (logger = logging.getLogger(__name__); logger.info / logger.warning)"
    return [Break(rel, line, why) for line in lines]


def check_file(root: Path, path: Path) -> list[Break]:
    """Every break in one file (``root``: the checkout, for the relative path named)."""
    rel = path.relative_to(root).as_posix()
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=rel)
    out = length_breaks(rel, source, tree) + private_import_breaks(rel, tree) + print_breaks(rel, tree)
    if any(rel.startswith(p + "/") for p in DOCUMENTED):
        out += docstring_breaks(rel, tree)
    return out


def check(root: Path, roots: tuple[str, ...] = ROOTS) -> list[Break]:
    """Every break under ``roots`` of ``root``, in path order; an allow-list over :data:`MAX_ALLOWED`
    entries, or one naming nothing that exists, is a break of its own."""
    out = []
    if len(ALLOWED) > MAX_ALLOWED:
        out.append(Break("scripts/lint/habits.py", 1, f"{len(ALLOWED)} allowed exceptions, at most {MAX_ALLOWED}"))
    for name in sorted(ALLOWED):
        if not (root / name.split("::")[0]).is_file():
            out.append(Break("scripts/lint/habits.py", 1, f"ALLOWED names {name}, which does not exist"))
    for r in roots:
        for path in sorted((root / r).rglob("*.py")):
            out += check_file(root, path)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[2]
    breaks = check(root)
    for b in breaks:
        print(b)
    print(f"habits: {len(breaks)} break(s) in {', '.join(ROOTS)}" if breaks else f"habits: kept in {', '.join(ROOTS)}")
    return 1 if breaks else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
