"""``vlp evaluate retrieval``: zero-shot image-text retrieval of a checkpoint, its protocol presets,
and the device of a (possibly multi-process) evaluation."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch

from vlp.checkpoint import image_size, open_checkpoint
from vlp.config import EvalConfig, PretrainConfig, apply_overrides
from vlp.data.formats import CAPTION_GROUPS_FORMAT, RetrievalSplit, load_retrieval_split
from vlp.data.image_checks import check_image_paths
from vlp.data.json_entries import read_json
from vlp.data.relevance import Relevance, load_relevance_file
from vlp.dist import barrier, is_dist, rank, world_size
from vlp.errors import CheckpointError, DataError
from vlp.eval.retrieval import RetrievalResult, check_k_test, embed, evaluate_retrieval
from vlp.hardware import default_device
from vlp.kinds import KINDS, kinds_with
from vlp.pictures import RunStep
from vlp.preprocess.transforms import test_transform
from vlp.weights import find_checkpoint

logger = logging.getLogger(__name__)

# Zero-shot protocols (docs/evaluation.md): which checkpoint kind each takes and the eval settings.
RETRIEVAL_KINDS = kinds_with("similarity")
EVAL_PRESETS: dict[str, dict] = {
    # A raw pretrained checkpoint at its pretraining resolution (ALBEF#25), ITM re-ranking.
    "zero-shot": {
        "kinds": tuple(k for k in RETRIEVAL_KINDS if KINDS.get(k).pretraining),
        "overrides": ["eval.score=itm"],
        "about": "raw pretrained checkpoint at its pretraining resolution, ITC top-k + ITM re-rank",
    },
    # ALBEF/BLIP "zero-shot Flickr30k": the COCO-fine-tuned retrieval checkpoint evaluated on Flickr30k
    # at its fine-tuning resolution, k_test 128 (ALBEF#29, #74, #89).
    "albef-flickr": {
        "kinds": tuple(k for k in RETRIEVAL_KINDS if not KINDS.get(k).pretraining),
        "overrides": ["eval.score=itm", "eval.k_test=128"],
        "about": "ALBEF protocol: COCO-fine-tuned retrieval checkpoint on Flickr30k, k_test 128, ITM",
    },
}


def launcher_device() -> torch.device:
    """This process's device. Launched as several processes (torchrun, accelerate launch: the
    launcher sets WORLD_SIZE > 1), it joins the launcher's process group, starting it if no group
    exists yet (accelerate: NCCL on GPUs, gloo on CPU), and takes its own GPU. One process: the
    default device, no group."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState

        return PartialState(cpu=not torch.cuda.is_available()).device
    return default_device()


def preset_overrides(ckpt: Path, kind: str, preset: Optional[str], overrides: Sequence[str]) -> list[str]:
    """The overrides of ``--preset`` (if any) before the user's; a checkpoint kind the protocol (or
    retrieval at all) does not take is refused."""
    if preset is not None:
        p = EVAL_PRESETS[preset]
        if kind not in p["kinds"]:
            raise CheckpointError(
                f"{ckpt}: --preset {preset} takes a {' or '.join(p['kinds'])} checkpoint "
                f"({p['about']}); this one is a {kind} checkpoint"
            )
        return [*p["overrides"], *overrides]
    if kind not in kinds_with("similarity"):
        raise CheckpointError(f"{ckpt}: a {kind} checkpoint has no retrieval heads (ITC/ITM)")
    return list(overrides)


CaptionGroups = Mapping[str, Sequence[int]]


def load_caption_groups(source: str | Path | CaptionGroups, split: RetrievalSplit) -> dict[str, list[int]]:
    """Named groups of the captions of ``split`` (name -> caption indices in ``split.texts`` order).

    ``source`` is such a mapping, or a JSON file: a list with a label per caption (each label a
    group), or an object ``{"format": "vlp-caption-groups-v1", "labels": [...], "unions": {name:
    [label, ...]}}`` whose unions are further groups (the shapes world's ``caption_kinds_<split>.json``:
    the kinds ``scene``, ``object``, ``relation``, ``count`` and the union ``generic``). Groups come
    in the order of the labels' first caption, then the unions. Errors name the file and key."""
    if isinstance(source, Mapping):
        return _checked_groups(source, split)
    path = Path(source)
    data = read_json(path)
    unions: dict = {}
    if isinstance(data, dict):
        if data.get("format") != CAPTION_GROUPS_FORMAT:
            raise DataError(f'{path}: expected a list of labels or an object with "format": "{CAPTION_GROUPS_FORMAT}"')
        labels, unions = data.get("labels"), data.get("unions", {})
    else:
        labels = data
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise DataError(f"{path}: key 'labels': expected a list of strings, one label per caption")
    if len(labels) != len(split.texts):
        raise DataError(
            f"{path}: key 'labels' has {len(labels)} entries, expected {len(split.texts)} (captions in {split.source})"
        )
    groups: dict[str, list[int]] = {}
    for q, label in enumerate(labels):
        groups.setdefault(label, []).append(q)
    if not isinstance(unions, dict) or not all(isinstance(v, list) for v in unions.values()):
        raise DataError(f"{path}: key 'unions': expected an object of name -> list of labels")
    for name, members in unions.items():
        if name in groups:
            raise DataError(f"{path}: key 'unions': {name!r} is a label already")
        groups[name] = [q for q, label in enumerate(labels) if label in members]
    return groups


def _checked_groups(source: CaptionGroups, split: RetrievalSplit) -> dict[str, list[int]]:
    """``source`` as a dict of lists; an index that is not a caption of ``split`` raises."""
    groups = {str(name): [int(q) for q in idx] for name, idx in source.items()}
    bad = [(n, q) for n, idx in groups.items() for q in idx if not 0 <= q < len(split.texts)]
    if bad:
        raise DataError(f"caption group {bad[0][0]!r}: index {bad[0][1]} is not a caption of {split.source}")
    return groups


def run_evaluate_retrieval(
    checkpoint: str | Path,
    data: str | Path,
    relevance: Optional[str | Path],
    out: str | Path,
    image_root: Optional[str] = None,
    overrides: Sequence[str] = (),
    show_progress: bool = True,
    graded_relevance: Optional[str | Path] = None,
    preset: Optional[str] = None,
    caption_groups: Optional[str | Path | CaptionGroups] = None,
) -> RetrievalResult:
    """Zero-shot retrieval of a checkpoint on a Karpathy-style split; writes ``out/metrics.json``
    and ``out/retrieval_examples.png``. ``graded_relevance`` (a ``.npy`` [texts, images] of gains,
    needs ``relevance``) gives the text->image nDCG graded gains instead of binary ones.
    ``caption_groups`` (a file or mapping, :func:`load_caption_groups`) adds the text->image
    metrics of each group of query captions, keyed ``<metric>@<group>`` (``img_r1@scene``,
    ``img_r_precision@generic``; the relevance-aware ones need ``relevance``).

    Launched as several processes, every process must call it: encoding and ITM scoring are split
    over the ranks (:mod:`vlp.eval.retrieval`), every rank returns the same result and rank 0
    alone prints and writes files."""
    if graded_relevance and not relevance:
        raise DataError(
            f"graded relevance {graded_relevance} needs the relevance file as well (--relevance / "
            "data.relevance): R-precision, mAP and relevance-aware recall use its lists"
        )
    device = launcher_device()
    main, sharded = rank() == 0, is_dist()
    if sharded:  # after a multi-process run (vlp pretrain), rank 0 has written the newest checkpoint
        barrier()
    opened = open_checkpoint(checkpoint, load=False)  # found, verified and read once; the model after the kind check
    ckpt, kind = opened.path, opened.kind
    overrides = preset_overrides(ckpt, kind, preset, overrides)
    if preset is not None and main:
        logger.info(f"protocol {preset}: {EVAL_PRESETS[preset]['about']}")
    show_progress = show_progress and main
    model: Any = opened.load(device)  # a retrieval kind (checked above): ALBEF or dual encoder
    tokenizer = opened.tokenizer
    cfg = apply_overrides(opened.pretrain_config, overrides)
    ecfg: EvalConfig = cfg.eval
    d = _load_eval_data(data, image_root, relevance, graded_relevance, caption_groups, ecfg)
    result = _embed_and_score(model, tokenizer, cfg, d, device, show_progress, sharded)
    if not main:
        return result
    record = _metrics_record(result, cfg, device, preset, kind, ckpt, d, relevance, caption_groups)
    write_evaluation(Path(out), record, d.split, result, d.rel, RunStep.of_checkpoint(ckpt, opened.step))
    return result


class PeriodicRetrieval:
    """Zero-shot retrieval of a pretraining run's ``data.eval`` on the model being trained
    (``train.eval_every``). Calling it, ``(task, step) -> metrics``, is the ``evaluate`` of the run's
    :class:`~vlp.train.validation.Validation`: the encoding and scoring of the evaluation after
    training (:func:`_embed_and_score` on ``task.model``, with the run's ``cfg`` and ``tokenizer``),
    sharded over the ranks when launched as several processes, so every rank must call it. The split
    (and its relevance files) is read and checked once, here. The result after the run's last step
    (``train.steps``) is kept (only that one: its score matrices are [images, captions] twice):
    :meth:`write_final` writes it as ``eval/``, which the run then need not evaluate again from its
    checkpoint."""

    def __init__(self, cfg: PretrainConfig, tokenizer: Any, show_progress: bool, kind: str) -> None:
        d = cfg.data
        self.cfg, self.tokenizer, self.show, self.kind = cfg, tokenizer, show_progress, kind
        self.data = _load_eval_data(str(d.eval), d.image_root, d.relevance, d.graded_relevance, None, cfg.eval)
        self.final: Optional[tuple[RetrievalResult, torch.device]] = None

    def __call__(self, task: torch.nn.Module, step: int) -> dict[str, float]:
        """The metrics of ``task.model`` after step ``step`` (eval mode and no gradients are the caller's)."""
        model: Any = task.model
        device = next(model.parameters()).device
        show = self.show and rank() == 0  # the process group exists by now (not yet when this was built)
        result = _embed_and_score(model, self.tokenizer, self.cfg, self.data, device, show, is_dist())
        self.final = (result, device) if step == self.cfg.train.steps else None
        return result.metrics

    def write_final(self, run_dir: Path, out: Path) -> bool:
        """If this run evaluated after its last step (not so when a resume found no step left to train),
        the main process writes that evaluation as :func:`run_evaluate_retrieval` would have for the run's
        newest checkpoint (that step's): ``out/metrics.json`` and the example grid. Returns whether it did
        (False: nothing written)."""
        if self.final is None:
            return False
        result, device = self.final
        if rank() == 0:
            ckpt, relevance = find_checkpoint(run_dir), self.cfg.data.relevance
            record = _metrics_record(result, self.cfg, device, None, self.kind, ckpt, self.data, relevance, None)
            write_evaluation(out, record, self.data.split, result, self.data.rel, RunStep.of_checkpoint(ckpt))
        return True


@dataclass
class _EvalData:
    """A retrieval split and what comes with it: ``relevant`` (the relevance file's lists, or None),
    ``graded`` (float32 [texts, images] gains, or None) and ``groups`` (caption group name -> caption
    indices, or None)."""

    split: RetrievalSplit
    relevant: Optional[Relevance]
    graded: Optional[torch.Tensor]
    groups: Optional[dict[str, list[int]]]

    @property
    def rel(self) -> Optional[list[list[int]]]:
        """The relevant images of each text (the relevance file's ``images``), or None without one."""
        return self.relevant.images if self.relevant is not None else None


def _load_eval_data(
    data: str | Path,
    image_root: Optional[str],
    relevance: Optional[str | Path],
    graded_relevance: Optional[str | Path],
    caption_groups: Optional[str | Path | CaptionGroups],
    ecfg: EvalConfig,
) -> _EvalData:
    """Reads the split ``data`` and its optional relevance, graded relevance and caption groups, and
    checks the images and ``ecfg.k_test`` against it (all before any encoding). Returns them."""
    from vlp.data.formats import load_graded_relevance

    split = load_retrieval_split(data, image_root)
    check_image_paths(split.images, split.source)  # before any encoding
    relevant = load_relevance_file(relevance, split) if relevance else None
    graded = load_graded_relevance(graded_relevance, split) if graded_relevance else None
    groups = load_caption_groups(caption_groups, split) if caption_groups is not None else None
    check_k_test(ecfg, len(split.images), len(split.texts), split.source)  # before any encoding
    return _EvalData(split, relevant, graded, groups)


def _embed_and_score(
    model: Any,
    tokenizer: Any,
    cfg: PretrainConfig,
    d: _EvalData,
    device: torch.device,
    show_progress: bool,
    sharded: bool,
) -> RetrievalResult:
    """Encodes the split of ``d`` with test transforms at the checkpoint's image size (``cfg``) and
    ranks it both ways by ``cfg.eval`` (split over the ranks when ``sharded``). Returns the result."""
    ecfg: EvalConfig = cfg.eval
    emb = embed(
        model,
        d.split,
        tokenizer,
        test_transform(image_size(cfg), cfg.data.image),
        cfg.model.text.max_len,
        ecfg.batch_size,
        device,
        show_progress,
        num_workers=ecfg.resolved_workers(),
        precision=ecfg.precision,
        distributed=sharded,
        offload=ecfg.offload,
    )
    return evaluate_retrieval(
        model,
        emb,
        d.split,
        ecfg,
        d.rel,
        show_progress,
        graded_relevance=d.graded,
        distributed=sharded,
        caption_groups=d.groups,
        relevant_texts=d.relevant.texts if d.relevant is not None else None,
    )


def _metrics_record(
    result: RetrievalResult,
    cfg: PretrainConfig,
    device: torch.device,
    preset: Optional[str],
    kind: str,
    ckpt: Path,
    d: _EvalData,
    relevance: Optional[str | Path],
    caption_groups: Optional[str | Path | CaptionGroups],
) -> dict[str, Any]:
    """What ``metrics.json`` holds: the metrics, then the evaluation's settings, the checkpoint and
    the split's size; with a relevance file, whether the nDCG gains are graded and the file (and its
    benchmark); with caption groups, their file (or ``"given"``: a mapping). Returns the dict."""
    ecfg: EvalConfig = cfg.eval
    record = {
        **result.metrics,
        "score": ecfg.score,
        "k_test": ecfg.k_test,
        "precision": ecfg.resolved_precision(device),
        "offload": ecfg.resolved_offload(device),
        "processes": world_size(),
        "preset": preset,
        "checkpoint_kind": kind,
        "image_size": image_size(cfg),
        "n_images": len(d.split.images),
        "n_texts": len(d.split.texts),
        "checkpoint": str(ckpt),
    }
    if d.relevant is not None:
        record["ndcg_gains"] = "graded" if d.graded is not None else "binary"
        record["relevance"] = str(relevance)
        if d.relevant.benchmark is not None:
            record["relevance_benchmark"] = d.relevant.benchmark
    if d.groups is not None:
        record["caption_groups"] = str(caption_groups) if isinstance(caption_groups, (str, Path)) else "given"
    return record


def write_evaluation(
    out: Path, record: dict, split: RetrievalSplit, result: RetrievalResult, rel, shows: RunStep
) -> None:
    """``out/metrics.json`` (``record``) and the text->image example grid ``out/retrieval_examples.png``,
    titled with ``shows`` (the evaluated checkpoint's run and step)."""
    from vlp.viz import plot_retrieval_examples

    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(record, indent=2))
    plot_retrieval_examples(split, result.scores_t2i, out / "retrieval_examples.png", rel, shows=shows)
