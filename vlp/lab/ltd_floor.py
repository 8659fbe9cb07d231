"""``vlp analyze ltd-floor``: how low can LTD's reconstruction loss go from a caption embedding that
suppresses an attribute? The lowest ``L_rec`` a decoder reaches when it only knows the caption's
group once the attribute is hidden (:func:`vlp.losses.ltd.reconstruction_floor`; the groups:
:func:`vlp.lab.attributes.removal_groups`), from a targets file and the annotation files it serves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from vlp.data.formats import load_pairs
from vlp.errors import DataError
from vlp.features.targets import LatentTargets
from vlp.lab.attributes import ALL_ATTRIBUTES, parse_attributes, removal_groups, removed_key
from vlp.lab.probes import write_record
from vlp.losses.ltd import reconstruction_floor
from vlp.pictures import RunStep
from vlp.world.captions import parse_caption

__all__ = ["FLOOR_ATTRIBUTES", "run_ltd_floor"]

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
    hidden (:func:`~vlp.lab.attributes.removed_key`) and
    :func:`~vlp.losses.ltd.reconstruction_floor` gives ``floor``; ``floor_mentioning`` is the mean
    over the captions that mention the attribute (the others are alone in their group and add 0),
    ``share_mentioning`` their share, ``floor_distinct`` the floor over distinct caption texts (each
    once, as a caption-level evaluation would weigh them). An LTD bound ``eta`` above an
    attribute's ``floor`` lets the encoder drop it. Prints a table; writes ``out/ltd_floor.json`` and ``out/ltd_floor.png``."""
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
    write_record(out, "ltd_floor", record)
    caption_floor = floors.get(ALL_ATTRIBUTES, {}).get("floor")
    plot_attribute_bars(
        {a: f["floor"] for a, f in floors.items() if a != ALL_ATTRIBUTES},
        out / "ltd_floor.png",
        "L_rec floor with the attribute suppressed",
        "lowest reachable L_rec",
        line=caption_floor,
        line_label="caption-ignorant decoder",
        shows=RunStep(Path(targets_file).name),  # a targets file: no run, no step
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
