"""SRCL's regulation watched over the whole run: the band its statistics hold in the first log
windows, and one warning line each time a later window leaves that band.

``delta`` is calibrated once, at ``alpha_h = 1`` (``vlp analyze helper``), and kept while
``alpha_h`` anneals and the live model's similarities take over, so the regulation it gives may
fade (towards plain ITC) or sharpen. Each statistic below is read from a ``metrics.jsonl`` record
as a *strength*, 0 for plain ITC (every weight 1) and growing as the weights move away from 1:

- ``srcl_w_below_0_7``, ``srcl_w_below_0_2``: the shares of negatives below those weights;
- ``1 - srcl_n_eff_share``: the share of the negatives the weights take out of the contrast in
  effect (``N_eff = (sum w)^2 / sum w^2`` per row, over the row's ``n_neg``).

The **band** of a statistic is ``[min, max]`` of its strength over the first :data:`BAND_LOGS`
log windows of the process (``alpha_h`` near 1: the regulation ``delta`` was calibrated for).
A later window *leaves* it when a strength falls under ``min / BAND_FACTOR`` (fading) or rises over
``max * BAND_FACTOR`` (sharpening); the warning is printed once per excursion, and the watch is
armed again once every strength is back within ``[min / REARM_FACTOR, max * REARM_FACTOR]``.
A statistic whose smallest strength in the band windows is under :data:`LOW_REGULATION` is not
watched (a share that small cannot be told to halve); if ``srcl_w_below_0_7`` is that small in a
band window the run hardly regulates from the start, and that is warned once instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

#: metrics.jsonl key -> whether its strength is ``1 - value`` (else the value itself)
STRENGTHS: dict[str, bool] = {"srcl_w_below_0_7": False, "srcl_w_below_0_2": False, "srcl_n_eff_share": True}
#: the log windows (of SRCL records) whose statistics make the band
BAND_LOGS = 3
#: a strength leaves the band below ``min / BAND_FACTOR`` or above ``max * BAND_FACTOR``
BAND_FACTOR = 2.0
#: ... and is back in it (the watch re-armed) within ``min / REARM_FACTOR`` .. ``max * REARM_FACTOR``
REARM_FACTOR = math.sqrt(BAND_FACTOR)
#: below this share of negatives under weight 0.7 the run is close to plain ITC (the paper: ~20%)
LOW_REGULATION = 0.01
#: what each statistic is called in a warning
LABELS = {
    "srcl_w_below_0_7": "share below 0.7",
    "srcl_w_below_0_2": "share below 0.2",
    "srcl_n_eff_share": "N_eff / negatives",
}


def strengths(record: dict[str, Any]) -> dict[str, float]:
    """The record's regulation strengths (0: plain ITC), for the :data:`STRENGTHS` keys it holds
    with a finite value."""
    out = {}
    for key, complement in STRENGTHS.items():
        v = record.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[key] = 1.0 - v if complement else float(v)
    return out


@dataclass
class Band:
    """Per statistic, the ``(min, max)`` of its strength over the band windows."""

    limits: dict[str, tuple[float, float]] = field(default_factory=dict)

    def add(self, s: dict[str, float]) -> None:
        for k, v in s.items():
            lo, hi = self.limits.get(k, (v, v))
            self.limits[k] = (min(lo, v), max(hi, v))

    def watched(self) -> dict[str, tuple[float, float]]:
        """The statistics strong enough at the start to be watched (smallest >= LOW_REGULATION)."""
        return {k: (lo, hi) for k, (lo, hi) in self.limits.items() if lo >= LOW_REGULATION}

    def outside(self, s: dict[str, float], factor: float) -> dict[str, str]:
        """The watched statistics of ``s`` outside ``[min / factor, max * factor]``: key ->
        ``"fading"`` (below) or ``"sharpening"`` (above)."""
        out = {}
        for k, (lo, hi) in self.watched().items():
            if k in s and s[k] < lo / factor:
                out[k] = "fading"
            elif k in s and s[k] > hi * factor:
                out[k] = "sharpening"
        return out

    def values(self, key: str, factor: float = 1.0) -> tuple[float, float]:
        """The band of ``key`` widened by ``factor`` (strengths ``min / factor`` .. ``max * factor``)
        in the record's own terms (the value, not its strength), low to high."""
        lo, hi = self.limits[key]
        lo, hi = lo / factor, hi * factor
        return (1.0 - hi, 1.0 - lo) if STRENGTHS[key] else (lo, hi)

    def warning_limits(self, key: str) -> tuple[float, ...]:
        """The values of ``key`` beyond which a window leaves the band (none: ``key`` not watched)."""
        return self.values(key, BAND_FACTOR) if key in self.watched() else ()


def band_of(records: list[dict[str, Any]]) -> Band:
    """The band of a finished run's ``metrics.jsonl`` records, as the watch measured it: its first
    :data:`BAND_LOGS` records with SRCL statistics (plots)."""
    band = Band()
    for s in [x for x in map(strengths, records) if x][:BAND_LOGS]:
        band.add(s)
    return band


class RegulationWatch:
    """Reads every log record of a regulated run (:meth:`check`); at most one warning line per
    record. ``knob``: how the message names what to recalibrate (e.g. ``loss.srcl.delta=3.2``)."""

    def __init__(self, knob: str) -> None:
        self.knob = knob
        self.band = Band()
        self.band_logs = 0
        self.low_warned = False
        self.out_of_band = False

    def check(self, record: dict[str, Any]) -> Optional[str]:
        """A warning about ``record`` (a log window's ``metrics.jsonl`` record), or None."""
        s = strengths(record)
        if "srcl_w_below_0_7" not in s:  # no SRCL statistics in this window (e.g. every step skipped)
            return None
        if self.band_logs < BAND_LOGS:
            self.band_logs += 1
            self.band.add(s)
            if s["srcl_w_below_0_7"] < LOW_REGULATION and not self.low_warned:
                self.low_warned = True
                return self._low(record)
            return None
        if self.out_of_band:
            self.out_of_band = bool(self.band.outside(s, REARM_FACTOR))
            return None
        left = self.band.outside(s, BAND_FACTOR)
        if not left:
            return None
        self.out_of_band = True
        return self._excursion(record, left)

    def _low(self, record: dict[str, Any]) -> str:
        share, low = float(record["srcl_w_below_0_7"]), float(record.get("srcl_w_below_0_2", math.nan))
        return (
            f"step {record.get('step')}: only {100 * share:.2f}% of the ITC negatives have an SRCL weight below "
            f"0.7 ({100 * low:.2f}% below 0.2; the paper: about 20% below 0.7, false negatives near 0.12): with "
            f"{self.knob} this helper hardly regulates, and the run is close to plain ITC. Calibrate delta at this "
            "batch and queue with `vlp analyze helper --cache HELPER_FEATURES --data TRAIN.json --batch-size B "
            "--queue Q --out DIR` (docs/methods.md, 'Calibrating delta')"
        )

    def _excursion(self, record: dict[str, Any], left: dict[str, str]) -> str:
        kinds = set(left.values())
        what = (
            "faded (the run is moving towards plain ITC)"
            if kinds == {"fading"}
            else "sharpened (more negatives down-weighted than at the start)"
            if kinds == {"sharpening"}
            else "left its band"
        )
        parts = []
        for k in left:
            lo, hi = self.band.values(k)
            parts.append(f"{LABELS[k]} {100 * float(record[k]):.1f}% (band {100 * lo:.1f}-{100 * hi:.1f}%)")
        alpha = record.get("srcl_alpha_h")
        at = f" (alpha_h {float(alpha):.2f})" if isinstance(alpha, (int, float)) else ""
        return (
            f"step {record.get('step')}{at}: the SRCL regulation has {what} since the first {BAND_LOGS} log "
            f"windows: {', '.join(parts)} ({self.knob}, set for the start; no further warning until it is back in "
            "band; docs/methods.md, 'Regulation over the run')"
        )
