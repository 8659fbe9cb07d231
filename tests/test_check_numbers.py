"""``scripts/check_numbers.py`` (issue 31, item 6): the figures the docs quote, read back and compared
at the precision they are printed with. The commands themselves (the demo: minutes) are not run here."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("check_numbers", ROOT / "scripts" / "check_numbers.py")
check_numbers = importlib.util.module_from_spec(spec)
sys.modules["check_numbers"] = check_numbers  # its dataclass looks itself up there
spec.loader.exec_module(check_numbers)


def test_a_fresh_value_is_printed_as_the_doc_prints_it():
    like = check_numbers.like
    assert like("129.20", 129.2) == "129.20" and like("2,402", 2402) == "2,402" and like("0", 0) == "0"
    assert like("11.60", 11.7) == "11.70"  # a moved figure reads as moved


def test_the_readme_demo_table_is_read_and_compared(tmp_path):
    table = check_numbers.quoted_table("README.md", "| metric | vlp tiny | chance | x chance |")
    assert {"txt_r1", "img_r1", "r_mean", "rsum", "img_r5_rel"} <= set(table)
    demo = tmp_path / "demo_out"
    demo.mkdir()
    metrics = {k: float(v) for k, v in table.items()}
    metrics["rsum"] += 1.0
    (demo / "metrics.json").write_text(json.dumps(metrics))
    figures = check_numbers.check_demo(tmp_path, demo)
    assert len(figures) == len(table)
    assert [f.name for f in figures if f.moved] == ["rsum"]


def test_the_count_ops_table_is_read_from_its_after_column():
    table = check_numbers.quoted_table("docs/performance.md", "| | before | after | target |", column=2)
    assert table["device syncs per step"].strip("*") == "0"
    assert table["kernel-launching ops per step"].startswith("2,")


def test_a_passage_the_docs_no_longer_hold_is_reported_moved(tmp_path, monkeypatch):
    monkeypatch.setattr(check_numbers, "quoted_table", lambda *a, **k: {})
    demo = tmp_path / "demo_out"
    demo.mkdir()
    (demo / "metrics.json").write_text("{}")
    [figure] = check_numbers.check_demo(tmp_path, demo)
    assert figure.moved and figure.measured is None


def test_accelerate_is_launched_through_this_interpreter_without_the_venv_on_path():
    """The documented ``accelerate launch`` runs as ``python -m accelerate.commands.launch``, so the
    check works when the virtualenv's ``bin/`` is not on PATH (``.venv/bin/python scripts/...``)."""
    assert check_numbers.ACCELERATE[0] == sys.executable
    done = subprocess.run(
        [*check_numbers.ACCELERATE, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "--multi_gpu" in done.stdout
