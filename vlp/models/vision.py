"""ViT image tower built with timm; returns every token after the final norm.

Initialisation (``model.vision.init``, docs/training.md "Initialising the image tower"): random,
timm / DeiT weights (timm names) or CLIP / open_clip weights (``visual.*`` names, converted with
timm's own converter; Hugging Face ``vision_model.*`` CLIP files via OpenAI's names). Every init leaves a key report on the tower (``tower.init_report``): which
source keys were mapped to which tower keys, which were dropped and why, which tower keys were
left at their random value (only where allowed), and the tensor transformations applied.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import re
from pathlib import Path
from typing import Any, Optional

import timm
import torch
from torch import nn

from vlp.config import VISION_PRESETS, VisionConfig, resolved
from vlp.errors import CheckpointError, ConfigError
from vlp.models.clip_weights import (
    CLIP_ARCHS,
    CLIP_TRANSFORMS,
    HF_CLIP_TRANSFORMS,
    clip_prefix,
    convert_clip,
    convert_hf_clip,
    is_hf_clip,
    refuse_resnet_clip,
    refuse_torchscript,
)
from vlp.weights import load_strict, read_state_dict

logger = logging.getLogger(__name__)

INIT_KINDS = ("none", "timm", "deit", "clip", "open_clip")
REPORT_FILE = "vision_init_report.json"

# Source keys of timm-named checkpoints (DeiT, timm ViT) left out on purpose: (pattern, reason).
TIMM_DROPPED: tuple[tuple[str, str], ...] = (
    ("head.*", "classification head: the tower is built without one (num_classes=0)"),
    ("head_dist.*", "DeiT distillation head: no teacher in vision-language training"),
    ("dist_token", "DeiT distillation token: the tower keeps the class token only (its pos_embed row is dropped too)"),
    ("pre_logits.*", "representation layer of old ViT checkpoints, unused by the token features"),
)


def init_kind(cfg: VisionConfig) -> str:
    """``cfg.init``, or today's default: ``timm`` when ``pretrained`` is set, else ``none``."""
    if cfg.init is not None:
        return cfg.init
    return "none" if cfg.pretrained is None else "timm"


def is_hub_name(pretrained: str) -> bool:
    """A name that is not a local path (a timm pretrained tag such as ``deit_base_patch16_224.fb_in1k``)."""
    return not Path(pretrained).exists()


def vision_arch(cfg: VisionConfig) -> str:
    """The timm architecture: ``model.vision.arch``, else the CLIP ViT layout for ``clip``/``open_clip``,
    the model name of a timm hub tag for ``timm``, else the preset's."""
    kind = init_kind(cfg)
    if cfg.arch is not None:
        return cfg.arch
    if kind in CLIP_ARCHS:
        return CLIP_ARCHS[kind]
    if kind == "timm" and cfg.pretrained is not None and is_hub_name(cfg.pretrained):
        name = cfg.pretrained.split(".")[0]
        if timm.is_model(name):
            return name
    return VISION_PRESETS[cfg.preset]["arch"]


def build_vision(cfg: VisionConfig) -> nn.Module:
    """A timm ``VisionTransformer`` without a head (``num_classes=0``), initialised per ``cfg.init``.

    Call ``.forward_features(images [B, 3, H, W])`` for tokens ``[B, 1 + N, width]`` (CLS first).
    ``cfg.pretrained`` names a local weights file or a timm hub tag; the position embedding is
    resized to ``img_size`` (:func:`resize_pos_embed`). The key report is ``tower.init_report``.
    With an init kind but no ``pretrained`` (checkpoint reloads) only the architecture is built.
    """
    r = resolved(cfg, VISION_PRESETS)
    kind = init_kind(cfg)
    arch = vision_arch(cfg)
    vit = timm.create_model(
        arch,
        pretrained=False,
        img_size=r["img_size"],
        patch_size=r["patch_size"],
        embed_dim=r["width"],
        depth=r["depth"],
        num_heads=r["heads"],
        mlp_ratio=r["mlp_ratio"],
        drop_path_rate=r["drop_path"],
        num_classes=0,
    )
    check_layout(vit, kind, arch)
    report: dict[str, Any] = dict(
        init=kind, source=cfg.pretrained, arch=arch, format=None, mapped={}, dropped={}, missing=[], transforms={}
    )
    if cfg.pretrained is not None:
        report.update(load_vision_weights(vit, cfg.pretrained, list(cfg.init_allow_missing)))
    vit.init_report = report  # a plain attribute: not part of the state dict
    return vit


def check_layout(vit: nn.Module, kind: str, arch: str) -> None:
    """CLIP weights need the CLIP ViT layout: ``norm_pre`` and the kind's activation."""
    if kind not in CLIP_ARCHS:
        return
    from timm.layers import QuickGELU

    act = type(vit.blocks[0].mlp.act) if len(vit.blocks) else None
    want = QuickGELU if kind == "clip" else nn.GELU
    if not isinstance(vit.norm_pre, nn.LayerNorm) or act is not want:
        raise ConfigError(
            f"config key 'model.vision.arch': {arch!r} is not the CLIP ViT layout that "
            f"model.vision.init={kind} needs (norm_pre LayerNorm, {want.__name__}); leave arch unset "
            f"({CLIP_ARCHS[kind]})"
        )


def load_vision_weights(vit: nn.Module, pretrained: str, allow_missing: list[str]) -> dict[str, Any]:
    """Read ``pretrained`` (file or hub tag), convert it to the tower's names, load it strictly.

    Returns the report fields ``format mapped dropped missing transforms``. Tower keys absent from
    the source fail the load unless they match ``allow_missing`` (fnmatch patterns).
    """
    state = hub_state_dict(pretrained) if is_hub_name(pretrained) else read_weights(pretrained)
    refuse_resnet_clip(state, pretrained)
    prefix = clip_prefix(state)
    if prefix is not None:
        state, mapped, dropped = convert_clip(state, vit, prefix)
        fmt, transforms = "clip", dict(CLIP_TRANSFORMS)
    elif is_hf_clip(state):
        state, mapped, dropped = convert_hf_clip(state, vit)
        fmt, transforms = "hf_clip", dict(HF_CLIP_TRANSFORMS)
    else:
        state, mapped, dropped = drop_timm_keys(state)
        fmt, transforms = "timm", {}
    if "pos_embed" in state:
        state["pos_embed"], note = fit_pos_embed(state["pos_embed"], vit, distilled="dist_token" in dropped)
        if note:
            transforms["pos_embed"] = "; ".join(filter(None, [transforms.get("pos_embed"), note]))
    own = vit.state_dict()
    missing = sorted(k for k in own if k not in state and any(fnmatch.fnmatchcase(k, p) for p in allow_missing))
    load_strict(vit, state, source=pretrained, allow_missing=allow_missing)
    return dict(format=fmt, mapped=mapped, dropped=dropped, missing=missing, transforms=transforms)


def read_weights(path: str) -> dict[str, torch.Tensor]:
    """A local state dict (.safetensors / .pth / .bin / open_clip .pt; checkpoints holding it under
    ``state_dict`` are unwrapped); OpenAI's TorchScript .pt is refused with a hint."""
    refuse_torchscript(path)
    state = read_state_dict(path)
    inner = state.get("state_dict")
    return inner if isinstance(inner, dict) else state


def hub_state_dict(name: str) -> dict[str, torch.Tensor]:
    """The weights of the timm pretrained tag ``name`` (timm names, fetched through timm), or of
    the Hugging Face repository ``org/name`` (a transformers CLIP model's weights file).

    Offline, or when the hub cannot be reached, fails with a message asking for a local file.
    """
    from huggingface_hub import constants

    hf_repo = re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None  # e.g. openai/clip-vit-base-patch16
    if not (hf_repo or timm.list_pretrained(name) or timm.list_pretrained(name + ".*")):
        raise CheckpointError(
            f"model.vision.pretrained={name!r}: no such file, and not a timm pretrained tag "
            "(e.g. deit_base_patch16_224.fb_in1k, vit_base_patch16_clip_224.openai) or a Hugging "
            "Face repository (e.g. openai/clip-vit-base-patch16)"
        )
    hint = (
        f"model.vision.pretrained={name!r} is a hub name, and the hub cannot be reached{{why}}. Download the "
        "weights where there is network and pass the local file: model.vision.pretrained=/path/to/weights "
        "(.safetensors, .pth, .bin, or an open_clip .pt state dict; OpenAI's TorchScript .pt is not read)"
    )
    if constants.is_offline_mode():
        raise CheckpointError(hint.format(why=" (offline mode: HF_HUB_OFFLINE=1)"))
    try:
        if hf_repo:  # a transformers CLIP repository: its weights file, converted by load_vision_weights
            from huggingface_hub import hf_hub_download
            from huggingface_hub.utils import EntryNotFoundError

            try:
                return read_weights(hf_hub_download(name, "model.safetensors"))
            except EntryNotFoundError:
                return read_weights(hf_hub_download(name, "pytorch_model.bin"))
        return timm.create_model(name, pretrained=True, num_classes=0).state_dict()
    except OSError as e:  # LocalEntryNotFoundError, connection errors
        raise CheckpointError(hint.format(why=f" ({type(e).__name__})")) from e


def drop_timm_keys(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str], dict[str, str]]:
    """A timm-named state dict -> ``(state, mapped, dropped)`` per :data:`TIMM_DROPPED` (names kept)."""
    out: dict[str, torch.Tensor] = {}
    mapped: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for key, value in state.items():
        reason = next((r for p, r in TIMM_DROPPED if fnmatch.fnmatchcase(key, p)), None)
        if reason is not None:
            dropped[key] = reason
        else:
            out[key] = value
            mapped[key] = key
    return out, mapped, dropped


def fit_pos_embed(pos: torch.Tensor, vit: nn.Module, distilled: bool = False) -> tuple[torch.Tensor, str]:
    """The source position embedding made to fit ``vit``: a DeiT distillation row (index 1) dropped,
    then :func:`resize_pos_embed` to the tower's grid. Returns ``(tensor, note)``."""
    notes = []
    if distilled:
        pos = torch.cat([pos[:, :1], pos[:, 2:]], dim=1)
        notes.append("row 1 (distillation token) dropped")
    n = vit.pos_embed.shape[1]
    if pos.shape[1] != n:
        g_old, g_new = round((pos.shape[1] - 1) ** 0.5), round((n - 1) ** 0.5)
        pos = resize_pos_embed(pos, n)
        notes.append(f"grid {g_old}x{g_old} -> {g_new}x{g_new} (resize_pos_embed: bicubic, class token kept)")
    return pos, "; ".join(notes)


def report_line(report: dict[str, Any]) -> str:
    """One line (logged) summarising an init report."""
    if report.get("source") is None:
        return f"vision init: {report['init']} (random weights, arch {report['arch']})"
    pos = [n for n in report["transforms"].get("pos_embed", "").split("; ") if n.startswith(("grid", "row"))]
    return (
        f"vision init: {report['init']} from {report['source']} ({report['format']} names, arch {report['arch']}): "
        f"{len(report['mapped'])} tensors mapped, {len(report['dropped'])} dropped on purpose, "
        f"{len(report['missing'])} left random{'; pos_embed ' + ', '.join(pos) if pos else ''}"
    )


def write_init_report(model: nn.Module, run_dir: str | Path) -> Optional[Path]:
    """Write ``model.vision.init_report`` to ``run_dir/vision_init_report.json`` and log its line (INFO)
    (models without such a tower, e.g. the dual encoder, write nothing)."""
    report = getattr(getattr(model, "vision", None), "init_report", None)
    if report is None:
        return None
    out = Path(run_dir) / REPORT_FILE
    out.write_text(json.dumps(report, indent=2) + "\n")
    logger.info(report_line(report))
    return out


def check_vision_init(cfg: VisionConfig) -> None:
    """Before a pretraining run: an init kind that loads weights needs ``model.vision.pretrained``."""
    kind = init_kind(cfg)
    if kind in ("deit", "clip", "open_clip") and cfg.pretrained is None:
        raise ConfigError(
            f"config key 'model.vision.pretrained': model.vision.init={kind} needs a weights file or "
            "hub tag (set model.vision.init=none for a random tower)"
        )


def create_timm(arch: str, pretrained: Optional[str] = None, **kwargs: Any) -> nn.Module:
    """``timm.create_model(arch)`` with random weights (``pretrained=None``), weights from a local
    file, or a timm hub tag (which replaces ``arch``; needs network or the HF cache)."""
    if pretrained is None:
        return timm.create_model(arch, pretrained=False, **kwargs)
    if Path(pretrained).exists():
        return timm.create_model(arch, pretrained=True, pretrained_cfg_overlay=dict(file=str(pretrained)), **kwargs)
    return timm.create_model(pretrained, pretrained=True, **kwargs)


def resize_pos_embed(pos_embed: torch.Tensor, num_tokens: int, num_prefix: int = 1) -> torch.Tensor:
    """Interpolate a ViT position embedding [1, P + G*G, W] to [1, num_tokens, W] (square grids,
    bicubic, prefix entries such as CLS kept). The same size returns the input unchanged."""
    from timm.layers import resample_abs_pos_embed

    if pos_embed.shape[1] == num_tokens:
        return pos_embed
    old, new = pos_embed.shape[1] - num_prefix, num_tokens - num_prefix
    g_old, g_new = round(old**0.5), round(new**0.5)
    if g_old * g_old != old or g_new * g_new != new:
        raise ValueError(
            f"position embedding of {pos_embed.shape[1]} tokens -> {num_tokens}: "
            f"both must be {num_prefix} + a square grid"
        )
    out = resample_abs_pos_embed(
        pos_embed.float(),
        [g_new, g_new],
        [g_old, g_old],
        num_prefix_tokens=num_prefix,
        interpolation="bicubic",
        antialias=False,
    )
    return out.to(pos_embed.dtype)
