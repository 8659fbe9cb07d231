"""docs/architecture.md held to the code: its layout lists every module of vlp/, and every module,
file and ``module.name`` it cites in backticks exists (read with ast: nothing is imported).

What counts as a citation: a backticked token that starts with ``vlp.`` / ``vlp/`` / ``tests/`` /
``scripts/``, or that holds a ``/`` and names a vlp module (``runs/evaluation/by_kind.run_evaluate``,
``data/formats.py``); config keys (``loss.contrastive.name``) and commands are not citations.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
_ENTRY = re.compile(r"^( *)(\S+)")
_PY = re.compile(r"\b([\w/]+\.py)\b")
_TICK = re.compile(r"`([^`\s]+)`")


def layout_modules(text: str) -> set[str]:
    """The module files (``cli/train.py``, relative to vlp/) the ``## Layout`` block lists: an entry is a
    line's first token ending in ``/`` or ``.py`` (its folder from the indentation, two spaces a
    level); other ``x.py`` names on an entry's line are its siblings."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    listed: set[str] = set()
    folders: list[tuple[int, str]] = []  # (indent, folder path) of the open folders
    for line in block.splitlines()[1:]:
        m = _ENTRY.match(line)
        if not m:
            continue
        indent, token = len(m.group(1)), m.group(2).rstrip(",")
        while folders and folders[-1][0] >= indent:
            folders.pop()
        if not (token.endswith("/") or token.endswith(".py")):
            continue
        base = folders[-1][1] if folders else ""
        if token == "vlp/" and not folders:
            folders.append((indent, ""))
            continue
        path = base + token
        if token.endswith("/"):
            folders.append((indent, path))
            listed.add(path)
        here = path.rsplit("/", 1)[0] + "/" if "/" in path.rstrip("/") else base
        if token.endswith("/"):
            here = path
        for name in _PY.findall(line):
            listed.add(name if "/" in name and name.split("/")[0] in _top_level() else here + name)
    return listed


@lru_cache(maxsize=1)
def _top_level() -> frozenset[str]:
    return frozenset(
        p.stem if p.suffix == ".py" else p.name
        for p in (ROOT / "vlp").iterdir()
        if p.suffix == ".py" or (p / "__init__.py").exists()
    )


def package_modules() -> set[str]:
    """Every module file of vlp/ relative to it (``__init__.py`` of a package and ``__main__.py`` count
    through their package, which the layout lists as a folder)."""
    return {str(p.relative_to(ROOT / "vlp")) for p in (ROOT / "vlp").rglob("*.py") if p.name not in ("__init__.py",)}


def missing_from_layout(text: str) -> list[str]:
    """The modules of vlp/ the layout does not list, sorted."""
    return sorted(package_modules() - layout_modules(text))


def _module_file(parts: list[str]) -> Optional[Path]:
    base = ROOT / "vlp" / Path(*parts) if parts else ROOT / "vlp"
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.exists():
            return cand
    return None


def _defines(path: Path, names: list[str]) -> bool:
    """Whether ``names`` (``["Class", "method"]`` or ``["function"]``) is defined in the module at ``path``:
    a top-level def, class, assignment or import, then a class's own def or assignment."""
    body = ast.parse(path.read_text()).body
    for name in names:
        found = None
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                found = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    found = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                    found = node
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def stale_citations(text: str) -> list[str]:
    """The cited modules, files and names that do not exist, in order of appearance."""
    stale = []
    for token in (t.rstrip(".,;:)") for t in _TICK.findall(text)):
        if token.startswith(("tests/", "scripts/", "docs/")):
            exists = (ROOT / token.split("::")[0]).exists()
        elif token.startswith("vlp.") and "/" not in token:
            exists = _cited_exists(token[4:].split("."))
        elif token.startswith("vlp/") or ("/" in token and token.split("/")[0] in _top_level()):
            rel = token.removeprefix("vlp/")
            if rel.endswith((".py", "/")):
                exists = (ROOT / "vlp" / rel).exists()
            else:
                folder, _, last = rel.rpartition("/")
                exists = _cited_exists([*folder.split("/"), *last.split(".")])
        else:
            continue
        if not exists:
            stale.append(token)
    return stale


def _cited_exists(parts: list[str]) -> bool:
    """``parts`` (``["runs", "evaluation", "by_kind", "run_evaluate"]``) as a module followed by the names
    it defines, read longest module first."""
    for cut in range(len(parts), 0, -1):
        path = _module_file(parts[:cut])
        if path is not None:
            return cut == len(parts) or _defines(path, parts[cut:])
    return False


def test_the_layout_lists_every_module_of_vlp() -> None:
    assert missing_from_layout(DOC.read_text()) == []


def test_every_module_file_and_name_it_cites_exists() -> None:
    assert stale_citations(DOC.read_text()) == []


def test_the_check_fails_on_a_stale_name_a_missing_module_and_a_missing_test() -> None:
    text = DOC.read_text()
    assert stale_citations("`runs/evaluate.run_evaluate_retrieval` and `vlp.checkpoint.open_checkpoint`") == [
        "runs/evaluate.run_evaluate_retrieval"
    ]
    assert stale_citations("`vlp.checkpoint.no_such_thing` `tests/test_no_such_file.py` `loss.contrastive.name`") == [
        "vlp.checkpoint.no_such_thing",
        "tests/test_no_such_file.py",
    ]
    assert stale_citations("`train/loop.train` `weights.py`") == []
    without = text.replace("    loop.py ", "    zz_gone.py ", 1)
    assert "train/loop.py" in missing_from_layout(without)
