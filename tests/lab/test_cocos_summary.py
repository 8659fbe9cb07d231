"""``vlp analyze cocos``'s summary stays JSON (issue 31, item 4): a statistic undefined in some
batches (NaN) is left out of its mean and its std, and one never measured is ``null``, not NaN."""

from __future__ import annotations

import json
import math

import pytest

from vlp.lab.cocos import format_cocos, mean_std


def test_mean_and_std_leave_undefined_batches_out() -> None:
    s = mean_std([7.4, math.nan, 7.5])
    assert s["mean"] == pytest.approx(7.45) and s["std"] == pytest.approx(0.0707107, rel=1e-5)
    assert mean_std([math.nan, math.nan]) == {"mean": None, "std": 0.0}
    assert mean_std([3.0]) == {"mean": 3.0, "std": 0.0}
    record = {"stats": {"t2i_count": mean_std([7.4, math.nan, 7.5]), "never": mean_std([math.nan])}}
    json.dumps(record, allow_nan=False)  # valid JSON
    table = format_cocos(record)
    assert "7.450 +- 0.071" in table and "n/a" in table
