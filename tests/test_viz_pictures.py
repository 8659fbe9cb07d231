"""Pictures that show what they mean to (issue 31, item 8): Grad-CAM panels keep the image's own
colours and carry a colour bar, the ITM loss panel marks its prior, the SRCL heatmap's captions do
not overlap, the COCOS histogram's bins are centred on the integers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from PIL import Image

import vlp.viz
from vlp.heat_pictures import plot_grounding_examples, plot_word_heatmaps
from vlp.losses.matching import ITM_NEGATIVES_PER_POSITIVE, itm_prior_loss
from vlp.pictures import RunStep
from vlp.viz import (
    plot_attribute_bars,
    plot_cocos,
    plot_confusion,
    plot_losses,
    plot_retrieval_grid,
    plot_run_curves,
    plot_weight_heatmap,
    plot_weight_histogram,
)

RED, BLUE, WHITE = (220, 30, 30), (30, 30, 220), (255, 255, 255)
GRADCAM_LABEL = "Grad-CAM (normalised)"


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Figure]]:
    """The figures :mod:`vlp.viz` draws, kept open after saving (its ``plt.close`` is recorded)."""
    close = vlp.viz.plt.close
    kept: list[Figure] = []
    monkeypatch.setattr(vlp.viz.plt, "close", kept.append)
    yield kept
    for fig in kept:
        close(fig)


# ----------------------------------------------------------------------------- Grad-CAM panels


@pytest.fixture
def two_squares(tmp_path: Path) -> Path:
    """64 x 64, white: a red square (8..30) at the top left, a blue one (38..60) at the bottom right."""
    im = Image.new("RGB", (64, 64), WHITE)
    im.paste(RED, (8, 8, 30, 30))
    im.paste(BLUE, (38, 38, 60, 60))
    path = tmp_path / "squares.png"
    im.save(path)
    return path


def hot_on_red() -> torch.Tensor:
    """An 8 x 8 map whose peak covers the red square's centre (cell 2, 2: pixels 16..24)."""
    m = torch.zeros(8, 8)
    m[2, 2] = 1.0
    m[1:4, 1:4] += 0.3
    return m


def rendered(fig: Figure, ax: Axes, x: float, y: float) -> np.ndarray:
    """The RGB drawn at image pixel (x, y) of ``ax`` (mean of 3 x 3 screen pixels around it)."""
    fig.canvas.draw()
    buf = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(float)
    px, py = ax.transData.transform((x, y))
    row, col = int(round(buf.shape[0] - py)), int(round(px))
    return buf[row - 1 : row + 2, col - 1 : col + 2].reshape(-1, 3).mean(0)


def words_figure(image: Path, tmp_path: Path) -> str:
    """``vlp explain``'s grid; returns the title of the panel to look at."""
    tokens = ["[CLS]", "a", "red", "square", "[SEP]"]
    maps = torch.stack([hot_on_red()] * len(tokens))
    plot_word_heatmaps(image, tokens, maps, tmp_path / "words.png", title="a red square")
    return "red"


def grounding_figure(image: Path, tmp_path: Path) -> str:
    """``vlp evaluate grounding``'s examples."""
    row = {"image": str(image), "text": "red square", "heatmap": hot_on_red().tolist(), "hit": True}
    plot_grounding_examples([{**row, "chosen": [8, 8, 22, 22], "target": [8, 8, 22, 22]}], tmp_path / "g.png")
    return "red square\nright"


def retrieval_figure(image: Path, tmp_path: Path) -> str:
    """``vlp plot retrieval --gradcam``'s grid."""
    rows = [{"query": 0, "text": "a red square", "top": [{"index": 0, "path": str(image), "mark": "truth"}]}]
    plot_retrieval_grid(rows, tmp_path / "r.png", [hot_on_red()[None]])
    return "#1"


@pytest.mark.parametrize("draw", [words_figure, grounding_figure, retrieval_figure])
def test_heat_panels_keep_the_images_colours_and_have_one_colour_bar(
    draw: Callable[[Path, Path], str], two_squares: Path, tmp_path: Path, figures: list[Figure]
) -> None:
    """The red square under the map's peak still reads red, the blue square and the white ground
    far from it keep their colours (a jet overlay tints all three); one colour bar, not jet."""
    title = draw(two_squares, tmp_path)
    [fig] = figures
    [ax] = [a for a in fig.axes if a.get_title() == title]
    for (x, y), colour in (((19, 19), RED), ((49, 49), BLUE), ((34, 4), WHITE)):
        np.testing.assert_allclose(rendered(fig, ax, x, y), colour, atol=12, err_msg=f"pixel ({x}, {y})")
    bars = [a for a in fig.axes if GRADCAM_LABEL in (a.get_xlabel(), a.get_ylabel())]
    assert len(bars) == 1
    assert bars[0]._colorbar.cmap.name != "jet"  # type: ignore[attr-defined]
    assert all(im.get_cmap().name != "jet" for a in fig.axes for im in a.images)


def test_a_flat_map_is_titled_flat_and_drawn_without_lines(two_squares: Path, tmp_path: Path, figures) -> None:
    """A constant map (a word in the last fusion layer) has no contour to draw: the image alone."""
    plot_word_heatmaps(two_squares, ["[CLS]", "red", "[SEP]"], torch.zeros(3, 8, 8), tmp_path / "flat.png")
    [fig] = figures
    [ax] = [a for a in fig.axes if a.get_title() == "red (flat)"]
    assert not ax.collections
    np.testing.assert_allclose(rendered(fig, ax, 19, 19), RED, atol=12)


# ----------------------------------------------------------------------------- ITM prior


def test_the_itm_prior_is_the_loss_of_predicting_the_label_prior_on_the_tasks_labels() -> None:
    """``itm_prior_loss`` is what ``itm_loss_at`` gives a head that always predicts the share of
    positives among the pairs the task builds: 1 : 2, entropy 0.6365."""
    from vlp.tasks.objectives import ITMPairs, itm_loss_at

    b = 8
    p = 1 / (1 + ITM_NEGATIVES_PER_POSITIVE)

    class PriorHead:
        def itm_logits(self, fused: torch.Tensor) -> torch.Tensor:
            return torch.tensor([math.log(1 - p), math.log(p)]).expand(fused.shape[0], 2)

    rows = b * (1 + ITM_NEGATIVES_PER_POSITIVE)
    pairs = ITMPairs(torch.zeros(rows, 4, 2), torch.ones(rows, 4), None, None, torch.ones(rows, dtype=torch.bool), None)
    loss = itm_loss_at(PriorHead(), torch.zeros(rows, 4, 2), pairs)  # type: ignore[arg-type]
    assert float(loss) == pytest.approx(itm_prior_loss(), abs=1e-6)
    assert itm_prior_loss() == pytest.approx(-(1 / 3 * math.log(1 / 3) + 2 / 3 * math.log(2 / 3)))
    assert itm_prior_loss() == pytest.approx(0.6365, abs=1e-4)


def test_the_itm_loss_panel_draws_the_prior_with_a_legend(tmp_path: Path, figures: list[Figure]) -> None:
    rows = [
        {"step": s, "loss": 3.0 - 0.1 * s, "itc": 2.0 - 0.1 * s, "itm": 0.70 - 0.01 * s, "mlm": 1.0 + 0.05 * s}
        for s in range(1, 6)
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot_losses(path, tmp_path / "loss_curves.png")
    [fig] = figures
    by_title = {a.get_title(): a for a in fig.axes}
    assert set(by_title) == {"loss", "itc", "itm", "mlm"}

    def flat_lines(ax: Axes) -> list[float]:
        return [float(ln.get_ydata()[0]) for ln in ax.get_lines() if len(set(map(float, ln.get_ydata()))) == 1]

    [level] = flat_lines(by_title["itm"])
    assert level == pytest.approx(itm_prior_loss())
    legend = by_title["itm"].get_legend()
    assert legend is not None and any("prior" in t.get_text() for t in legend.get_texts())
    lo, hi = by_title["itm"].get_ylim()
    assert lo < level < hi
    assert all(not flat_lines(by_title[k]) for k in ("loss", "itc", "mlm"))


def test_a_regulated_runs_loss_plot_adds_its_srcl_statistics_with_their_band(
    tmp_path: Path, figures: list[Figure]
) -> None:
    """Issue 40 part 3: a second row with alpha_h, the shares below 0.2 / 0.7, N_eff / negatives and
    the mean weights; the band of the first three windows is shaded and the watch's limits dotted."""
    rows = [
        {
            "step": 10 * s,
            "loss": 3.0 - 0.1 * s,
            "srcl_alpha_h": 1 - s / 8,
            "srcl_w_below_0_2": 0.05,
            "srcl_w_below_0_7": 0.2 if s <= 3 else 0.05,
            "srcl_n_eff_share": 0.8 if s <= 3 else 0.97,
            "srcl_w_mean": 1.0,
            **({"srcl_w_same_image": 0.3} if s % 2 else {}),
        }
        for s in range(1, 9)
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot_losses(path, tmp_path / "loss_curves.png")
    [fig] = figures
    shown = [a for a in fig.axes if a.axison]
    titles = [a.get_title() for a in shown]
    assert titles == ["loss", "srcl_alpha_h", "share of negatives below 0.2 / 0.7", "N_eff / negatives", "mean weights"]
    assert Image.open(tmp_path / "loss_curves.png").size == (1600, 640)  # 4 columns, 2 rows
    n_eff = shown[3]
    [span] = n_eff.patches
    assert span.get_y() == pytest.approx(0.8) and span.get_height() == pytest.approx(0.0, abs=1e-9)
    dotted = sorted(float(ln.get_ydata()[0]) for ln in n_eff.get_lines() if ln.get_linestyle() == ":")
    assert dotted == pytest.approx([0.6, 0.9])  # strength 0.2 halved or doubled
    labels = [ln.get_label() for ln in shown[4].get_lines()]
    assert labels == ["srcl_w_mean", "srcl_w_same_image"]  # srcl_w_true_false_negatives: not logged


# ----------------------------------------------------------------------------- SRCL heatmap captions

#: shapes-world captions as long as the heatmap meets them (scene captions name every object)
CAPTIONS = [
    "a small green square on the left and a large blue triangle in the center and a large yellow square at the "
    "bottom right",
    "a large green square left of a blue square",
    "a small orange square at the top and a small orange diamond on the left and a large purple triangle at the "
    "bottom left",
    "a small blue triangle at the top right and a small purple circle on the left and a large green square on the "
    "right",
    "one small triangle",
]


@pytest.mark.parametrize("n", [4, 10, 16])
def test_srcl_heatmap_captions_do_not_overlap(tmp_path: Path, figures: list[Figure], n: int) -> None:
    """Column captions (the default batch of 10 of ``vlp plot srcl-weights``, and sizes around it)
    neither overlap each other nor leave the figure nor reach its title (two lines: the run and
    step, then what it shows), and each begins with its caption."""
    paths = []
    for i in range(n):
        p = tmp_path / f"i{i}.png"
        Image.new("RGB", (8, 8), (20 * i % 255, 100, 100)).save(p)
        paths.append(str(p))
    captions = [CAPTIONS[i % len(CAPTIONS)] for i in range(n)]
    w = torch.rand(n, n, generator=torch.Generator().manual_seed(0)) * 2
    shows = RunStep("srcl_run", 500)
    plot_weight_heatmap(w, paths, captions, tmp_path / "h.png", "SRCL weights (i2t rows), batch of n", shows)
    [fig] = figures
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    ax = fig.axes[0]
    labels = ax.get_xticklabels()
    assert len(labels) == n
    boxes = [t.get_window_extent(renderer) for t in labels]
    for left, right in zip(boxes, boxes[1:]):
        assert left.x1 <= right.x0, (left, right)
    page = fig.bbox
    title = fig._suptitle.get_window_extent(renderer)  # type: ignore[union-attr]
    for box in boxes:
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= title.y0
    for label, caption in zip(labels, captions):
        assert " ".join(label.get_text().split()).startswith(caption[:10])


# ----------------------------------------------------------------------------- COCOS histogram


def bars(ax: Axes) -> list[tuple[float, float, float]]:
    """(left edge, width, height) of each histogram bar."""
    return [(p.get_x(), p.get_width(), p.get_height()) for p in ax.patches]


def test_cocos_bins_are_centred_on_the_integers(tmp_path: Path, figures: list[Figure]) -> None:
    counts = torch.tensor([0, 0, 1, 2, 2, 2, 3, 7, 7, 9])
    plot_cocos({"i2t": counts, "t2i": counts + 1}, tmp_path / "c.png", "COCOS")
    [fig] = figures
    for ax, shift in zip(fig.axes, (0, 1)):
        found = bars(ax)
        assert all(x + 0.5 == pytest.approx(round(x + 0.5)) and w == pytest.approx(1.0) for x, w, _ in found)
        heights = {round(x + 0.5): h for x, _, h in found}
        for k in range(int(counts.max()) + 1):
            assert heights[k + shift] == int((counts == k).sum())


def test_cocos_bins_of_a_wide_range_still_fall_on_half_integers(tmp_path: Path, figures: list[Figure]) -> None:
    """More values than bins: each bin holds several whole counts, its edges still at k - 0.5."""
    counts = torch.arange(0, 301) % 173
    plot_cocos({"t2i": counts}, tmp_path / "c.png", "COCOS")
    [ax] = figures[0].axes
    found = bars(ax)
    assert len(found) <= 40 and sum(h for *_, h in found) == len(counts)
    for x, w, _ in found:
        assert x + 0.5 == pytest.approx(round(x + 0.5)) and w == pytest.approx(round(w)) and w >= 1


# ----------------------------------------------------------------------------- every picture titled


def test_a_checkpoints_run_and_step_and_a_logs_last_step(tmp_path: Path) -> None:
    ckpt = tmp_path / "ft_run" / "checkpoints" / "best"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps({"task": "retrieval", "step": 120}))
    assert RunStep.of_checkpoint(ckpt) == RunStep("ft_run", 120)
    assert str(RunStep.of_checkpoint(tmp_path / "ft_run")) == "ft_run"  # a folder without state.json: no step
    assert RunStep.of_metrics(tmp_path / "ft_run" / "metrics.jsonl", [{"step": 10}, {"step": 30}, {}]) == RunStep(
        "ft_run", 30
    )


def _curves(tmp_path: Path, shows: RunStep) -> Path:
    """``vlp plot losses``: the run and step come from the log (``shows`` names what it holds)."""
    run = tmp_path / shows.run
    run.mkdir()
    rows = [{"step": s, "loss": 1.0 / s} for s in range(1, (shows.step or 0) + 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return plot_losses(run / "metrics.jsonl", tmp_path / "p.png")


def _run_curves(tmp_path: Path, shows: RunStep) -> Path:
    _curves(tmp_path, shows)
    return plot_run_curves({"a": tmp_path / shows.run / "metrics.jsonl"}, "loss", tmp_path / "p.png", "loss")


def _image(tmp_path: Path) -> Path:
    path = tmp_path / "i.png"
    Image.new("RGB", (16, 16), RED).save(path)
    return path


PICTURES: dict[str, Callable[[Path, RunStep], Path]] = {
    "losses": _curves,
    "run curves": _run_curves,
    "retrieval grid": lambda d, s: plot_retrieval_grid(
        [{"query": 0, "text": "a red square", "top": [{"index": 0, "path": str(_image(d)), "mark": "truth"}]}],
        d / "p.png",
        shows=s,
    ),
    "srcl heatmap": lambda d, s: plot_weight_heatmap(
        torch.ones(2, 2), [str(_image(d))] * 2, ["a", "b"], d / "p.png", "w", s
    ),
    "weight histogram": lambda d, s: plot_weight_histogram(torch.rand(50), d / "p.png", "w", shows=s),
    "cocos": lambda d, s: plot_cocos({"i2t": torch.tensor([1, 2, 2])}, d / "p.png", "COCOS", s),
    "bars": lambda d, s: plot_attribute_bars({"colour": 0.9}, d / "p.png", "probes", "accuracy", shows=s),
    "confusion": lambda d, s: plot_confusion([[2, 1], [0, 3]], ["a", "b"], d / "p.png", "top-1", s),
    "word heat maps": lambda d, s: plot_word_heatmaps(
        _image(d), ["[CLS]", "red", "[SEP]"], torch.stack([hot_on_red()] * 3), d / "p.png", title="red", shows=s
    ),
    "grounding examples": lambda d, s: plot_grounding_examples(
        [
            {
                "image": str(_image(d)),
                "text": "red",
                "heatmap": hot_on_red().tolist(),
                "hit": True,
                "chosen": [0, 0, 4, 4],
                "target": [0, 0, 4, 4],
            }
        ],
        d / "p.png",
        shows=s,
    ),
}


@pytest.mark.parametrize("name", list(PICTURES))
def test_every_picture_is_titled_with_its_run_and_step(name: str, tmp_path: Path, figures: list[Figure]) -> None:
    """The figure's title and the saved PNG's ``Title`` begin with ``run, step N``."""
    shows = RunStep("ft_retrieval", 3)
    out = PICTURES[name](tmp_path, shows)
    fig = figures[-1]  # the picture saved last (run curves draws the losses' first, for their log)
    with Image.open(out) as im:
        saved = im.text.get("Title", "")
    assert saved == fig.get_suptitle() and saved.splitlines()[0] == "ft_retrieval, step 3", (saved, name)
