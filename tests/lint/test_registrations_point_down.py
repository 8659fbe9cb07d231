"""Registrations point down (issue 53): no ``"module:attribute"`` string that names vlp code, and no
module imported by name at run time (``importlib.import_module``, ``__import__``), anywhere in vlp/ but
vlp/plugins.py, whose job that is for outside code. Such links are upward imports the import
contracts cannot see."""

from __future__ import annotations

import ast
import re
from pathlib import Path

VLP = Path(__file__).resolve().parents[2] / "vlp"
REF = re.compile(r"^vlp(\.\w+)+:\w*$")  # "vlp.x.y:name", or a prefix "vlp.x.y:" to add a name to


def hidden_links(path: Path) -> list[str]:
    """``line: what`` for each string reference and import by name in the module at ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and REF.match(node.value):
            found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                found.append(f"{node.lineno}: {name}(...)")
    return found


def test_no_string_registration_or_import_by_name_in_vlp() -> None:
    found = {str(p.relative_to(VLP)): hidden_links(p) for p in sorted(VLP.rglob("*.py")) if p.name != "plugins.py"}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_check_sees_both_kinds_of_hidden_link(tmp_path: Path) -> None:
    mod = tmp_path / "m.py"
    mod.write_text('import importlib\nREF = "vlp.models.build:albef_with_mlm"\nimportlib.import_module("vlp.api")\n')
    assert hidden_links(mod) == ["2: 'vlp.models.build:albef_with_mlm'", "3: import_module(...)"]
