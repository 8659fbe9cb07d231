"""A run's curves: the records of its ``metrics.jsonl`` against step (``vlp plot losses`` and
``trajectories``: loss terms, schedules and learned scalars, SRCL statistics, the zero-shot retrieval
of ``train.eval_every``; one metric of several runs). The other plots are :mod:`vlp.viz`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from vlp.errors import DataError  # noqa: E402
from vlp.losses.matching import ITM_NEGATIVES_PER_POSITIVE, itm_prior_loss  # noqa: E402
from vlp.tasks.regulation_watch import Band, band_of  # noqa: E402
from vlp.train.logging import EVAL_PREFIX, read_metrics  # noqa: E402
from vlp.viz import save_figure  # noqa: E402

LOSS_KEYS = ("loss", "itc", "itm", "mlm", "contrastive", "ltd_rec", "ltd_lambda")
#: schedules and learned scalars: ITC distillation weight, temperature, LTD multiplier and bound
#: violation, SRCL helper share
TRAJECTORY_KEYS = ("alpha", "temp", "ltd_lambda", "ltd_violation", "srcl_alpha_h")


def loss_levels() -> dict[str, tuple[float, str]]:
    """Reference levels of the loss panels: ITM's prior, the loss of a head that always predicts
    the share of matching pairs (1 positive : ``ITM_NEGATIVES_PER_POSITIVE`` negatives)."""
    prior = itm_prior_loss()
    return {"itm": (prior, f"class prior, 1 : {ITM_NEGATIVES_PER_POSITIVE} ({prior:.4f})")}


#: a panel: its title and the ``metrics.jsonl`` keys drawn in it
Panel = tuple[str, tuple[str, ...]]
#: the SRCL statistics of a regulated run, one row of panels (docs/methods.md, "Diagnostics")
SRCL_PANELS: tuple[Panel, ...] = (
    ("srcl_alpha_h", ("srcl_alpha_h",)),
    ("share of negatives below 0.2 / 0.7", ("srcl_w_below_0_2", "srcl_w_below_0_7")),
    ("N_eff / negatives", ("srcl_n_eff_share",)),
    ("mean weights", ("srcl_w_mean", "srcl_w_same_image", "srcl_w_true_false_negatives")),
)

#: pretraining's zero-shot retrieval on data.eval (``train.eval_every``): recall@1 both ways and
#: the mean recall, in percent
EVAL_PANELS: tuple[Panel, ...] = (
    ("zero-shot retrieval R@1 (%)", tuple(f"{EVAL_PREFIX}{k}" for k in ("txt_r1", "img_r1"))),
    ("zero-shot retrieval r_mean (%)", (f"{EVAL_PREFIX}r_mean",)),
)


def _draw_panel(ax: plt.Axes, rows: list[dict], panel: Panel, band: Band, level: Optional[tuple[float, str]]) -> None:
    """One panel: each of its keys against step (records without the key, or with null, left out);
    a key the regulation watch bands gets its band shaded and its warning limits dotted
    (:mod:`vlp.tasks.regulation_watch`); ``level``: a horizontal reference line (value, label)."""
    title, keys = panel
    for k in keys:
        pts = [(r["step"], r[k]) for r in rows if r.get(k) is not None]
        if not pts:
            continue
        (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 30 else None, label=k)
        if k in band.limits:
            lo, hi = band.values(k)
            ax.axhspan(lo, hi, color=line.get_color(), alpha=0.15, lw=0, label=f"{k} band")
            for limit in band.warning_limits(k):
                ax.axhline(limit, color=line.get_color(), ls=":", lw=1)
    if level is not None:
        ax.axhline(level[0], color="gray", ls="--", lw=1, label=level[1])
    if len(keys) > 1 or level is not None or band.limits.keys() & set(keys):
        ax.legend(fontsize=7)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)


def plot_panel_rows(
    metrics_jsonl: str | Path,
    out: str | Path,
    grid: Sequence[Sequence[Panel]],
    what: str,
    levels: Optional[dict[str, tuple[float, str]]] = None,
) -> Path:
    """Rows of panels (value against step), 400 x 320 pixels each, of the panels of ``grid`` that
    some record of ``metrics.jsonl`` has a key of; a row with none is left out. ``levels``: per
    panel title, a horizontal reference line (value, legend label). SRCL statistics that
    :mod:`vlp.tasks.regulation_watch` watches are drawn with the band of the run's first log windows."""
    rows = read_metrics(metrics_jsonl)
    wanted = [k for row in grid for _, keys in row for k in keys]
    shown = [[p for p in row if any(r.get(k) is not None for r in rows for k in p[1])] for row in grid]
    shown = [row for row in shown if row]
    if not shown:
        raise DataError(f"{metrics_jsonl}: no {what} to plot (none of {', '.join(wanted)} in its {len(rows)} records)")
    cols = max(len(row) for row in shown)
    fig, axes = plt.subplots(len(shown), cols, figsize=(4 * cols, 3.2 * len(shown)), squeeze=False)
    band = band_of(rows)
    for ax_row, row in zip(axes, shown):
        for ax, panel in zip(ax_row, row):
            _draw_panel(ax, rows, panel, band, (levels or {}).get(panel[0]))
        for ax in ax_row[len(row) :]:
            ax.axis("off")
    return save_figure(fig, out, 100)


def plot_metric_panels(
    metrics_jsonl: str | Path,
    out: str | Path,
    keys: Sequence[str],
    what: str,
    levels: Optional[dict[str, tuple[float, str]]] = None,
) -> Path:
    """One panel per key of ``keys`` that some record of ``metrics.jsonl`` holds, side by side
    (:func:`plot_panel_rows` with one row of one key per panel)."""
    return plot_panel_rows(metrics_jsonl, out, [[(k, (k,)) for k in keys]], what, levels)


def plot_losses(metrics_jsonl: str | Path, out: str | Path, keys: Sequence[str] = LOSS_KEYS) -> Path:
    """Training curves from ``metrics.jsonl`` (one panel per loss term); the ITM panel marks the
    loss of the class prior (:func:`loss_levels`). A regulated run adds a row of its SRCL
    statistics (:data:`SRCL_PANELS`, :func:`plot_srcl_regulation`), a run with ``train.eval_every``
    a row of its zero-shot retrieval against step (:data:`EVAL_PANELS`)."""
    grid = [[(k, (k,)) for k in keys], SRCL_PANELS, EVAL_PANELS]
    return plot_panel_rows(metrics_jsonl, out, grid, "losses", loss_levels())


def plot_srcl_regulation(metrics_jsonl: str | Path, out: str | Path) -> Path:
    """The SRCL statistics of a regulated run against step (:data:`SRCL_PANELS`), the shares below
    0.2 / 0.7 and N_eff with the band of the first log windows and the regulation watch's warning
    limits (dotted)."""
    return plot_panel_rows(metrics_jsonl, out, [SRCL_PANELS], "SRCL statistics")


def plot_trajectories(metrics_jsonl: str | Path, out: str | Path, keys: Sequence[str] = TRAJECTORY_KEYS) -> Path:
    """alpha, temp and, when logged, ltd_lambda, ltd_violation, srcl_alpha_h against step."""
    return plot_metric_panels(metrics_jsonl, out, keys, "trajectories")


def plot_run_curves(
    runs: dict[str, str | Path], key: str, out: str | Path, title: str, hlines: Optional[dict[str, float]] = None
) -> Path:
    """One metric (e.g. ``ltd_lambda``) of several runs' ``metrics.jsonl`` on shared axes; ``hlines``
    draws labelled reference levels (e.g. each run's eta)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, path in runs.items():
        rows = [r for r in read_metrics(path) if r.get(key) is not None]
        (line,) = ax.plot([r["step"] for r in rows], [r[key] for r in rows], label=label)
        if hlines and label in hlines:
            ax.axhline(hlines[label], color=line.get_color(), ls=":", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, out, 120)
