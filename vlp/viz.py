"""Plots people would rather look at than numbers: loss and lambda curves, retrieval examples, SRCL
weights, COCOS counts."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from vlp.data.formats import RetrievalSplit  # noqa: E402
from vlp.train.logging import read_metrics  # noqa: E402


LOSS_KEYS = ("loss", "itc", "itm", "mlm", "contrastive", "ltd_rec", "ltd_lambda")


def plot_losses(metrics_jsonl: str | Path, out: str | Path, keys: Sequence[str] = LOSS_KEYS) -> Path:
    """Training curves from ``metrics.jsonl`` (one panel per loss term)."""
    rows = read_metrics(metrics_jsonl)
    keys = [k for k in keys if any(k in r for r in rows)]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
    for ax, k in zip(axes[0], keys):
        pts = [(r["step"], r[k]) for r in rows if r.get(k) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts])
        ax.set_title(k)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return Path(out)


def plot_retrieval_examples(
    split: RetrievalSplit,
    scores_t2i: torch.Tensor,
    out: str | Path,
    relevant_images: Optional[list[list[int]]] = None,
    n_queries: int = 6,
    k: int = 5,
) -> Path:
    """Text->image examples: each row a caption and its top-k images. Green frame: the caption's
    own image; orange: another image the caption is true of (relevance file)."""
    step = max(1, len(split.texts) // n_queries)
    queries = list(range(0, len(split.texts), step))[:n_queries]
    fig, axes = plt.subplots(len(queries), k + 1, figsize=(1.8 * (k + 1), 1.9 * len(queries)), squeeze=False)
    for row, q in zip(axes, queries):
        row[0].axis("off")
        row[0].text(0, 0.5, "\n".join(textwrap.wrap(split.texts[q], 24)), fontsize=7, va="center")
        top = scores_t2i[q].topk(min(k, scores_t2i.shape[1])).indices.tolist()
        for r, (ax, j) in enumerate(zip(row[1:], top)):
            with Image.open(split.images[j]) as im:
                ax.imshow(im.convert("RGB"))
            ax.set_xticks([])
            ax.set_yticks([])
            color = None
            if j == split.txt2img[q]:
                color = "limegreen"
            elif relevant_images is not None and j in relevant_images[q]:
                color = "orange"
            for s in ax.spines.values():
                s.set_edgecolor(color or "lightgray")
                s.set_linewidth(4 if color else 1)
            ax.set_title(f"#{r + 1}", fontsize=7)
    fig.suptitle("text -> image: green = ground truth, orange = also true of the caption", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return Path(out)


def plot_weight_heatmap(w: torch.Tensor, image_paths: Sequence[str], captions: Sequence[str], out: str | Path,
                        title: str = "") -> Path:
    """One batch's SRCL weight matrix (rows: image anchors, i2t; columns: captions). The
    diagonal (positives, weight 1 by definition) is hatched; each row's negatives average 1."""
    n = w.shape[0]
    fig = plt.figure(figsize=(1.2 + 0.62 * n, 2.2 + 0.55 * n))
    ax = fig.add_axes((0.14, 0.05, 0.72, 0.62))
    vmax = max(2.0, float(w.max()))
    im = ax.imshow(w.numpy(), cmap="viridis", vmin=0.0, vmax=vmax)
    for i in range(n):
        ax.add_patch(plt.Rectangle((i - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="white", lw=0))
        for j in range(n):
            if i != j:
                ax.text(j, i, f"{float(w[i, j]):.2f}", ha="center", va="center", fontsize=6,
                        color="white" if float(w[i, j]) < 0.6 * vmax else "black")
    ax.set_xticks(range(n))
    ax.set_xticklabels(["\n".join(textwrap.wrap(c, 24)[:6]) for c in captions], rotation=90, fontsize=6)
    ax.xaxis.tick_top()
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"image {i}" for i in range(n)], fontsize=6)
    for i, path in enumerate(image_paths):  # thumbnails left of the rows
        with Image.open(path) as img:
            thumb = img.convert("RGB")
        h = 0.62 / n
        tax = fig.add_axes((0.02, 0.05 + 0.62 - (i + 1) * h, h * 0.9 * fig.get_figheight() / fig.get_figwidth(), h * 0.9))
        tax.imshow(thumb)
        tax.axis("off")
    cax = fig.add_axes((0.88, 0.05, 0.02, 0.62))
    fig.colorbar(im, cax=cax, label="weight")
    fig.suptitle(title, fontsize=8, y=0.995)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)


def plot_weight_histogram(values: torch.Tensor, out: str | Path, title: str = "",
                          marked: dict[str, torch.Tensor] | None = None) -> Path:
    """Histogram of negative weights over many batches, with the paper's 0.2 and 0.7 levels.
    ``marked``: optional named subsets (e.g. known false negatives) drawn on top."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    hi = min(5.0, max(2.5, float(values.quantile(0.99))))  # heavier tails land in the last bin
    bins = torch.linspace(0, hi, 61).numpy()
    ax.hist(values.clamp(max=hi).numpy(), bins=bins, density=True, alpha=0.6, label=f"all negatives ({len(values)})")
    for name, v in (marked or {}).items():
        if len(v):
            ax.hist(v.clamp(max=hi).numpy(), bins=bins, density=True, histtype="step", lw=1.5, label=f"{name} ({len(v)})")
    for row, level in enumerate((0.2, 0.7)):
        frac = float((values < level).float().mean())
        ax.axvline(level, color="gray", ls="--", lw=1)
        ax.text(level, ax.get_ylim()[1] * (0.92 - 0.08 * row), f" below {level}: {100 * frac:.1f}%", fontsize=7)
    ax.set_xlabel(f"SRCL weight (values above {hi:.1f} in the last bin)")
    ax.set_ylabel("density")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)


def plot_run_curves(runs: dict[str, str | Path], key: str, out: str | Path, title: str,
                    hlines: Optional[dict[str, float]] = None) -> Path:
    """One metric (e.g. ``ltd_lambda``) of several runs' ``metrics.jsonl`` on shared axes; ``hlines``
    draws labelled reference levels (e.g. each run's eta)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, path in runs.items():
        rows = [r for r in read_metrics(path) if r.get(key) is not None]
        line, = ax.plot([r["step"] for r in rows], [r[key] for r in rows], label=label)
        if hlines and label in hlines:
            ax.axhline(hlines[label], color=line.get_color(), ls=":", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return Path(out)


def plot_cocos(counts: dict[str, torch.Tensor], out: str | Path, title: str) -> Path:
    """Histograms of COCOS per-query contributing-candidate counts, one panel per direction."""
    fig, axes = plt.subplots(1, len(counts), figsize=(5 * len(counts), 3.4), squeeze=False)
    for ax, (direction, c) in zip(axes[0], counts.items()):
        c = c.float()
        ax.hist(c.numpy(), bins=min(40, max(5, int(c.max().item()) + 1)), color="tab:blue", alpha=0.8)
        ax.set_title(f"{direction}: mean {c.mean():.2f}, zero-gradient queries {(c == 0).float().mean():.1%}", fontsize=9)
        ax.set_xlabel("contributing candidates per query")
        ax.set_ylabel("queries")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return Path(out)
