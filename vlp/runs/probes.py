"""``vlp analyze probes | minimal-pairs | ltd-floor``: can a checkpoint's caption embedding still tell
the attributes of the shapes world apart, and how low can LTD's reconstruction loss go without them.

- :func:`run_probes`: a linear probe per attribute on the frozen caption embeddings of a world's
  held-out captions, against the majority-class baseline (:mod:`vlp.eval.probes`);
- :func:`run_minimal_pairs`: for fully specified held-out captions, the share of distractor images
  differing in one attribute of one object that the caption scores below its own image (chance 0.5);
- :func:`run_ltd_floor`: the lowest ``L_rec`` a decoder reaches from a caption embedding that
  suppresses an attribute (:func:`vlp.losses.ltd.reconstruction_floor`), from the targets file.

Models are loaded through :class:`vlp.api.VLPModel` (any checkpoint kind with ITC projections:
ALBEF or the dual encoder), so captions and images are prepared exactly as in evaluation.
Each command writes a JSON file and a bar plot into ``out``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

from vlp.data.synthetic.attributes import (
    ALL_ATTRIBUTES,
    attribute_value,
    parse_attributes,
    removal_groups,
    removed_key,
)
from vlp.data.synthetic.captions import parse_caption
from vlp.data.synthetic.minimal_pairs import PAIR_ATTRIBUTES, Distractor, sample_distractors
from vlp.data.synthetic.scene import render_scene, scene_from_dict, world_rng
from vlp.errors import DataError
from vlp.eval.probes import grouped_split, majority_accuracy, minimal_pair_accuracy, probe_accuracy
from vlp.losses.ltd import reconstruction_floor

PROBE_ATTRIBUTES: tuple[str, ...] = ("shape", "color", "size", "cell", "count", "relation")
FLOOR_ATTRIBUTES: tuple[str, ...] = (
    "shape",
    "color",
    "size",
    "cell",
    "count",
    "relation",
    "size+cell+relation",
    ALL_ATTRIBUTES,
)
#: fewest probe rows per half; an attribute with fewer (or one class) is reported as skipped
MIN_PROBE_ROWS = 4


def world_split(world_root: str | Path, split: str = "test") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``scenes.json`` of a shapes world (without its splits) and the records of ``split``."""
    path = Path(world_root) / "scenes.json"
    if not path.is_file():
        raise DataError(f"{path}: not found; the probes need a shapes world (`vlp make-world --out DIR`)")
    data = json.loads(path.read_text())
    if split not in data["splits"]:
        raise DataError(f"{path}: no split {split!r} (has {sorted(data['splits'])})")
    return {k: v for k, v in data.items() if k != "splits"}, data["splits"][split]


def _load(run: str | Path, device: Optional[str], batch_size: int):
    from vlp.api import VLPModel

    return VLPModel.from_pretrained(run, device=device, batch_size=batch_size)


def _source(model: Any, run: str | Path, world_root: str | Path, split: str, n_captions: int) -> dict[str, Any]:
    """The head of a probes / minimal-pairs record: what was measured on which world split."""
    return {
        "checkpoint": model.source.get("checkpoint", str(run)),
        "world": str(world_root),
        "split": split,
        "n_captions": n_captions,
    }


def _write(out: Path, name: str, record: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


# ----------------------------------------------------------------------------- probes


def attribute_probe(
    feats: torch.Tensor, labels: Sequence[Optional[str]], test_fraction: float, seed: int, weight_decay: float
) -> dict[str, Any]:
    """Probe one attribute: ``feats`` [N, E] of distinct captions, ``labels`` [N] (None: the caption
    does not determine the attribute) -> accuracy, majority baseline, row and class counts."""
    rows = [i for i, v in enumerate(labels) if v is not None]
    present = [str(labels[i]) for i in rows]
    values = sorted(set(present))
    y = torch.tensor([values.index(v) for v in present], dtype=torch.long)
    train, test = grouped_split(torch.arange(len(rows)), test_fraction, seed)  # one text per group
    out: dict[str, Any] = {"n_train": len(train), "n_test": len(test), "values": values}
    if min(len(train), len(test)) < MIN_PROBE_ROWS or len(torch.unique(y[train])) < 2:
        return {**out, "skipped": f"too few captions or classes ({len(rows)} captions, {len(values)} values)"}
    x = feats[rows]
    acc = probe_accuracy(x[train], y[train], x[test], y[test], weight_decay=weight_decay)
    return {**out, "accuracy": acc, "majority": majority_accuracy(y[train], y[test])}


def run_probes(
    run: str | Path,
    world_root: str | Path,
    out: str | Path,
    split: str = "test",
    attributes: Sequence[str] = PROBE_ATTRIBUTES,
    test_fraction: float = 0.5,
    seed: int = 0,
    weight_decay: float = 1e-2,
    batch_size: int = 256,
    device: Optional[str] = None,
) -> dict[str, Any]:
    """Linear suppression probes on the frozen caption embeddings of a checkpoint (run directory or
    checkpoint folder).

    The distinct caption texts of the world's ``split`` are embedded (the normalised ITC feature);
    for each attribute, the captions that determine its value (:func:`attribute_value`) are split
    into probe-train and probe-test halves by ``seed`` (each text in one half only) and a
    multinomial logistic regression is fitted (:func:`vlp.eval.probes.probe_accuracy`). Writes
    ``out/probes.json`` (the returned record) and ``out/probes.png`` (accuracy vs majority)."""
    from vlp.viz import plot_attribute_bars

    _, records = world_split(world_root, split)
    preds = {c["text"]: c["predicate"] for r in records for c in r["captions"]}  # distinct texts, in order
    texts = list(preds)
    model = _load(run, device, batch_size)
    feats = model.encode_text(texts).float()
    results = {
        a: attribute_probe(feats, [attribute_value(preds[t], a) for t in texts], test_fraction, seed, weight_decay)
        for a in attributes
    }
    record = {
        **_source(model, run, world_root, split, len(texts)),
        "test_fraction": test_fraction,
        "seed": seed,
        "weight_decay": weight_decay,
        "attributes": results,
    }
    out = Path(out)
    _write(out, "probes", record)
    done = {a: r for a, r in results.items() if "accuracy" in r}
    if done:
        plot_attribute_bars(
            {a: r["accuracy"] for a, r in done.items()},
            out / "probes.png",
            title="linear probes on caption embeddings",
            ylabel="probe accuracy",
            reference={a: r["majority"] for a, r in done.items()},
            reference_label="majority class",
        )
    return record


# ----------------------------------------------------------------------------- minimal pairs


def _pair_tensors(feats: torch.Tensor, owners: list[int], n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distractor features ``feats`` [M, E] of caption ``owners[m]`` -> [n, k, E] and valid [n, k]."""
    out = torch.zeros(n, k, feats.shape[1])
    valid = torch.zeros(n, k, dtype=torch.bool)
    slot = [0] * n
    for m, j in enumerate(owners):
        out[j, slot[j]], valid[j, slot[j]] = feats[m], True
        slot[j] += 1
    return out, valid


def run_minimal_pairs(
    run: str | Path,
    world_root: str | Path,
    out: str | Path,
    n_captions: int = 200,
    per_attribute: int = 2,
    split: str = "test",
    attributes: Sequence[str] = PAIR_ATTRIBUTES,
    seed: int = 0,
    batch_size: int = 256,
    device: Optional[str] = None,
) -> dict[str, Any]:
    """Minimal-pair retrieval of a checkpoint on the fully specified (``scene``) captions of the
    first ``n_captions`` images of the world's ``split``.

    For each caption, up to ``per_attribute`` distractor scenes per attribute
    (:func:`~vlp.data.synthetic.minimal_pairs.sample_distractors`, drawn by
    ``world_rng(seed, split, i, "minimal-pairs")``) are rendered with the image's own render RNG
    (the objects keep their jitter; the target is the world's image file) and scored by ITC cosine
    against the caption. Writes ``out/minimal_pairs.json`` (the returned record: accuracy per
    attribute and over all pairs, chance 0.5), ``out/minimal_pairs_detail.json`` (every pair with
    its change and both scores) and ``out/minimal_pairs.png``."""
    from vlp.viz import plot_attribute_bars

    meta, captions, targets, pairs = _draw_pairs(world_root, split, n_captions, per_attribute, attributes, seed)
    model = _load(run, device, batch_size)
    text, target = model.encode_text(captions).float(), model.encode_image(targets).float()
    images = [render_scene(d.scene, meta["image_size"], world_rng(meta["seed"], split, j, "render")) for j, d in pairs]
    dist = model.encode_image(images).float() if images else torch.zeros(0, text.shape[1])
    results = {a: _pair_accuracy(text, target, dist, pairs, a) for a in [*attributes, "all"]}
    record = {
        **_source(model, run, world_root, split, len(captions)),
        "per_attribute": per_attribute,
        "seed": seed,
        "chance": 0.5,
        "attributes": results,
    }
    out = Path(out)
    _write(out, "minimal_pairs", record)
    _write(out, "minimal_pairs_detail", {"pairs": _pair_details(pairs, captions, targets, text, target, dist)})
    done = {a: r["accuracy"] for a, r in results.items() if "accuracy" in r}
    plot_attribute_bars(
        done, out / "minimal_pairs.png", "minimal-pair retrieval", "accuracy", line=0.5, line_label="chance"
    )
    return record


def _draw_pairs(
    world_root: str | Path, split: str, n_captions: int, per_attribute: int, attributes: Sequence[str], seed: int
) -> tuple[dict[str, Any], list[str], list[str], list[tuple[int, Distractor]]]:
    """The world's metadata, the scene captions and image paths of the first ``n_captions`` images
    of ``split``, and their distractors as (caption index, distractor)."""
    meta, records = world_split(world_root, split)
    root = Path(world_root)
    captions, targets, pairs = [], [], []
    for i, r in enumerate(records[:n_captions]):
        cap = r["captions"][0]
        if cap["predicate"]["kind"] != "scene":
            raise DataError(f"{root / 'scenes.json'}: {split} image {i}: the first caption is not the scene caption")
        rng = world_rng(seed, split, i, "minimal-pairs")
        drawn = sample_distractors(cap["predicate"], scene_from_dict(r), rng, per_attribute, attributes)
        captions.append(cap["text"])
        targets.append(str(root / r["image"]))
        pairs += [(i, d) for a in attributes for d in drawn[a]]
    return meta, captions, targets, pairs


def _pair_accuracy(
    text: torch.Tensor, target: torch.Tensor, dist: torch.Tensor, pairs: list[tuple[int, Distractor]], attribute: str
) -> dict[str, Any]:
    """Minimal-pair accuracy over the pairs of ``attribute`` (``all``: every pair): ``text``,
    ``target`` [N, E] per caption, ``dist`` [M, E] per pair."""
    rows = [m for m, (_, d) in enumerate(pairs) if attribute in ("all", d.attribute)]
    if not rows:
        return {"n_pairs": 0, "skipped": "no distractor of this attribute"}
    owners = [pairs[m][0] for m in rows]
    k = max(owners.count(j) for j in set(owners))
    feats, valid = _pair_tensors(dist[rows], owners, len(text), k)
    return {"accuracy": minimal_pair_accuracy(text, target, feats, valid), "n_pairs": len(rows)}


def _pair_details(
    pairs: list[tuple[int, Distractor]],
    captions: list[str],
    targets: list[str],
    text: torch.Tensor,
    target: torch.Tensor,
    dist: torch.Tensor,
) -> list[dict[str, Any]]:
    """One entry per (caption, distractor): what changed and the two cosine scores."""
    text, target, dist = (F.normalize(x.float(), dim=-1) for x in (text, target, dist))
    s_target = (text * target).sum(-1)
    return [
        {
            "caption": captions[j],
            "image": targets[j],
            "attribute": d.attribute,
            "change": d.change,
            "score_target": float(s_target[j]),
            "score_distractor": float(text[j] @ dist[m]),
        }
        for m, (j, d) in enumerate(pairs)
    ]


# ----------------------------------------------------------------------------- reconstruction floor


def run_ltd_floor(
    targets_file: str | Path,
    data_files: Sequence[str | Path],
    out: str | Path,
    attributes: Sequence[str] = FLOOR_ATTRIBUTES,
) -> dict[str, Any]:
    """The LTD reconstruction floor per suppressed attribute, from a targets file (``vlp
    make-targets``) and the annotation files it serves (the training captions, one row per
    (image, caption) occurrence as training draws them).

    For each entry of ``attributes`` (an attribute, several joined by ``+``, or ``caption``: the
    caption-ignorant decoder) the captions are grouped by their predicate with those attributes
    hidden (:func:`~vlp.data.synthetic.attributes.removed_key`) and
    :func:`~vlp.losses.ltd.reconstruction_floor` gives ``floor``; ``floor_mentioning`` is the mean
    over the captions that mention the attribute (the others are alone in their group and add 0),
    ``share_mentioning`` their share, ``floor_distinct`` the floor over distinct caption texts (each
    once, as a caption-level evaluation would weigh them). An LTD bound ``eta`` above an
    attribute's ``floor`` lets the encoder drop it. Prints a table; writes ``out/ltd_floor.json`` and ``out/ltd_floor.png``."""
    from vlp.data.formats import load_pairs
    from vlp.data.targets import LatentTargets
    from vlp.viz import plot_attribute_bars

    specs = {a: parse_attributes(a) for a in attributes}
    tgt = LatentTargets.load(targets_file)
    samples = load_pairs(list(data_files))
    tgt.check_covers(samples)
    texts = [c for s in samples for c in s.captions]
    vectors = torch.stack([tgt.lookup(t) for t in texts])
    preds = [_parse(t) for t in texts] if any(ALL_ATTRIBUTES not in s for s in specs.values()) else []
    distinct = list({t: i for i, t in reversed(list(enumerate(texts)))}.values())  # first row of each text
    floors: dict[str, Any] = {}
    for name, spec in specs.items():
        groups = torch.tensor(removal_groups(preds, spec) if preds else [0] * len(texts))
        floor = reconstruction_floor(vectors, groups)
        mentioning = len(texts) if ALL_ATTRIBUTES in spec else sum(_mentions(p, spec) for p in preds)
        floors[name] = {
            "floor": floor,
            "floor_mentioning": floor * len(texts) / mentioning if mentioning else 0.0,
            "share_mentioning": mentioning / len(texts),
            "floor_distinct": reconstruction_floor(vectors[distinct], groups[distinct]),
            "groups": int(groups.unique().numel()),
        }
    record = {
        "targets": str(targets_file),
        "encoder": tgt.encoder,
        "data": [str(d) for d in data_files],
        "n_captions": len(texts),
        "n_distinct": len(set(texts)),
        "floors": floors,
    }
    print(f"{'hidden':<22}{'floor':>8}{'mentioning':>12}{'share':>8}{'distinct':>10}")
    for name, f in floors.items():
        print(
            f"{name:<22}{f['floor']:>8.4f}{f['floor_mentioning']:>12.4f}{f['share_mentioning']:>8.2f}"
            f"{f['floor_distinct']:>10.4f}"
        )
    out = Path(out)
    _write(out, "ltd_floor", record)
    caption_floor = floors.get(ALL_ATTRIBUTES, {}).get("floor")
    plot_attribute_bars(
        {a: f["floor"] for a, f in floors.items() if a != ALL_ATTRIBUTES},
        out / "ltd_floor.png",
        "L_rec floor with the attribute suppressed",
        "lowest reachable L_rec",
        line=caption_floor,
        line_label="caption-ignorant decoder",
    )
    return record


def _parse(text: str) -> dict[str, Any]:
    """The predicate of a shapes-world caption; a clear error for any other caption."""
    try:
        return parse_caption(text)
    except ValueError as e:
        raise DataError(
            f"caption {text!r} is not a shapes-world caption ({e}); attribute floors need the world's "
            f"captions (only '{ALL_ATTRIBUTES}' works on any data)"
        ) from None


def _mentions(pred: dict[str, Any], spec: frozenset[str]) -> bool:
    """Does hiding ``spec`` change the predicate (does the caption mention one of the attributes)?"""
    return removed_key(pred, spec) != removed_key(pred, ())


def format_probes(report: dict[str, Any]) -> str:
    """The table ``vlp analyze probes`` prints of a report of :func:`run_probes`: each attribute's
    probe accuracy beside its majority class, or why it was not probed."""
    lines = []
    for name, v in report["attributes"].items():
        if "accuracy" in v:
            lines.append(
                f"  {name:10s} probe accuracy {100 * v['accuracy']:5.1f}%  (majority class {100 * v['majority']:5.1f}%)"
            )
        else:
            lines.append(f"  {name:10s} {v.get('skipped', 'not probed')}")
    return "\n".join(lines)


def format_minimal_pairs(report: dict[str, Any]) -> str:
    """The table ``vlp analyze minimal-pairs`` prints of a report of :func:`run_minimal_pairs`: each
    attribute's minimal-pair accuracy."""
    return "\n".join(
        f"  {name:10s} minimal-pair accuracy {100 * v['accuracy']:5.1f}%  ({v['n_pairs']} pairs; chance 50%)"
        for name, v in report["attributes"].items()
        if "accuracy" in v
    )
