"""``vlp explain``: per-word Grad-CAM pictures of one image and one text (ALBEF's visualisation
notebook) with :meth:`vlp.api.VLPModel.explain`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from vlp.data.images import open_image

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
    from vlp.viz import plot_word_heatmaps

    vm = VLPModel.from_pretrained(checkpoint, device=device)
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
    title = f"{text!r}: ITM match {result.itm_score:.3f}, fusion layer {result.layer}"
    plot_word_heatmaps(rgb, result.tokens, result.maps, outdir / PNG, title=title)
    print(f"wrote {outdir / PNG} and {outdir / JSON} (ITM match {result.itm_score:.3f}, layer {result.layer})")
    return record
