"""Official ALBEF checkpoints <-> vlp checkpoints (``vlp convert albef`` / ``vlp convert to-albef``).

The key layouts are in ``albef.md`` §12.2; the renames onto vlp modules in §12.4. Each ALBEF
checkpoint format (``pretrain``, ``retrieval``, ``vqa``, ``nlvr``, ``ve``) has one table of :class:`Rule`
(an ALBEF key template paired with a vlp key template, used in both directions) and of
:class:`Drop` (ALBEF keys vlp does not keep, each with its reason and how export rebuilds it).
:func:`translate` applies a table to a state dict, every key matched once, first rule wins.

Templates: ``{n}`` is a layer index, ``{rest}`` the rest of the key. A text-layer index ``n``
of ALBEF's single BERT is ``text.encoder.layer.{n}`` for ``n < L`` and ``fusion.layer.{n - L}``
otherwise (L = unimodal text layers, read from the state: the first layer with cross-attention).
A rule with ``twin=True`` also maps the momentum twin: ALBEF's ``<module>_m.*`` <-> vlp's
``momentum.twin.*``.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import torch

from vlp.config.model import ARCH_ALBEF
from vlp.errors import CheckpointError
from vlp.kinds import KINDS, NLVR, NLVR2, NLVR_TA, PRETRAIN, RETRIEVAL, VE, VQA, albef_formats, is_finetuned

#: the ALBEF checkpoint formats (those of the kind registry's entries, :attr:`vlp.kinds.Kind.albef_format`)
ALBEF_FORMATS = albef_formats()
TWIN = "momentum.twin."
VOCAB, POSITIONS = 30522, 512  # what vlp's text tower is built with (vlp.models.text.build_text)


@dataclass(frozen=True)
class Rule:
    """``albef`` <-> ``vlp`` key templates. ``layers``: ``text`` / ``fusion`` for ALBEF's text
    layer index split (see module docstring), ``""`` for an index kept as is. ``tensor``:
    ``transpose`` (ALBEF queue [D, Q] <-> vlp [Q, D]) or ``row`` (``idx_queue`` [1, Q] <-> [Q])."""

    albef: str
    vlp: str
    layers: str = ""
    twin: bool = True
    tensor: str = ""


@dataclass(frozen=True)
class Drop:
    """An ALBEF key vlp does not keep on purpose; export rebuilds it from the key ``source``
    (``arange``: ``arange(rows of source)[None]``; ``copy``: the same tensor)."""

    albef: str
    reason: str
    source: str
    rebuild: str
    twin: bool = True


@dataclass(frozen=True)
class Format:
    rules: tuple[Rule, ...]
    drops: tuple[Drop, ...]
    vlp_only: tuple[tuple[str, str], ...] = ()  # (fnmatch pattern, why ALBEF has no such key)


@dataclass
class KeyReport:
    """What a conversion did: ``mapped`` (source -> destination), ``dropped`` (source key, reason),
    ``missing`` (destination keys without a source: they keep the model's initial value)."""

    kind: str
    direction: str  # "albef->vlp" | "vlp->albef"
    mapped: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line of counts, then the dropped and missing keys (first few of each)."""
        lines = [
            f"{self.direction} ({self.kind}): {len(self.mapped)} mapped, {len(self.dropped)} dropped on purpose, "
            f"{len(self.missing)} missing"
        ]
        reasons: dict[str, int] = {}
        for _, why in self.dropped:
            reasons[why] = reasons.get(why, 0) + 1
        lines += [f"  dropped {n}: {why}" for why, n in reasons.items()]
        lines += [f"  missing: {k}" for k in self.missing[:10]] + (["  ..."] if len(self.missing) > 10 else [])
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = asdict(self)
        d["counts"] = {"mapped": len(self.mapped), "dropped": len(self.dropped), "missing": len(self.missing)}
        d["mapped"] = [{"src": s, "dst": t} for s, t in self.mapped]
        d["dropped"] = [{"key": k, "reason": r} for k, r in self.dropped]
        return d


# ----------------------------------------------------------------------------- rule tables


def _text_rules(prefix: str) -> tuple[Rule, ...]:
    """ALBEF's single BERT (``prefix`` = ``text_encoder.bert.`` or ``text_encoder.``) -> text + fusion."""
    layer = f"{prefix}encoder.layer.{{n}}.{{rest}}"
    return (
        Rule(f"{prefix}embeddings.{{rest}}", "text.embeddings.{rest}"),
        Rule(layer, "text.encoder.layer.{n}.{rest}", layers="text"),
        Rule(layer, "fusion.layer.{n}.{rest}", layers="fusion"),
    )


def _position_ids(embeddings: str) -> Drop:
    return Drop(
        f"{embeddings}position_ids",
        "HF position_ids buffer (not saved by vlp); export rebuilds arange",
        f"{embeddings}position_embeddings.weight",
        "arange",
    )


def _lm_bias(head: str) -> Drop:
    return Drop(
        f"{head}decoder.bias", "tied to the LM head bias (vlp keeps one bias); export copies it", f"{head}bias", "copy"
    )


_VISION = (Rule("visual_encoder.{rest}", "vision.{rest}"),)
_ITC = (
    Rule("vision_proj.{rest}", "vision_proj.{rest}"),
    Rule("text_proj.{rest}", "text_proj.{rest}"),
    Rule("temp", "temp", twin=False),
    Rule("image_queue", "queue.image", twin=False, tensor="transpose"),
    Rule("text_queue", "queue.text", twin=False, tensor="transpose"),
    Rule("queue_ptr", "queue.ptr", twin=False),
)
_ITM = (Rule("itm_head.{rest}", "itm_head.{rest}", twin=False),)

FORMATS: dict[str, Format] = {
    PRETRAIN: Format(
        _VISION
        + _text_rules("text_encoder.bert.")
        + _ITC
        + _ITM
        + (Rule("text_encoder.cls.predictions.{rest}", "mlm_head.{rest}"),),
        (_position_ids("text_encoder.bert.embeddings."), _lm_bias("text_encoder.cls.predictions.")),
        (("queue.ids", "ALBEF pretraining has no idx_queue: the queued image ids are not exported"),),
    ),
    RETRIEVAL: Format(
        _VISION
        + _text_rules("text_encoder.")
        + _ITC
        + _ITM
        + (Rule("idx_queue", "queue.ids", twin=False, tensor="row"),),
        (_position_ids("text_encoder.embeddings."),),
    ),
    VQA: Format(
        _VISION
        + _text_rules("text_encoder.")
        + (
            Rule("text_decoder.bert.embeddings.{rest}", "decoder.embeddings.{rest}"),
            Rule("text_decoder.bert.encoder.layer.{n}.{rest}", "decoder.encoder.layer.{n}.{rest}"),
            Rule("text_decoder.cls.predictions.{rest}", "decoder.lm_head.{rest}"),
        ),
        (
            _position_ids("text_encoder.embeddings."),
            _position_ids("text_decoder.bert.embeddings."),
            _lm_bias("text_decoder.cls.predictions."),
        ),
        (("queue.*", "the VQA model's empty (size 0) feature queue"),),
    ),
    NLVR: Format(
        _VISION
        + _text_rules("text_encoder.")
        + (
            Rule("cls_head.{rest}", "cls_head.{rest}"),
            Rule("ta_head.{rest}", "ta_head.{rest}", twin=False),
            Rule("vision_proj.{rest}", "vision_proj.{rest}", twin=False),
        ),
        (_position_ids("text_encoder.embeddings."),),
    ),
    # SNLI-VE: retrieval-style plain BERT keys, the 3-way cls_head.{0,2}.* and the _m twins
    VE: Format(
        _VISION + _text_rules("text_encoder.") + (Rule("cls_head.{rest}", "cls_head.{rest}"),),
        (_position_ids("text_encoder.embeddings."),),
    ),
}


def _twin_key(albef: str) -> str:
    """``visual_encoder.x`` -> ``visual_encoder_m.x`` (ALBEF names a momentum module ``<module>_m``)."""
    head, dot, rest = albef.partition(".")
    return f"{head}_m{dot}{rest}"


def _with_twins(items: Iterable, twin_of) -> list:
    """Each item followed by its momentum-twin variant where it has one."""
    return [x for item in items for x in ([item, twin_of(item)] if item.twin else [item])]


@cache
def _rules(kind: str) -> tuple[tuple[Rule, re.Pattern, re.Pattern], ...]:
    """The kind's rules incl. momentum twins, each with its compiled ALBEF and vlp regexes."""
    rules = _with_twins(
        FORMATS[kind].rules, lambda r: Rule(_twin_key(r.albef), TWIN + r.vlp, r.layers, False, r.tensor)
    )
    return tuple((r, _regex(r.albef), _regex(r.vlp)) for r in rules)


def _drops(kind: str) -> list[Drop]:
    return _with_twins(
        FORMATS[kind].drops, lambda d: Drop(_twin_key(d.albef), d.reason, _twin_key(d.source), d.rebuild, False)
    )


_SLOTS = {"n": r"(?P<n>\d+)", "rest": r"(?P<rest>.+)"}


def _regex(template: str) -> re.Pattern:
    parts = re.split(r"\{(\w+)\}", template)
    return re.compile("".join(_SLOTS[p] if i % 2 else re.escape(p) for i, p in enumerate(parts)))


def _layer_index(layers: str, n: int, text_layers: int, to_vlp: bool) -> Optional[int]:
    """The destination layer index of source index ``n`` under a rule's ``layers`` (None: the rule
    does not apply to this index)."""
    if layers == "text":
        return n if not to_vlp or n < text_layers else None
    if layers == "fusion":
        if not to_vlp:
            return n + text_layers
        return n - text_layers if n >= text_layers else None
    return n


_TENSOR = {
    "transpose": (lambda t: t.t().contiguous(), lambda t: t.t().contiguous()),
    "row": (lambda t: t.reshape(-1), lambda t: t.reshape(1, -1)),
}


# ----------------------------------------------------------------------------- translation


def translate(
    state: dict[str, torch.Tensor], kind: str, text_layers: int, to_vlp: bool, allow_unexpected: Sequence[str] = ()
) -> tuple[dict[str, torch.Tensor], KeyReport]:
    """Rename every key of ``state`` by the ``kind`` table (ALBEF -> vlp when ``to_vlp``, else the
    inverse, which also rebuilds the dropped ALBEF keys). A key no rule matches raises
    :class:`CheckpointError` naming it, unless it matches an ``allow_unexpected`` fnmatch pattern
    (then it is dropped and reported)."""
    if kind not in FORMATS:
        raise CheckpointError(f"unknown ALBEF checkpoint kind {kind!r}; expected one of {list(ALBEF_FORMATS)}")
    report = KeyReport(kind, "albef->vlp" if to_vlp else "vlp->albef")
    drops = {d.albef: d for d in _drops(kind)}
    vlp_only = FORMATS[kind].vlp_only
    out: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for key, value in state.items():
        if to_vlp and key in drops:
            report.dropped.append((key, drops[key].reason))
            continue
        dst = _apply_rules(key, value, kind, text_layers, to_vlp, out)
        if dst is not None:
            report.mapped.append((key, dst))
        elif not to_vlp and (why := next((w for p, w in vlp_only if fnmatch.fnmatchcase(key, p)), None)):
            report.dropped.append((key, why))
        elif any(fnmatch.fnmatchcase(key, p) for p in allow_unexpected):
            report.dropped.append((key, "unexpected, allowed by --allow-unexpected"))
        else:
            unexpected.append(key)
    if unexpected:
        where = "ALBEF" if to_vlp else "vlp"
        raise CheckpointError(
            f"{len(unexpected)} {where} keys match no {kind!r} rule: {unexpected[:12]}"
            f"{' ...' if len(unexpected) > 12 else ''} (wrong --kind? allow them with --allow-unexpected)"
        )
    if not to_vlp:
        for d in drops.values():
            if d.source in out:
                src = out[d.source]
                out[d.albef] = torch.arange(src.shape[0]).unsqueeze(0) if d.rebuild == "arange" else src
    return out, report


def _apply_rules(
    key: str, value: torch.Tensor, kind: str, text_layers: int, to_vlp: bool, out: dict[str, torch.Tensor]
) -> Optional[str]:
    """Write ``value`` under the first matching rule's destination name into ``out``; that name, or None."""
    for rule, albef_re, vlp_re in _rules(kind):
        m = (albef_re if to_vlp else vlp_re).fullmatch(key)
        if m is None:
            continue
        slots = m.groupdict()
        if "n" in slots:
            n = _layer_index(rule.layers, int(slots["n"]), text_layers, to_vlp)
            if n is None:
                continue
            slots["n"] = str(n)
        dst = (rule.vlp if to_vlp else rule.albef).format(**slots)
        out[dst] = _TENSOR[rule.tensor][0 if to_vlp else 1](value) if rule.tensor else value
        return dst
    return None


_ALBEF_CROSS = re.compile(r"^text_encoder(?:_m)?\.(?:bert\.)?encoder\.layer\.(\d+)\.crossattention\.")
_VLP_TEXT = re.compile(r"^text\.encoder\.layer\.(\d+)\.")


def albef_text_layers(state: dict[str, torch.Tensor]) -> int:
    """ALBEF's unimodal text layers L: the index of the first text-encoder layer with cross-attention."""
    cross = {int(m.group(1)) for k in state if (m := _ALBEF_CROSS.match(k))}
    if not cross:
        raise CheckpointError("no text_encoder layer with cross-attention: not an ALBEF checkpoint")
    return min(cross)


def vlp_text_layers(state: dict[str, torch.Tensor]) -> int:
    """vlp's unimodal text layers: how many ``text.encoder.layer.{i}`` the state has."""
    return len({int(m.group(1)) for k in state if (m := _VLP_TEXT.match(k))})


def convert_albef(
    state: dict[str, torch.Tensor],
    kind: str = "auto",
    allow_unexpected: Sequence[str] = (),
    expected: Optional[Iterable[str]] = None,
) -> tuple[dict[str, torch.Tensor], KeyReport]:
    """An ALBEF state dict (``kind`` or ``auto``-detected format) -> (vlp state, report). With
    ``expected`` (the vlp model's state-dict keys) the report lists the ``missing`` ones."""
    kind = detect_kind(state) if kind == "auto" else kind
    out, report = translate(state, kind, albef_text_layers(state), True, allow_unexpected)
    if expected is not None:
        report.missing = sorted(set(expected) - set(out))
    return out, report


def export_albef_report(vlp_state: dict[str, torch.Tensor], kind: str) -> tuple[dict[str, torch.Tensor], KeyReport]:
    """A vlp state dict -> (ALBEF state of format ``kind``, report of what has no ALBEF key)."""
    return translate(vlp_state, kind, vlp_text_layers(vlp_state), False)


def export_albef(vlp_state: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    """The inverse of :func:`convert_albef`: ALBEF key names and tensors (dropped buffers rebuilt)."""
    return export_albef_report(vlp_state, kind)[0]


def detect_kind(state: dict[str, torch.Tensor]) -> str:
    """The ALBEF format of a state dict, from its distinctive keys (albef.md §12.2)."""
    if any(k.startswith("text_decoder.") for k in state):
        return VQA
    if "cls_head.0.weight" in state or "ta_head.weight" in state:
        layers = {int(m.group(1)) for k in state if (m := re.match(r"text_encoder\.encoder\.layer\.(\d+)\.", k))}
        if len(layers) - albef_text_layers(state) == 2 * albef_text_layers(state):
            return NLVR
        if "cls_head.0.weight" in state and state["cls_head.2.weight"].shape[0] == 3:
            return VE
        raise CheckpointError(
            "a cls_head / ta_head without the doubled fusion layers of NLVR2, and no 3-way SNLI-VE "
            "cls_head: not supported; give --kind to force one"
        )
    if "text_encoder.bert.embeddings.word_embeddings.weight" in state:
        return PRETRAIN
    if "idx_queue" in state:
        return RETRIEVAL
    raise CheckpointError(f"cannot tell the ALBEF checkpoint format of keys {sorted(state)[:8]} ...; give --kind")


# ----------------------------------------------------------------------------- model config


def _heads(width: int, what: str) -> int:
    """Attention heads assuming ALBEF's head dimension 64 (ViT-B and BERT-base)."""
    if width % 64:
        raise CheckpointError(
            f"cannot infer the {what} attention heads from width {width} (not a multiple of 64); "
            f"give them in --config (model YAML: vision.heads / text.heads)"
        )
    return width // 64


def _indices(state: dict[str, torch.Tensor], pattern: str) -> set[int]:
    rx = re.compile(pattern)
    return {int(m.group(1)) for k in state if (m := rx.match(k))}


def infer_model_config(state: dict[str, torch.Tensor], kind: str, base=None):
    """The vlp :class:`~vlp.config.ModelConfig` of an ALBEF state: widths, depths, MLP sizes, image
    size and patch, embed_dim and queue size from tensor shapes; attention heads from ``base``
    (a ModelConfig, e.g. from ``--config``) or width / 64. Sets ``text.albef_compat``."""
    import copy

    from vlp.config import ModelConfig

    try:
        return _infer(state, kind, copy.deepcopy(base) if base is not None else ModelConfig())
    except KeyError as e:
        raise CheckpointError(f"not an ALBEF {kind!r} checkpoint: no key {e}") from None


def _infer(state: dict[str, torch.Tensor], kind: str, cfg):
    """:func:`infer_model_config` on a copy ``cfg`` of the base config."""
    v, t = cfg.vision, cfg.text
    width = state["visual_encoder.cls_token"].shape[-1]
    patch = state["visual_encoder.patch_embed.proj.weight"].shape[-1]
    grid = math.isqrt(state["visual_encoder.pos_embed"].shape[1] - 1)
    v.arch = v.arch or "vit_base_patch16_224"
    v.img_size, v.patch_size, v.width = grid * patch, patch, width
    v.depth = len(_indices(state, r"^visual_encoder\.blocks\.(\d+)\."))
    v.heads = v.heads or _heads(width, "vision")
    v.mlp_ratio = state["visual_encoder.blocks.0.mlp.fc1.weight"].shape[0] / width
    v.pretrained = None
    prefix = "text_encoder.bert." if kind == PRETRAIN else "text_encoder."
    vocab, hidden = state[f"{prefix}embeddings.word_embeddings.weight"].shape
    positions = state[f"{prefix}embeddings.position_embeddings.weight"].shape[0]
    if (vocab, positions) != (VOCAB, POSITIONS):
        raise CheckpointError(
            f"text vocabulary {vocab} x {positions} positions: vlp's BERT tower is built with "
            f"{VOCAB} x {POSITIONS} (bert-base-uncased)"
        )
    n_text = albef_text_layers(state)
    n_fusion = len(_indices(state, rf"^{re.escape(prefix)}encoder\.layer\.(\d+)\.")) - n_text
    t.hidden, t.layers = hidden, n_text
    t.fusion_layers = n_fusion // 2 if kind == NLVR else n_fusion  # vlp's NLVR model doubles it
    t.heads = t.heads or _heads(hidden, "text")
    t.intermediate = state[f"{prefix}encoder.layer.0.intermediate.dense.weight"].shape[0]
    t.init, t.albef_compat = "random", True
    if "vision_proj.weight" in state:
        cfg.embed_dim = state["vision_proj.weight"].shape[0]
    if "image_queue" in state:
        cfg.queue_size = state["image_queue"].shape[1]
    return cfg


def vlp_kind_of(kind: str, state: dict[str, torch.Tensor]) -> str:
    """The vlp checkpoint kind (``state.json`` "task") of an ALBEF format."""
    if kind == NLVR:
        return NLVR2 if "cls_head.0.weight" in state else NLVR_TA
    return kind


#: the ALBEF format of each vlp checkpoint kind that has one (:attr:`vlp.kinds.Kind.albef_format`)
ALBEF_KIND = {name: k.albef_format for name, k in KINDS.items() if k.albef_format}


def resize_albef_pos_embed(state: dict[str, torch.Tensor], image_size: int) -> dict[str, torch.Tensor]:
    """Interpolate ``visual_encoder[_m].pos_embed`` to ``image_size`` (bicubic, CLS kept, albef.md §12.3)."""
    from vlp.models.vision import resize_pos_embed

    patch = state["visual_encoder.patch_embed.proj.weight"].shape[-1]
    if image_size % patch:
        raise CheckpointError(f"--image-size {image_size} is not a multiple of the patch size {patch}")
    tokens = 1 + (image_size // patch) ** 2
    return {
        k: resize_pos_embed(v, tokens) if k in ("visual_encoder.pos_embed", "visual_encoder_m.pos_embed") else v
        for k, v in state.items()
    }


# ----------------------------------------------------------------------------- files


def _wrapper_entries(path: Path) -> list[str]:
    """Top-level entries of a ``{model, optimizer, ...}`` file besides ``model`` (read lazily; [] if unknown)."""
    if path.suffix == ".safetensors":
        return []
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - a legacy (non-zip) file cannot be mapped; the entries are informative only
        return []
    return [str(k) for k in obj if k != "model"] if isinstance(obj, dict) and "model" in obj else []


@dataclass
class ConvertedALBEF:
    """An ALBEF file read and converted in memory (:func:`read_albef_file`), not yet written:
    ``model`` holds the converted weights, ``meta`` is its ``state.json``, ``report`` what the
    conversion did. :func:`save_converted` writes it."""

    model: torch.nn.Module
    meta: dict[str, Any]
    report: KeyReport


def read_albef_file(
    src: str | Path,
    kind: str = "auto",
    image_size: Optional[int] = None,
    allow_unexpected: Sequence[str] = (),
    config: Optional[str | Path] = None,
) -> ConvertedALBEF:
    """An ALBEF ``.pth`` read (:func:`vlp.weights.read_state_dict`), every key translated and loaded
    strictly into the vlp model it describes; nothing is written. Raises :class:`CheckpointError`
    for a file that is not a readable checkpoint of ``kind`` (see :func:`convert_albef_file`)."""
    from vlp.config import FinetuneConfig, ModelConfig, PretrainConfig, load_config, to_dict
    from vlp.models.build import build_model_of_kind
    from vlp.version import __version__
    from vlp.weights import KIND_KEY, load_strict, read_state_dict

    src = Path(src)
    state = read_state_dict(src)
    kind = detect_kind(state) if kind == "auto" else kind
    notes = []
    if image_size is not None and image_size != infer_model_config(state, kind).vision.img_size:
        state = resize_albef_pos_embed(state, image_size)
        notes.append(f"pos_embed interpolated to {image_size} px (export keeps the new size)")
    vlp_state, report = convert_albef(state, kind, allow_unexpected)  # every key checked before building
    base = load_config(ModelConfig, config) if config else None
    cfg = infer_model_config(state, kind, base)
    vlp_kind = vlp_kind_of(kind, state)
    model = build_model_of_kind(vlp_kind, cfg, VOCAB)
    report.missing = sorted(set(model.state_dict()) - set(vlp_state))
    report.dropped += [(f"<file>.{e}", "training state outside the model (not read)") for e in _wrapper_entries(src)]
    report.notes += notes + [
        f"vlp kind {vlp_kind!r}; text layers {cfg.text.layers}, fusion layers "
        f"{len(model.fusion.layer)}; heads vision {cfg.vision.heads} / text {cfg.text.heads}"
        f"{'' if base else ' (width / 64)'}; text.albef_compat=true"
    ]
    load_strict(model, vlp_state, source=str(src), allow_missing=report.missing)
    run_cfg = FinetuneConfig(task=vlp_kind) if is_finetuned(vlp_kind) else PretrainConfig(model=cfg)
    meta = {
        KIND_KEY: vlp_kind,
        "vlp_version": __version__,
        "config": to_dict(run_cfg),
        "model": to_dict(cfg),
        "converted_from": str(src),
        "albef_kind": kind,
    }
    return ConvertedALBEF(model, meta, report)


def save_converted(converted: ConvertedALBEF, out_dir: str | Path) -> KeyReport:
    """Write ``converted`` as a vlp checkpoint folder (``model.safetensors``, ``state.json``,
    ``manifest.json``, then ``key_report.json``); its key report."""
    from vlp.weights import save_checkpoint

    out_dir = Path(out_dir)
    save_checkpoint(out_dir, converted.model, converted.meta)
    (out_dir / "key_report.json").write_text(json.dumps(converted.report.to_json(), indent=1))
    return converted.report


def convert_albef_file(
    src: str | Path,
    out_dir: str | Path,
    kind: str = "auto",
    image_size: Optional[int] = None,
    allow_unexpected: Sequence[str] = (),
    config: Optional[str | Path] = None,
) -> KeyReport:
    """``vlp convert albef``: an ALBEF ``.pth`` -> a vlp checkpoint folder (``model.safetensors``,
    ``state.json``, ``key_report.json``) that :func:`vlp.checkpoint.open_checkpoint` / ``vlp evaluate`` read:
    :func:`read_albef_file`, then :func:`save_converted`."""
    return save_converted(read_albef_file(src, kind, image_size, allow_unexpected, config), out_dir)


def export_albef_checkpoint(ckpt: str | Path, out: str | Path) -> KeyReport:
    """``vlp convert to-albef``: a vlp checkpoint folder -> ``torch.save({"model": sd})`` in the
    ALBEF layout of its kind (pretrain / retrieval / vqa / nlvr / ve)."""
    from vlp.checkpoint import open_checkpoint

    opened = open_checkpoint(ckpt, torch.device("cpu"))
    path, kind, model = opened.path, opened.kind, opened.load()
    albef_format = KINDS.get(kind).albef_format if opened.model_config.arch == ARCH_ALBEF else ""
    if not albef_format:
        raise CheckpointError(f"{path}: a {opened.model_config.arch} {kind!r} checkpoint has no ALBEF layout")
    albef, report = export_albef_report(model.state_dict(), albef_format)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {k: v.detach().cpu().contiguous() for k, v in albef.items()}}, str(out))
    return report
