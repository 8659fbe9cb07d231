"""The one table vlp prints numbers in (:mod:`vlp.metrics_table`): columns that line up, every float
to two decimals, counts with thousands separators, splits side by side, text on a line above. That
the files beside stay exact is checked where each command runs (``tests/eval/test_retrieval.py``,
``tests/runs/test_evaluate_task.py``, ``tests/runs/test_finetune_ve.py``)."""

from __future__ import annotations

import pytest

from tests.helpers import table_rows
from vlp.metrics_table import format_metrics, format_table


def test_a_flat_metrics_dict_is_one_aligned_column_of_rounded_numbers() -> None:
    printed = format_metrics({"txt_r1": 49.99999888241291, "img_r10": 7.0, "n": 12345, "acc_yes/no": 1 / 3})
    assert printed.splitlines() == [
        "| metric     |  value |",
        "|------------|-------:|",
        "| txt_r1     |  50.00 |",
        "| img_r10    |   7.00 |",
        "| n          | 12,345 |",
        "| acc_yes/no |   0.33 |",
    ]


def test_splits_are_columns_and_text_entries_a_line_above() -> None:
    results = {
        "task": "retrieval",
        "k_test": 16,
        "best": "runs/ft/checkpoints/best",
        "hypothesis_only": False,
        "labels": ["a", "b"],  # a list: left out
        "val": {"r_mean": 33.3333, "txt_r1": 50.0, "fixed_position": {"accuracy": 25.0, "point": [0.5, 0.5]}},
        "test": {"r_mean": 30.125, "txt_r1": None},
    }
    lines = format_metrics(results).splitlines()
    assert lines[0] == "task: retrieval, best: runs/ft/checkpoints/best, hypothesis_only: False"
    assert len({len(line) for line in lines[1:]}) == 1  # every row as wide: the columns line up
    rows = table_rows("\n".join(lines))
    assert rows["metric"] == ["value", "val", "test"] and rows["k_test"] == ["16", "", ""]
    assert rows["r_mean"] == ["", "33.33", "30.12"] and rows["txt_r1"] == ["", "50.00", ""]
    assert rows["fixed_position.accuracy"] == ["", "25.00", ""] and "labels" not in rows
    assert not any(k.startswith("fixed_position.point") for k in rows)


def test_a_result_without_top_level_numbers_has_no_value_column() -> None:
    rows = table_rows(format_metrics({"task": "vqa", "val": {"acc": 61.0}}))
    assert rows["metric"] == ["val"] and rows["acc"] == ["61.00"]


def test_text_columns_are_left_aligned_and_numbers_right_aligned() -> None:
    table = format_table(("task", "value", "note"), [("vqa", 1.5, "x"), ("nlvr2 (test)", 10.25, None)])
    assert table.splitlines() == [
        "| task         | value | note |",
        "|--------------|------:|------|",
        "| vqa          |  1.50 | x    |",
        "| nlvr2 (test) | 10.25 |      |",
    ]
    with pytest.raises(ValueError, match="every row needs 3 values"):
        format_table(("a", "b", "c"), [(1, 2)])
