"""The design of ``srcl_calibration.py``, read by the experiment and by its report
(``srcl_calibration_report.py``), so that neither imports the other's caller: the helpers, the arms
of each grid and their default seeds, the endpoint and the metrics reported."""

from __future__ import annotations

from typing import Optional

AUCS = (0.65, 0.75, 0.85, 0.95)
#: helper name -> target ROC-AUC of the noised oracle (None: the learned helper)
HELPERS: dict[str, Optional[float]] = {**{f"oracle AUC {q:g}": q for q in AUCS}, "learned helper": None}
PLAIN = "plain ITC"
PRIMARY_ARMS = [PLAIN, *(f"SRCL, {h}" for h in HELPERS)]
SWEPT = ("oracle AUC 0.65", "oracle AUC 0.85", "learned helper")
FACTORS = (0.25, 0.5, 2.0, 4.0)
SWEEP_ARMS = [f"SRCL, {h}, delta x{f:g}" for h in SWEPT for f in FACTORS]
GRIDS = {"primary": (PRIMARY_ARMS, tuple(range(12))), "sweep": (SWEEP_ARMS, (0, 1, 2))}
ENDPOINT = "img_r_precision"  # the pre-registered primary endpoint: text->image R-precision
METRICS = ("img_r_precision", "img_ndcg10", "img_r_precision@generic", "txt_r_precision", "img_r1")


def helper_of(arm: str) -> tuple[Optional[str], float]:
    """An arm's helper (None: plain ITC) and its delta factor over the no-GT delta."""
    if arm == PLAIN:
        return None, 1.0
    parts = arm.split(", ")
    factor = float(parts[2].removeprefix("delta x")) if len(parts) == 3 else 1.0
    return parts[1], factor
