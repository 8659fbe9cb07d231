"""``vlp explain``: per-word Grad-CAM pictures of one image and one text (ALBEF's visualisation
notebook) with :meth:`vlp.api.VLPModel.explain`."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

from vlp.pictures import RunStep
from vlp.preprocess.images import open_image

logger = logging.getLogger(__name__)

PNG, JSON = "explain.png", "explain.json"


def run_explain(
    checkpoint: str | Path,
    image: str | Path,
    text: str,
    out: str | Path,
    layer: Optional[int] = None,
    device: Optional[str] = None,
) -> dict[str, Any]:
    """Grad-CAM of the ITM score of (``image``, ``text``) over the cross-attention of fusion layer
    ``layer`` (default: the middle one) of a checkpoint (checkpoint folder, run directory,
    ``save_pretrained`` directory or zoo tag). Writes ``out/explain.png`` (the image, the mean map
    over all tokens, then one panel per word) and ``out/explain.json`` (the returned record: tokens,
    ITM match probability, layer, patch grid and the per-token maps [T][h][w], not upsampled)."""
    from vlp.api import VLPModel
    from vlp.heat_pictures import explain_title, plot_word_heatmaps

    vm = VLPModel.from_pretrained(checkpoint, device=device)
    shows = RunStep.of_checkpoint(vm.source.get("checkpoint", checkpoint))
    rgb = open_image(str(image), "image", min_side=vm.preprocessor.min_side)
    result = vm.explain(rgb, text, layer)
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "image": str(image),
        "text": text,
        "tokens": result.tokens,
        "itm_score": result.itm_score,
        "layer": result.layer,
        "grid": list(result.maps.shape[1:]),
        "checkpoint": vm.source.get("checkpoint", str(checkpoint)),
        "maps": [[[round(float(x), 8) for x in row] for row in m] for m in result.maps.tolist()],
    }
    (outdir / JSON).write_text(json.dumps(record) + "\n")
    title = explain_title(text, result.itm_score, result.layer)
    shows = RunStep.of_checkpoint(record["checkpoint"])
    plot_word_heatmaps(rgb, result.tokens, result.maps, outdir / PNG, title=title, shows=shows)
    logger.info(f"wrote {outdir / PNG} and {outdir / JSON} (ITM match {result.itm_score:.3f}, layer {result.layer})")
    return record


def run_retrieval_gradcam(
    run_or_eval_dir: str | Path,
    out: Optional[str | Path] = None,
    checkpoint: Optional[str | Path] = None,
    layer: Optional[int] = None,
    device: Optional[str] = None,
) -> list[Path]:
    """Grad-CAM pictures for the text->image examples an evaluation saved
    (``retrieval_examples.json`` in ``run_or_eval_dir`` or its ``eval/``, :func:`vlp.viz.find_retrieval_examples`):

    - ``retrieval_examples_gradcam.png``: the example grid with each retrieved image under the
      Grad-CAM map of the row's caption (mean over its words, :func:`vlp.api.grounding_maps`);
    - ``retrieval_examples_words/query<q>.png``: per row, the per-word grid of :func:`run_explain`
      for the caption and its top-1 image.

    Written to ``out`` (default: next to the JSON). The model is ``checkpoint``, else the one the
    evaluation used (:func:`_evaluated_checkpoint`). Returns the PNGs written, the grid first."""
    import torch

    from vlp.api import VLPModel, gradcam_layer, grounding_maps
    from vlp.errors import DataError
    from vlp.heat_pictures import plot_word_heatmaps
    from vlp.viz import find_retrieval_examples, plot_retrieval_grid

    found = find_retrieval_examples(run_or_eval_dir)
    rows = json.loads(found.read_text())["rows"]
    if checkpoint is None:
        checkpoint = _evaluated_checkpoint(found)
    if not Path(checkpoint).exists():
        raise DataError(f"{found}: the checkpoint {checkpoint} it was evaluated with is not there; pass --checkpoint")
    vm = VLPModel.from_pretrained(checkpoint, device=device)
    shows = RunStep.of_checkpoint(vm.source.get("checkpoint", checkpoint))
    outdir = Path(out) if out is not None else found.parent
    words_dir = outdir / "retrieval_examples_words"
    words_dir.mkdir(parents=True, exist_ok=True)
    heatmaps: list[torch.Tensor] = []
    written = []
    for row in rows:
        paths = [item["path"] for item in row["top"]]
        heatmaps.append(grounding_maps(vm, paths, [row["text"]] * len(paths), layer, words_only=True))
        top1 = vm.explain(paths[0], row["text"], layer)
        title = f"{row['text']!r} on its top-1 image: ITM match {top1.itm_score:.3f}, fusion layer {top1.layer}"
        png = words_dir / f"query{row['query']}.png"
        written.append(plot_word_heatmaps(paths[0], top1.tokens, top1.maps, png, title=title, shows=shows))
    layer_used = gradcam_layer(vm, layer)
    note = f"\nheat: Grad-CAM of the caption's ITM score, fusion layer {layer_used}"
    grid = plot_retrieval_grid(rows, outdir / "retrieval_examples_gradcam.png", heatmaps, note, shows)
    return [grid, *written]


def _evaluated_checkpoint(examples: Path) -> Path:
    """The checkpoint behind ``examples`` (a ``retrieval_examples.json``): the ``checkpoint`` the
    evaluation's ``metrics.json`` beside it records (``vlp evaluate retrieval``, ``vlp demo``), else,
    in a run's folder (``RUN/eval``, or ``RUN/val`` / ``RUN/test`` of a fine-tuning), the ``best``
    checkpoint its ``results.json`` names, else that run. Anything else raises :class:`DataError`."""
    from vlp.errors import DataError

    metrics, run = examples.parent / "metrics.json", examples.parent.parent
    recorded = json.loads(metrics.read_text()).get("checkpoint") if metrics.is_file() else None
    if recorded is not None:
        return Path(recorded)
    if (run / "checkpoints").is_dir():
        results = run / "results.json"
        best = json.loads(results.read_text()).get("best") if results.is_file() else None
        return Path(best) if best else run
    raise DataError(
        f"{examples}: no checkpoint recorded beside it ({metrics} has no 'checkpoint') and it is not in a "
        "run's folder; pass --checkpoint"
    )
