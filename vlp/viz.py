"""Plots people would rather look at than numbers: loss and lambda curves, retrieval examples, SRCL
weights, COCOS counts (the Grad-CAM pictures: :mod:`vlp.heat_pictures`). Every picture is titled
with the run and step it shows (``shows``: a :class:`~vlp.pictures.RunStep`; the curves of a
``metrics.jsonl`` read it from the file) and saved with that title as its PNG ``Title``
(:mod:`vlp.pictures`)."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from vlp.data.formats import RetrievalSplit
from vlp.errors import DataError
from vlp.heat_pictures import heat_overlay, layout_with_heat_bar, open_rgb
from vlp.losses.matching import ITM_NEGATIVES_PER_POSITIVE, itm_prior_loss
from vlp.pictures import RunStep, Shows, save_picture, title_picture
from vlp.tasks.regulation_watch import Band, band_of
from vlp.train.logging import EVAL_PREFIX, read_metrics  # noqa: E402

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
    :mod:`vlp.tasks.regulation_watch` watches are drawn with the band of the run's first log windows.
    Titled with the run (the file's folder) and its last logged step."""
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
    title_picture(fig, RunStep.of_metrics(metrics_jsonl, rows), fontsize=10)
    return save_picture(fig, out, 100)


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


def retrieval_rows(
    split: RetrievalSplit,
    scores_t2i: torch.Tensor,
    relevant_images: Optional[list[list[int]]] = None,
    n_queries: int = 6,
    k: int = 5,
) -> list[dict]:
    """What the text->image grid shows: ``n_queries`` evenly spaced captions, each with its top-k
    images (``path``, ``index``, ``mark``: ``truth`` for its own image, ``relevant`` for another
    image the relevance file lists, else null). JSON-ready."""
    step = max(1, len(split.texts) // n_queries)
    rows = []
    for q in list(range(0, len(split.texts), step))[:n_queries]:
        top = scores_t2i[q].topk(min(k, scores_t2i.shape[1])).indices.tolist()
        marks = [
            "truth"
            if j == split.txt2img[q]
            else "relevant"
            if relevant_images is not None and j in relevant_images[q]
            else None
            for j in top
        ]
        rows.append(
            {
                "query": q,
                "text": split.texts[q],
                "top": [
                    {"index": j, "path": str(Path(split.images[j]).resolve()), "mark": m} for j, m in zip(top, marks)
                ],
            }
        )
    return rows


def _inches(pixels: int, dpi: int) -> float:
    """A figure side of ``pixels`` at ``dpi``, in inches. One ulp above ``pixels / dpi``: matplotlib
    before 3.11 truncates ``inches * dpi`` (1.9 * 6 in at 100 dpi drew 1139 pixels), 3.11 rounds it."""
    return math.nextafter(pixels / dpi, math.inf)


def plot_retrieval_grid(
    rows: list[dict],
    out: str | Path,
    heatmaps: Optional[Sequence[torch.Tensor]] = None,
    note: str = "",
    shows: Shows = None,
) -> Path:
    """The grid of :func:`retrieval_rows`: a caption, then its top-k images (green frame: the
    caption's own image, orange: another image it is true of), 180 x 190 pixels per cell.
    ``heatmaps``: per row, the maps [k, h, w] of its top-k images (Grad-CAM of the caption over
    each image, ``vlp plot retrieval --gradcam``), drawn over the images as contour lines
    (:func:`~vlp.heat_pictures.heat_overlay`) with one colour bar; ``note`` ends the title, which
    begins with the run and step the grid shows (``shows``)."""
    if heatmaps is not None and [len(h) for h in heatmaps] != [len(r["top"]) for r in rows]:
        raise ValueError("expected one heat map per retrieved image of every row")
    k = max(len(r["top"]) for r in rows)
    size = (_inches(180 * (k + 1), 100), _inches(190 * len(rows), 100))
    fig, axes = plt.subplots(len(rows), k + 1, figsize=size, squeeze=False)
    for i, (row, info) in enumerate(zip(axes, rows)):
        row[0].axis("off")
        row[0].text(0, 0.5, "\n".join(textwrap.wrap(info["text"], 24)), fontsize=7, va="center")
        for ax in row[1 + len(info["top"]) :]:
            ax.axis("off")
        for r, (ax, item) in enumerate(zip(row[1:], info["top"])):
            rgb = open_rgb(item["path"])
            if heatmaps is None:
                ax.imshow(rgb)
                ax.set_xticks([])
                ax.set_yticks([])
            else:
                heat_overlay(ax, rgb, heatmaps[i][r], "")
            color = {"truth": "limegreen", "relevant": "orange"}.get(item["mark"])
            for s in ax.spines.values():
                s.set_edgecolor(color or "lightgray")
                s.set_linewidth(4 if color else 1)
            ax.set_title(f"#{r + 1}{ax.get_title()}", fontsize=7)
    title_picture(fig, shows, f"text -> image: green = ground truth, orange = also true of the caption{note}")
    if heatmaps is None:
        fig.tight_layout()
    else:
        layout_with_heat_bar(fig)
    return save_picture(fig, out, 100, layout=False)


def plot_retrieval_examples(
    split: RetrievalSplit,
    scores_t2i: torch.Tensor,
    out: str | Path,
    relevant_images: Optional[list[list[int]]] = None,
    n_queries: int = 6,
    k: int = 5,
    shows: Optional[RunStep] = None,
) -> Path:
    """Text->image examples: each row a caption and its top-k images. Green frame: the caption's
    own image; orange: another image the caption is true of (relevance file). The rows shown are
    saved next to the PNG (``retrieval_examples.json`` for ``retrieval_examples.png``, with the run
    and step, ``shows``), from which ``vlp plot retrieval`` draws the grid again."""
    rows = retrieval_rows(split, scores_t2i, relevant_images, n_queries, k)
    shown = {"run": shows.run, "step": shows.step} if shows is not None else {}
    Path(out).with_suffix(".json").write_text(json.dumps({"direction": "t2i", "k": k, **shown, "rows": rows}, indent=1))
    return plot_retrieval_grid(rows, out, shows=shows)


def find_retrieval_examples(run_or_eval_dir: str | Path) -> Path:
    """The ``retrieval_examples.json`` an evaluation saved, in the folder given or its ``eval/``;
    a folder with neither raises :class:`DataError`."""
    d = Path(run_or_eval_dir)
    found = [p for p in (d / "retrieval_examples.json", d / "eval" / "retrieval_examples.json") if p.is_file()]
    if not found:
        raise DataError(
            f"{d}: no retrieval_examples.json here or in {d / 'eval'}; `vlp evaluate retrieval` "
            "(or pretraining with data.eval) writes it next to retrieval_examples.png"
        )
    return found[0]


def replot_retrieval(run_or_eval_dir: str | Path, out: Optional[str | Path] = None) -> Path:
    """The retrieval grid again from the ``retrieval_examples.json`` an evaluation saved (in the
    folder given or its ``eval/``); default output: the PNG next to it."""
    found = find_retrieval_examples(run_or_eval_dir)
    saved = json.loads(found.read_text())
    return plot_retrieval_grid(saved["rows"], out or found.with_suffix(".png"), shows=examples_run(saved))


def examples_run(saved: dict) -> Optional[RunStep]:
    """The run and step a saved ``retrieval_examples.json`` shows (None: saved before they were)."""
    return RunStep(saved["run"], saved.get("step")) if "run" in saved else None


def plot_weight_heatmap(
    w: torch.Tensor,
    image_paths: Sequence[str],
    captions: Sequence[str],
    out: str | Path,
    title: str = "",
    shows: Shows = None,
) -> Path:
    """One batch's SRCL weight matrix (rows: image anchors, i2t; columns: captions). The
    diagonal (positives, weight 1 by definition) is hatched; each row's negatives average 1.
    Captions are wrapped to the room above their column and cut short with an ellipsis where
    they do not fit (:func:`_column_captions`)."""
    n = w.shape[0]
    fig = plt.figure(figsize=(1.2 + 0.62 * n, 2.2 + 0.55 * n))
    title_picture(fig, shows, title, y=0.995)
    ax = fig.add_axes((0.14, 0.05, 0.72, 0.62))
    vmax = max(2.0, float(w.max()))
    im = ax.imshow(w.numpy(), cmap="viridis", vmin=0.0, vmax=vmax)
    for i in range(n):
        ax.add_patch(plt.Rectangle((i - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="white", lw=0))
        for j in range(n):
            if i != j:
                ax.text(
                    j,
                    i,
                    f"{float(w[i, j]):.2f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white" if float(w[i, j]) < 0.6 * vmax else "black",
                )
    ax.set_xticks(range(n))
    ax.set_xticklabels(_column_captions(captions, fig, ax, fontsize=6), rotation=90, fontsize=6)
    ax.xaxis.tick_top()
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"image {i}" for i in range(n)], fontsize=6)
    for i, path in enumerate(image_paths):  # thumbnails left of the rows
        with Image.open(path) as img:
            thumb = img.convert("RGB")
        h = 0.62 / n
        tax = fig.add_axes(
            (0.02, 0.05 + 0.62 - (i + 1) * h, h * 0.9 * fig.get_figheight() / fig.get_figwidth(), h * 0.9)
        )
        tax.imshow(thumb)
        tax.axis("off")
    cax = fig.add_axes((0.88, 0.05, 0.02, 0.62))
    fig.colorbar(im, cax=cax, label="weight")
    return save_picture(fig, out, 110, layout=False)


def _column_captions(captions: Sequence[str], fig: plt.Figure, ax: plt.Axes, fontsize: float) -> list[str]:
    """``captions`` as vertical column labels of ``ax`` (drawn top, rotated 90 degrees) that fit:
    wrapped to lines as long as the room between the axes and the figure's title allows (a
    rotated line runs upwards), as many lines as fit side by side in one column's width; a
    caption longer than that ends with an ellipsis."""
    fig_w, fig_h = fig.get_size_inches()
    box = ax.get_position()
    column_pt = box.width * fig_w * 72 / max(1, len(captions))
    title_pt = 1.5 * 8 * (fig.get_suptitle().count("\n") + 1)  # the title's lines (8 pt)
    above_pt = (1 - box.y1) * fig_h * 72 - title_pt - fontsize - 8  # and the ticks' pad
    lines = max(1, int((column_pt - 3) / (1.25 * fontsize)))  # matplotlib's line spacing is 1.2
    width = max(8, int(above_pt / (0.62 * fontsize)))  # 0.62 em: a wide average glyph of DejaVu Sans
    out = []
    for caption in captions:
        wrapped = textwrap.wrap(caption, width) or [""]
        if len(wrapped) > lines:
            wrapped = wrapped[:lines]
            wrapped[-1] = wrapped[-1][: width - 1].rstrip() + "\u2026"
        out.append("\n".join(wrapped))
    return out


def plot_weight_histogram(
    values: torch.Tensor,
    out: str | Path,
    title: str = "",
    marked: dict[str, torch.Tensor] | None = None,
    shows: Shows = None,
) -> Path:
    """Histogram of negative weights over many batches, with the paper's 0.2 and 0.7 levels.
    ``marked``: optional named subsets (e.g. known false negatives) drawn on top."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    k = max(1, int(0.99 * values.numel()))  # kthvalue: quantile() refuses more than 16M values
    hi = min(5.0, max(2.5, float(values.float().kthvalue(k).values)))  # heavier tails land in the last bin
    bins = torch.linspace(0, hi, 61).numpy()
    ax.hist(values.clamp(max=hi).numpy(), bins=bins, density=True, alpha=0.6, label=f"all negatives ({len(values)})")
    for name, v in (marked or {}).items():
        if len(v):
            ax.hist(
                v.clamp(max=hi).numpy(), bins=bins, density=True, histtype="step", lw=1.5, label=f"{name} ({len(v)})"
            )
    for row, level in enumerate((0.2, 0.7)):
        frac = float((values < level).float().mean())
        ax.axvline(level, color="gray", ls="--", lw=1)
        ax.text(level, ax.get_ylim()[1] * (0.92 - 0.08 * row), f" below {level}: {100 * frac:.1f}%", fontsize=7)
    ax.set_xlabel(f"SRCL weight (values above {hi:.1f} in the last bin)")
    ax.set_ylabel("density")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    title_picture(fig, shows)
    return save_picture(fig, out, 110)


def plot_run_curves(
    runs: dict[str, str | Path], key: str, out: str | Path, title: str, hlines: Optional[dict[str, float]] = None
) -> Path:
    """One metric (e.g. ``ltd_lambda``) of several runs' ``metrics.jsonl`` on shared axes; ``hlines``
    draws labelled reference levels (e.g. each run's eta). Titled with each run and its last step."""
    fig, ax = plt.subplots(figsize=(7, 4))
    shows = []
    for label, path in runs.items():
        records = read_metrics(path)
        shows.append(RunStep.of_metrics(path, records))
        rows = [r for r in records if r.get(key) is not None]
        (line,) = ax.plot([r["step"] for r in rows], [r[key] for r in rows], label=label)
        if hlines and label in hlines:
            ax.axhline(hlines[label], color=line.get_color(), ls=":", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    title_picture(fig, shows)
    return save_picture(fig, out, 120)


def integer_bins(top: int, max_bins: int = 40) -> list[float]:
    """Histogram edges for whole numbers 0..``top``: at k - 0.5, each bin ``ceil((top + 1) /
    max_bins)`` counts wide, the last bin reaching past ``top``."""
    width = max(1, math.ceil((top + 1) / max_bins))
    return [k - 0.5 for k in range(0, top + width + 1, width)]


def plot_cocos(counts: dict[str, torch.Tensor], out: str | Path, title: str, shows: Shows = None) -> Path:
    """Histograms of COCOS per-query contributing-candidate counts, one panel per direction.
    Counts are whole numbers: the bins are centred on them (edges at k - 0.5), one count a bin
    up to 40 bins, else the fewest whole counts a bin that keep to 40 (:func:`integer_bins`)."""
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(counts), figsize=(5 * len(counts), 3.4), squeeze=False)
    for ax, (direction, c) in zip(axes[0], counts.items()):
        c = c.float()
        ax.hist(
            c.numpy(),
            bins=integer_bins(int(c.max().item()) if c.numel() else 0),
            color="tab:blue",
            alpha=0.8,
            edgecolor="white",
            linewidth=0.5,
        )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(
            f"{direction}: mean {c.mean():.2f}, zero-gradient queries {(c == 0).float().mean():.1%}", fontsize=9
        )
        ax.set_xlabel("contributing candidates per query")
        ax.set_ylabel("queries")
        ax.grid(alpha=0.3)
    title_picture(fig, shows, title, fontsize=9)
    return save_picture(fig, out, 120)


def plot_attribute_bars(
    values: dict[str, float],
    out: str | Path,
    title: str,
    ylabel: str,
    reference: Optional[dict[str, float]] = None,
    reference_label: str = "baseline",
    line: Optional[float] = None,
    line_label: str = "",
    shows: Shows = None,
) -> Path:
    """One bar per attribute (``values``, e.g. probe accuracy), with a grey bar beside each from
    ``reference`` (e.g. the majority-class baseline) and a dashed level ``line`` (e.g. chance 0.5);
    the value is written above each bar (``vlp analyze probes | minimal-pairs | ltd-floor``)."""
    names = list(values)
    x = torch.arange(len(names), dtype=torch.float64).numpy()
    width = 0.4 if reference else 0.6
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(names) + 1.5), 3.6))
    bars = ax.bar(x - (width / 2 if reference else 0), [values[n] for n in names], width, label=ylabel)
    ax.bar_label(bars, fmt="%.2f", fontsize=7)
    if reference:
        ref = ax.bar(x + width / 2, [reference.get(n, 0.0) for n in names], width, color="0.7", label=reference_label)
        ax.bar_label(ref, fmt="%.2f", fontsize=7)
    if line is not None:
        ax.axhline(line, color="k", ls="--", lw=1, label=line_label or None)
    ax.set_xticks(x, names, rotation=20, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    if reference or line_label:
        ax.legend(fontsize=7)
    title_picture(fig, shows)
    return save_picture(fig, out, 120)


def plot_confusion(
    matrix: torch.Tensor | Sequence[Sequence[int]],
    class_names: Sequence[str],
    path: str | Path,
    title: str,
    shows: Shows = None,
) -> Path:
    """A confusion matrix [C, C] of counts (rows: true class, columns: predicted class), coloured
    by the share of each true class's images (rows sum to 1) and annotated with the counts
    (``vlp evaluate classification``)."""
    m = torch.as_tensor(matrix, dtype=torch.float64)
    share = m / m.sum(1, keepdim=True).clamp(min=1)
    c = len(class_names)
    side = max(3.5, 0.55 * c + 2.0)
    fig, ax = plt.subplots(figsize=(side + 0.8, side))
    im = ax.imshow(share.numpy(), cmap="Blues", vmin=0.0, vmax=1.0)
    for i in range(c):
        for j in range(c):
            if m[i, j] > 0:
                ax.text(
                    j,
                    i,
                    f"{int(m[i, j])}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if share[i, j] > 0.5 else "black",
                )
    ax.set_xticks(range(c), list(class_names), rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(c), list(class_names), fontsize=8)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    title_picture(fig, shows)
    return save_picture(fig, path, 120)
