"""``vlp prepare eccv-caption`` on the eccv-caption package's real id files, and vlp's relevance metrics
checked against the package's own code (docs/evaluation.md, "ECCV Caption and CxC").

COCO's captions are not needed: a Karpathy test file and a ``captions_val2014.json`` are generated
from the package's ``original_image_to_caption.json`` (5,000 images, 25,000 caption ids, caption
text ``caption <id>``); the benchmark's caption ids outside it become extra captions of the first
images. Seeded random scores (plus a bonus for each image's own captions) are ranked, and vlp's
``relevance_metrics`` is compared with ``eccv_caption.Metrics`` on the same rankings when the package
imports (``--reference DIR``: a folder holding it, e.g. from ``pip install --no-deps --target DIR
eccv-caption``).

    python scripts/eccv_check.py --eccv eccv_caption-0.1.0-py3-none-any.whl --out /tmp/eccv_check \\
        [--benchmark cxc] [--reference DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from vlp.data.formats import RetrievalSplit, load_retrieval_split
from vlp.data.relevance import Relevance, load_relevance_file
from vlp.eval.metrics import relevance_metrics
from vlp.prepare.eccv import ECCV_BENCHMARKS, eccv_caption, eccv_id_maps, read_id_file

#: vlp's key (after ``txt_`` / ``img_``) -> eccv_caption's metric, for each benchmark
COMPARED = {
    "eccv-caption": {"map_at_r": "eccv_map_at_r", "r_precision": "eccv_rprecision", "r1_rel": "eccv_r1"},
    "cxc": {"r1_rel": "cxc_r1", "r5_rel": "cxc_r5", "r10_rel": "cxc_r10"},
}
TOP = 200  # ranks handed to the package: more than any query's R (ECCV: at most 48)


def synthetic_coco(eccv: str | Path, benchmark: str, out: Path) -> tuple[Path, Path]:
    """A Karpathy test file and a COCO captions file holding every id of ``benchmark``'s files."""
    folder = Path(eccv)
    _, original = read_id_file(folder, "original_image_to_caption.json")
    captions = {int(i): list(c) for i, c in original.items()}
    known = {c for cs in captions.values() for c in cs}
    (_, i2t), (_, t2i) = eccv_id_maps(folder, benchmark)
    extra = ({c for cs in i2t.values() for c in cs} | set(t2i)) - known
    for k, c in enumerate(sorted(extra)):
        captions[list(captions)[k]].append(c)
    out.mkdir(parents=True, exist_ok=True)
    karpathy = [
        {"image": f"val2014/COCO_val2014_{i:012d}.jpg", "caption": [f"caption {c}" for c in cs]}
        for i, cs in captions.items()
    ]
    coco = {
        "images": [{"id": i, "file_name": f"COCO_val2014_{i:012d}.jpg"} for i in captions],
        "annotations": [
            {"id": c, "image_id": i, "caption": f"caption  {c}\n"} for i, cs in captions.items() for c in cs
        ],
    }
    (out / "coco_test.json").write_text(json.dumps(karpathy))
    (out / "captions_val2014.json").write_text(json.dumps(coco))
    return out / "coco_test.json", out / "captions_val2014.json"


def scores(split: RetrievalSplit, seed: int = 0) -> torch.Tensor:
    """[N_img, N_txt] random scores, each image's own captions lifted by 0.5 to 0.7."""
    g = torch.Generator().manual_seed(seed)
    s = torch.rand(len(split.images), len(split.texts), generator=g)
    for i, own in enumerate(split.img2txt):
        s[i, own] += 0.5 + 0.2 * torch.rand(len(own), generator=g)
    return s


def reference(s_i2t: torch.Tensor, split: RetrievalSplit, rel: Relevance, benchmark: str) -> dict[str, float]:
    """eccv_caption's metrics (percent) on the rankings of ``s_i2t``, keyed as vlp's."""
    from eccv_caption import Metrics

    image_ids = [int(Path(p).stem.rsplit("_", 1)[1]) for p in split.images]
    caption_ids = [int(t.split()[1]) for t in split.texts]
    s_t2i = s_i2t.T
    assert rel.texts is not None
    ranked = {
        "i2t": {
            image_ids[i]: [caption_ids[j] for j in s_i2t[i].topk(TOP).indices.tolist()]
            for i, r in enumerate(rel.texts)
            if r
        },
        "t2i": {
            caption_ids[t]: [image_ids[j] for j in s_t2i[t].topk(TOP).indices.tolist()]
            for t, r in enumerate(rel.images)
            if r
        },
    }
    metrics = Metrics()
    if benchmark == "cxc":
        got = {f"cxc_r{k}": metrics.cxc_recalls(ranked, "all", K=k) for k in (1, 5, 10)}
    else:
        got = metrics.eccv_metrics(ranked, "all")
    out = {}
    for ours, theirs in COMPARED[benchmark].items():
        out[f"txt_{ours}"], out[f"img_{ours}"] = 100 * got[theirs]["i2t"], 100 * got[theirs]["t2i"]
    return out


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--eccv", required=True, help="the eccv-caption wheel, or its data folder")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--benchmark", default="eccv-caption", choices=list(ECCV_BENCHMARKS))
    p.add_argument("--reference", help="a folder from which eccv_caption imports (else: compare nothing)")
    a = p.parse_args(argv)
    karpathy, coco = synthetic_coco(a.eccv, a.benchmark, a.out)
    counts = eccv_caption(karpathy, coco, a.eccv, a.out / "relevance.json", a.benchmark)
    print(", ".join(f"{k}={v}" for k, v in counts.items()))
    split = load_retrieval_split(karpathy)
    rel = load_relevance_file(a.out / "relevance.json", split)
    s = scores(split)
    ours = relevance_metrics(s, s.T.contiguous(), rel.images, relevant_texts=rel.texts)
    theirs: dict[str, float] = {}
    if a.reference:
        sys.path.insert(0, a.reference)
        theirs = reference(s, split, rel, a.benchmark)
    print(f"{'metric':20s} {'vlp':>9s} {'eccv_caption':>13s}")
    for key in (f"{d}_{m}" for m in COMPARED[a.benchmark] for d in ("txt", "img")):
        print(f"{key:20s} {ours[key]:9.4f} {theirs[key] if theirs else float('nan'):13.4f}")
    result = {"counts": counts, "vlp": {k: ours[k] for k in theirs or ours}, "eccv_caption": theirs}
    (a.out / "check.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
