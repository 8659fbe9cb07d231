"""Plots people would rather look at than numbers: loss curves and retrieval examples."""

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


def plot_losses(metrics_jsonl: str | Path, out: str | Path, keys: Sequence[str] = ("loss", "itc", "itm", "mlm")) -> Path:
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
