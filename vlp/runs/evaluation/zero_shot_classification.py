"""``vlp evaluate classification``: zero-shot image classification with a checkpoint's ITC
embeddings (prompt ensembles, as open_clip / CLIP_benchmark) and an optional ITM re-rank of each
image's top-k classes by the fusion encoder.

1. the labelled images, class names and templates (:func:`vlp.data.classification.read_classification_inputs`);
2. every (class, template) prompt is embedded, and each class's embedding is the normalised mean of
   its prompts' normalised embeddings (:func:`vlp.eval.classification.prompt_ensemble`);
3. each image's ITC feature scores every class by cosine (``image feature @ class embeddings^T``);
4. ``rerank_k`` > 0: the fusion encoder scores each image with the prompts of its ``rerank_k`` best
   classes; the ITM score of (image, class) is the mean over the templates of the ITM match
   probability, and those classes are re-ordered by it above all others
   (:func:`vlp.eval.classification.itm_rerank`).

The model is loaded through :class:`vlp.api.VLPModel` (checkpoint folder, run directory or
``save_pretrained`` directory), so images and prompts are prepared exactly as in evaluation. Each
image is encoded once: its ITC feature and, for the re-rank, its cross-attention K/V (projected
once per batch and shared by all of its prompts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch

from vlp.config.model import ARCH_DUAL
from vlp.data.classification import ClassificationInputs, read_classification_inputs
from vlp.data.image_checks import check_image_paths
from vlp.errors import CheckpointError, ConfigError, DataError
from vlp.eval.classification import TOP_K, classification_metrics, itm_rerank, prompt_ensemble
from vlp.eval.mode import evaluating
from vlp.kinds import kinds_with
from vlp.pictures import RunStep
from vlp.progress import progress


def _load(checkpoint: str | Path, device: Optional[str], batch_size: int, rerank_k: int):
    """The :class:`vlp.api.VLPModel` of ``checkpoint``; a kind without ITC projections, or a dual
    encoder asked to re-rank, is a :class:`CheckpointError`."""
    from vlp.api import VLPModel

    vm = VLPModel.from_pretrained(checkpoint, device=device, batch_size=batch_size)
    retrieval_kinds = kinds_with("similarity")
    if vm.kind not in retrieval_kinds:
        raise CheckpointError(
            f"{checkpoint}: a {vm.kind} checkpoint has no ITC projections; zero-shot classification takes a "
            f"{' or '.join(retrieval_kinds)} checkpoint"
        )
    if rerank_k > 0 and vm.model_config.arch == ARCH_DUAL:
        raise CheckpointError(
            f"{checkpoint}: rerank_k {rerank_k} needs a fusion encoder (the ITM head), and this checkpoint is a "
            "dual encoder (model.arch=dual); use rerank_k 0"
        )
    return vm


def _check_rerank_k(rerank_k: int, inputs: ClassificationInputs) -> None:
    if rerank_k < 0:
        raise ConfigError(f"rerank_k: {rerank_k}; expected 0 (no re-rank) or the number of classes to re-rank")
    if rerank_k > len(inputs.classes):
        raise DataError(
            f"rerank_k {rerank_k} exceeds the {len(inputs.classes)} classes of {inputs.source}; "
            f"set rerank_k <= {len(inputs.classes)}"
        )


def _itm_scores(
    model,
    tokens: torch.Tensor,
    hidden: torch.Tensor,
    mask: torch.Tensor,
    top: torch.Tensor,
    n_templates: int,
    batch_size: int,
) -> torch.Tensor:
    """ITM scores [B, k] of the images of one batch (``tokens`` [B, 1+N, W]) with their top
    classes ``top`` [B, k]: the mean over the templates of the match probability, the prompt rows
    of class c being ``c*T .. c*T+T-1`` of ``hidden`` [C*T, L, H] / ``mask`` [C*T, L]. The image
    K/V are projected once; fusion passes take ``batch_size`` (image, prompt) pairs at a time."""
    b, k = top.shape
    rows = (top[:, :, None] * n_templates + torch.arange(n_templates, device=top.device)).reshape(-1)
    image = torch.arange(b, device=top.device).repeat_interleave(k * n_templates)
    kv = model.image_kv(tokens)
    probs = []
    for s in range(0, len(rows), batch_size):
        r, i = rows[s : s + batch_size], image[s : s + batch_size]
        fused = model.fuse(hidden[r], mask[r], kv, image_index=i)
        probs.append(model.itm_logits(fused).float().softmax(-1)[:, 1])
    return torch.cat(probs).view(b, k, n_templates).mean(-1)


def _prompt_states(vm, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The unimodal text states [P, L, H] and attention masks [P, L] of ``prompts`` (padded to the
    longest), computed once for every re-rank pair; on ``vm``'s device, in batches of its batch size."""
    from vlp.api import tokenize

    tok, bs = tokenize(vm, prompts), vm.batch_size
    ids, mask = tok["input_ids"].to(vm.device), tok["attention_mask"].to(vm.device)
    return torch.cat([vm.model.text_states(ids[s : s + bs], mask[s : s + bs]) for s in range(0, len(ids), bs)]), mask


@torch.no_grad()
def classification_scores(
    vm, inputs: ClassificationInputs, rerank_k: int = 0, show_progress: bool = True
) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Score every image of ``inputs`` against every class with the loaded :class:`vlp.api.VLPModel`
    ``vm``: ITC cosines [N, C] (fp32) and, for ``rerank_k`` > 0, each image's top-``rerank_k``
    classes by ITC [N, k] and their ITM scores [N, k] (else None, None). CPU tensors."""
    from vlp.api import pixel_values

    prompts, n_templates = inputs.prompts(), len(inputs.templates)
    classes = prompt_ensemble(vm.encode_text(prompts), len(inputs.classes), n_templates).to(vm.device)
    model, bs = vm.model, vm.batch_size
    itc, tops, itms = [], [], []
    with evaluating(model):
        states = _prompt_states(vm, prompts) if rerank_k else None  # (hidden, mask) of every prompt
        bar = progress(len(inputs.images), "classify", show_progress)
        for s in range(0, len(inputs.images), bs):
            enc = model.encode_image(pixel_values(vm, inputs.images[s : s + bs]).to(vm.device))
            scores = enc.feat.float() @ classes.T
            itc.append(scores.cpu())
            if states is not None:
                top = scores.topk(rerank_k, dim=1).indices
                tops.append(top.cpu())
                itms.append(_itm_scores(model, enc.tokens, *states, top, n_templates, bs).cpu())
            bar.update(len(scores))
        bar.close()
    if not rerank_k:
        return torch.cat(itc), None, None
    return torch.cat(itc), torch.cat(tops), torch.cat(itms)


def chance_levels(labels: torch.Tensor, n_classes: int) -> dict[str, Any]:
    """What guessing gets, in percent: ``top1`` = 100/C and ``top5`` = 100·min(5, C)/C (a uniform
    guess), ``majority`` the share of the most frequent class (always answering it) and its class index."""
    counts = torch.bincount(labels, minlength=n_classes)
    return {
        "top1": 100.0 / n_classes,
        "top5": 100.0 * min(TOP_K, n_classes) / n_classes,
        "majority": 100.0 * counts.max().item() / len(labels),
        "majority_class": int(counts.argmax()),
    }


def _predictions(
    inputs: ClassificationInputs,
    itc: torch.Tensor,
    final: Optional[torch.Tensor],
    top: Optional[torch.Tensor],
    itm: Optional[torch.Tensor],
) -> list[dict[str, Any]]:
    """Per image: its path, true class and top-5 classes with their ITC score (``top5``), and with
    a re-rank the top 5 after it (``rerank_top5``; the ITM score for the re-ranked classes)."""
    k = min(TOP_K, itc.shape[1])
    out = []
    for n, path in enumerate(inputs.images):
        entry: dict[str, Any] = {
            "image": path,
            "label": inputs.classes[inputs.labels[n]],
            "top5": [{"class": inputs.classes[c], "itc": float(itc[n, c])} for c in itc[n].topk(k).indices.tolist()],
        }
        if final is not None and top is not None and itm is not None:
            scored = dict(zip(top[n].tolist(), itm[n].tolist()))
            entry["rerank_top5"] = [
                {"class": inputs.classes[c], "itc": float(itc[n, c]), **({"itm": scored[c]} if c in scored else {})}
                for c in final[n].topk(k).indices.tolist()
            ]
        out.append(entry)
    return out


def run_evaluate_classification(
    checkpoint: str | Path,
    data: str | Path,
    out: str | Path,
    classes: Optional[str | Path] = None,
    templates: Optional[str | Path] = None,
    image_root: Optional[str | Path] = None,
    rerank_k: int = 0,
    batch_size: int = 64,
    device: Optional[str] = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Zero-shot classification of the images of ``data`` (an ImageFolder-style directory or a JSON
    list ``[{"image", "label"}]``) over the classes of ``classes`` with the prompt templates of
    ``templates`` (:func:`vlp.data.classification.read_classification_inputs`), by a checkpoint's
    ITC embeddings, and with ``rerank_k`` > 0 also after the ITM re-rank of each image's top
    ``rerank_k`` classes (needs a fusion encoder).

    Writes ``out/metrics.json`` (the returned record: ``itc`` and, with a re-rank, ``rerank``
    metrics from :func:`vlp.eval.classification.classification_metrics`, the chance levels and
    the setup), ``out/predictions.json`` (per image its top-5 classes and scores),
    ``out/confusion.png`` (ITC) and, with a re-rank, ``out/confusion_rerank.png``."""
    from vlp.viz import plot_confusion

    inputs = read_classification_inputs(data, classes, templates, image_root)
    check_image_paths(inputs.images, str(data))
    _check_rerank_k(rerank_k, inputs)
    vm = _load(checkpoint, device, batch_size, rerank_k)
    itc, top, itm = classification_scores(vm, inputs, rerank_k, show_progress)
    labels = torch.tensor(inputs.labels, dtype=torch.long)
    record: dict[str, Any] = {
        "itc": classification_metrics(itc, labels),
        "chance": chance_levels(labels, len(inputs.classes)),
        "rerank_k": rerank_k,
        "n_images": len(inputs.images),
        "n_classes": len(inputs.classes),
        "n_templates": len(inputs.templates),
        "classes": inputs.classes,
        "templates": inputs.templates,
        "data": inputs.source,
        "checkpoint": vm.source.get("checkpoint", str(checkpoint)),
        "checkpoint_kind": vm.kind,
    }
    final = itm_rerank(itc, itm, top) if top is not None and itm is not None else None
    if final is not None:
        record["rerank"] = classification_metrics(final, labels)
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "metrics.json").write_text(json.dumps(record, indent=2) + "\n")
    rows = [json.dumps(p) for p in _predictions(inputs, itc, final, top, itm)]
    (outdir / "predictions.json").write_text("[\n" + ",\n".join(rows) + "\n]\n")  # one image per line
    for key, name in (("itc", "confusion.png"), ("rerank", "confusion_rerank.png")):
        if key in record:
            m = record[key]
            title = (
                f"{Path(inputs.source).name} ({key}): top-1 {m['top1']:.1f}%, mean per class {m['mean_per_class']:.1f}%"
            )
            plot_confusion(
                m["confusion"], inputs.classes, outdir / name, title, RunStep.of_checkpoint(record["checkpoint"])
            )
    return record
