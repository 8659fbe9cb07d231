"""Grad-CAM pictures: heat maps drawn as contour lines over the untinted image (:func:`heat_overlay`),
with one colour bar a figure (:func:`layout_with_heat_bar`): ``vlp explain``'s word grid
(:func:`plot_word_heatmaps`), ``vlp evaluate grounding``'s examples (:func:`plot_grounding_examples`)
and the heat maps of ``vlp plot retrieval --gradcam`` (:func:`vlp.viz.plot_retrieval_grid`). Each
picture is titled with the run and step it shows (:func:`vlp.pictures.title_picture`)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from vlp.pictures import Shows, save_picture, title_picture  # noqa: E402

#: Grad-CAM maps are contour lines of this perceptual colour map over the untinted image
HEAT_CMAP = "viridis"
#: the levels of the lines, on the map scaled to [0, 1]
HEAT_LEVELS = (0.25, 0.5, 0.75)
#: the label of a figure's colour bar of those levels
GRADCAM_LABEL = "Grad-CAM (normalised)"


def heat_overlay(ax: plt.Axes, image: Image.Image, heatmap: torch.Tensor, title: str) -> None:
    """``image`` as it is, with ``heatmap`` [h, w] upsampled bicubically to its pixels (as
    :func:`vlp.eval.grounding.box_scores` does), scaled to [0, 1] per map (ALBEF's ``getAttMap``)
    and drawn over it as contour lines at ``HEAT_LEVELS`` in ``HEAT_CMAP``, each outlined in black
    so that it shows on any colour. The image is not tinted: the colours a caption names can be
    checked by eye. A constant map has no lines and " (flat)" ends its title. The figure's colour
    bar: :func:`layout_with_heat_bar`."""
    import matplotlib.patheffects as pe
    import torch.nn.functional as F

    w, h = image.size
    up = F.interpolate(heatmap.detach().float().cpu()[None, None], size=(h, w), mode="bicubic", align_corners=False)
    up = up[0, 0] - up.min()
    flat = not float(up.max()) > 0  # a constant map (e.g. a word's map in the last fusion layer: zero)
    if flat:
        title += " (flat)"
    else:
        up = up / up.max()
    ax.imshow(image)
    if not flat:
        lines = ax.contour(up.numpy(), levels=HEAT_LEVELS, cmap=HEAT_CMAP, vmin=0.0, vmax=1.0, linewidths=1.1)
        lines.set_path_effects([pe.Stroke(linewidth=2.0, foreground="black"), pe.Normal()])
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=8)


def layout_with_heat_bar(fig: plt.Figure, strip: float = 0.9) -> None:
    """``tight_layout`` of ``fig`` widened by ``strip`` inches on the right, where the one colour
    bar of its Grad-CAM panels goes (``HEAT_CMAP`` over [0, 1], ticks at 0, ``HEAT_LEVELS`` and 1,
    labelled ``GRADCAM_LABEL``)."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    w, h = fig.get_size_inches()
    fig.set_size_inches(w + strip, h)
    right = w / (w + strip)
    fig.tight_layout(rect=(0.0, 0.0, right, 1.0))
    cax = fig.add_axes((right + 0.08 * strip / (w + strip), 0.12, 0.16 / (w + strip), 0.76))
    bar = fig.colorbar(ScalarMappable(Normalize(0.0, 1.0), HEAT_CMAP), cax=cax, ticks=(0.0, *HEAT_LEVELS, 1.0))
    bar.set_label(GRADCAM_LABEL, fontsize=7)
    bar.ax.tick_params(labelsize=6)


def open_rgb(image: str | Path | Image.Image) -> Image.Image:
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    with Image.open(image) as im:
        return im.convert("RGB")


def panel_grid(n: int, cols: int, side: float = 2.2, title_height: float = 0.3):
    """A figure of ``n`` square panels of ``side`` inches, ``cols`` a row, ``title_height`` inches
    above each for its title; the unused panels are hidden. Returns (figure, the n axes and the rest)."""
    ncols = min(cols, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(side * ncols, (side + title_height) * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return fig, list(axes.flat)


SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[PAD]")


def explain_title(text: str, itm_score: float, layer: int) -> str:
    """The title of ``vlp explain``'s word grid (and ``vlp serve``'s heat map) for the text ``text``:
    the pair's ITM match probability and the fusion layer of the maps."""
    return f"{text!r}: ITM match {itm_score:.3f}, fusion layer {layer}"


def plot_word_heatmaps(
    image: str | Path | Image.Image,
    tokens: Sequence[str],
    maps: torch.Tensor,
    out: str | Path,
    title: Optional[str] = None,
    cols: int = 6,
    shows: Shows = None,
) -> Path:
    """One PNG grid (``vlp explain``): the image, the mean of the maps over every token (the
    grounding map), then one panel per word token (``[CLS]``/``[SEP]``/``[PAD]`` have no panel of
    their own) with its heat map [h, w] of ``maps`` [T, h, w] over the image (contour lines,
    :func:`heat_overlay`), titled by the word; one colour bar at the right. The figure's title: the
    run and step (``shows``), then ``title``."""
    if maps.dim() != 3 or len(tokens) != maps.shape[0]:
        raise ValueError(f"expected one map [h, w] per token: {len(tokens)} tokens, maps {tuple(maps.shape)}")
    rgb = open_rgb(image)
    words = [i for i, t in enumerate(tokens) if t not in SPECIAL_TOKENS]
    fig, axes = panel_grid(2 + len(words), cols)
    axes[0].imshow(rgb)
    axes[0].set_xticks([])
    axes[0].set_yticks([])
    axes[0].set_title("image", fontsize=8)
    heat_overlay(axes[1], rgb, maps.mean(0), "all tokens")
    for ax, i in zip(axes[2:], words):
        heat_overlay(ax, rgb, maps[i], tokens[i])
    title_picture(fig, shows, title or "", fontsize=9)
    layout_with_heat_bar(fig)
    return save_picture(fig, out, 100, layout=False)


def plot_grounding_examples(rows: Sequence[dict], out: str | Path, cols: int = 4, shows: Shows = None) -> Path:
    """Grounding examples (``vlp evaluate grounding``): per row of ``rows`` (``image`` path,
    ``text``, ``heatmap`` [h, w], ``chosen`` and ``target`` boxes ``[x, y, w, h]``, ``hit``) the
    image under its heat map (contour lines, :func:`heat_overlay`; one colour bar), the target
    box (green, dashed) and the chosen box (white when right, red when wrong), titled by the
    expression; the figure by the run and step (``shows``) and the boxes' colours."""
    from matplotlib.patches import Rectangle

    if not rows:
        raise ValueError("no grounding examples to plot")
    fig, axes = panel_grid(len(rows), cols, side=2.6, title_height=0.8)
    for ax, row in zip(axes, rows):
        text = "\n".join(textwrap.wrap(row["text"], 28))
        heat_overlay(
            ax,
            open_rgb(row["image"]),
            torch.as_tensor(row["heatmap"]),
            f"{text}\n{'right' if row['hit'] else 'wrong'}",
        )
        chosen_colour = "white" if row["hit"] else "red"
        for (x, y, w, h), colour, line in ((row["target"], "limegreen", "--"), (row["chosen"], chosen_colour, "-")):
            ax.add_patch(
                Rectangle((x - 0.5, y - 0.5), w, h, fill=False, linewidth=1.5, edgecolor=colour, linestyle=line)
            )
    title_picture(fig, shows, "green dashed: target; white: chosen (right), red: chosen (wrong)")
    layout_with_heat_bar(fig)
    return save_picture(fig, out, 100, layout=False)
