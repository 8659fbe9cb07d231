"""What a shapes-world caption says about each attribute, and the caption with an attribute hidden.

The attributes a caption can mention (:data:`ATTRIBUTES`):

``shape``, ``color``, ``size``  a word of a noun phrase;
``cell``                        a cell phrase ("at the top left": row and column together);
``count``                       the number word of a ``count`` caption;
``relation``                    the relation words of a ``relation`` caption.

:func:`attribute_value` is the value a caption determines (the label of a suppression probe);
:func:`removed_key` is the caption with some attributes hidden: two captions with the same key
differ only in the hidden attributes, so a caption encoder that suppresses them cannot tell the
two apart (the groups of the LTD reconstruction floor, :func:`vlp.losses.ltd.reconstruction_floor`).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from vlp.world.predicates import CountPred, ObjectPred, Predicate, RelationPred, ScenePred, predicate_from_dict
from vlp.world.scene import Desc

__all__ = [
    "ATTRIBUTES",
    "ALL_ATTRIBUTES",
    "HIDDEN",
    "parse_attributes",
    "attribute_value",
    "removed_key",
    "group_ids",
    "removal_groups",
]

ATTRIBUTES: tuple[str, ...] = ("shape", "color", "size", "cell", "count", "relation")
#: the pseudo-attribute hiding the whole caption: every caption in one group (a caption-ignorant decoder)
ALL_ATTRIBUTES = "caption"
#: what a hidden value is replaced by in :func:`removed_key`
HIDDEN = "*"


def parse_attributes(spec: str) -> frozenset[str]:
    """``"size+cell"`` -> ``{"size", "cell"}``; ``"caption"`` -> every attribute and the caption itself
    (see :func:`removed_key`). Raises ``ValueError`` for an unknown name."""
    names = frozenset(s.strip() for s in spec.split("+"))
    unknown = sorted(names - set(ATTRIBUTES) - {ALL_ATTRIBUTES})
    if unknown or not spec.strip():
        raise ValueError(f"unknown attribute(s) {unknown or [spec]}; expected names of {[*ATTRIBUTES, ALL_ATTRIBUTES]}")
    return names


def _descs(p: Predicate) -> list[Desc]:
    """The object descriptions a predicate mentions (scene objects as full descriptions)."""
    if isinstance(p, ScenePred):
        return [Desc(o.shape, o.color, o.size, o.row, o.col) for o in p.objects]
    if isinstance(p, RelationPred):
        return [p.a, p.b]
    if isinstance(p, (ObjectPred, CountPred)):
        return [p.object]
    raise TypeError(f"not a predicate: {p!r}")


def attribute_value(pred: dict[str, Any] | Predicate, attribute: str) -> str | None:
    """The value of ``attribute`` the caption determines, or None if it mentions none or several.

    ``shape``/``color``/``size``: the one value its descriptions mention ("a red circle left of a
    red square" determines colour red; "a red circle left of a blue square" no colour); ``cell``:
    ``"row,col"`` of the one cell it names; ``count``: the number of a ``count`` caption (``"1"`` ..
    ``"4"``); ``relation``: the relation of a ``relation`` caption (``"left_of"``, ...).
    """
    p = predicate_from_dict(pred)
    if attribute == "count":
        return str(p.n) if isinstance(p, CountPred) else None
    if attribute == "relation":
        return p.relation if isinstance(p, RelationPred) else None
    if attribute == "cell":
        values = {f"{d.row},{d.col}" for d in _descs(p) if d.row is not None}
    elif attribute in ("shape", "color", "size"):
        values = {v for d in _descs(p) if (v := getattr(d, attribute)) is not None}
    else:
        raise ValueError(f"unknown attribute {attribute!r}; expected one of {list(ATTRIBUTES)}")
    return next(iter(values)) if len(values) == 1 else None


def _hide_desc(d: dict[str, Any], attrs: frozenset[str]) -> dict[str, Any]:
    fields = [f for f in ("shape", "color", "size") if f in attrs] + (["row", "col"] if "cell" in attrs else [])
    return {k: (HIDDEN if k in fields and v is not None else v) for k, v in d.items()}


def removed_key(pred: dict[str, Any] | Predicate, attrs: Iterable[str]) -> str:
    """The caption's predicate with the attributes ``attrs`` hidden, as canonical JSON.

    A mentioned value is replaced by :data:`HIDDEN` (whether the caption mentions the attribute at
    all stays visible: "a circle" and "a red circle" keep different keys when colour is hidden);
    scene objects become a sorted multiset (their order in the text is by cell, itself position
    information). ``count`` hides the number of a count caption, ``relation`` the relation words.
    :data:`ALL_ATTRIBUTES` (``"caption"``) among ``attrs`` gives every caption the same key.
    """
    hidden = frozenset(attrs)
    if ALL_ATTRIBUTES in hidden:
        return HIDDEN
    d = predicate_from_dict(pred).to_dict()
    if d["kind"] == "scene":
        d["objects"] = sorted(
            (_hide_desc(o, hidden) for o in d["objects"]), key=lambda o: json.dumps(o, sort_keys=True)
        )
    for k in ("object", "a", "b"):
        if k in d:
            d[k] = _hide_desc(d[k], hidden)
    if "count" in hidden and "n" in d:
        d["n"] = HIDDEN
    if "relation" in hidden and "relation" in d:
        d["relation"] = HIDDEN
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def group_ids(keys: Sequence[Any]) -> list[int]:
    """Contiguous group ids 0.. in order of first appearance: equal keys, equal ids."""
    ids: dict[Any, int] = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


def removal_groups(preds: Sequence[dict[str, Any] | Predicate], attrs: Iterable[str]) -> list[int]:
    """Group id of each predicate: equal iff the predicates are equal once ``attrs`` are hidden."""
    hidden = frozenset(attrs)
    return group_ids([removed_key(p, hidden) for p in preds])
