"""Analytic FLOP model of one ALBEF pretraining step, per image-text pair (docs/performance.md).

Only matrix multiplies count (linear layers, QK^T, AV, the patch embedding), at 2 FLOP per
multiply-add; a trained pass costs 3x its forward (backward = 2x), a momentum pass 1x. The
inventory is vlp's step as implemented: cross-attention K/V projected once per image and reused
by the ITM positive, the two ITM negatives and the MLM pass; the MLM head only at masked
positions. ``tests/test_flops.py`` checks it against torch's FLOP counter on a tiny model.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlp.config import TEXT_PRESETS, VISION_PRESETS, PretrainConfig, resolved


@dataclass(frozen=True)
class Shapes:
    """Everything the count depends on."""

    n: int  # image tokens (patches + CLS)
    patches: int
    patch: int
    w: int  # ViT width
    vit_layers: int
    mlp_ratio: float
    d: int  # text width
    text_layers: int
    fusion_layers: int
    inter: int  # text FFN width
    vocab: int
    embed: int  # ITC projection width
    t: int  # text tokens (padded length)
    masked: float  # MLM-masked tokens per caption (the probability x the t - 2 tokens besides [CLS], [SEP])
    batch: int
    queue: int


def shapes(cfg: PretrainConfig, t: int, vocab: int = 30522) -> Shapes:
    v, x = resolved(cfg.model.vision, VISION_PRESETS), resolved(cfg.model.text, TEXT_PRESETS)
    grid = v["img_size"] // v["patch_size"]
    return Shapes(
        n=grid * grid + 1,
        patches=grid * grid,
        patch=v["patch_size"],
        w=v["width"],
        vit_layers=v["depth"],
        mlp_ratio=cfg.model.vision.mlp_ratio,
        d=x["hidden"],
        text_layers=x["layers"],
        fusion_layers=x["fusion_layers"],
        inter=x["intermediate"],
        vocab=vocab,
        embed=cfg.model.embed_dim,
        t=t,
        masked=cfg.loss.mlm_probability * max(t - 2, 0) if cfg.loss.mlm else 0.0,
        batch=cfg.data.batch_size,
        queue=cfg.model.queue_size,
    )


def patch_embed_forward(s: Shapes) -> float:
    return 2 * s.patches * 3 * s.patch * s.patch * s.w


def vit_forward(s: Shapes) -> float:
    layer = (8 + 4 * s.mlp_ratio) * s.n * s.w**2 + 4 * s.n**2 * s.w
    return patch_embed_forward(s) + s.vit_layers * layer


def text_forward(s: Shapes) -> float:
    return s.text_layers * (8 * s.t * s.d**2 + 4 * s.t * s.d * s.inter + 4 * s.t**2 * s.d)


def fusion_body_forward(s: Shapes) -> float:
    """Fusion layers without the image K/V projections: self-attention, cross-attention queries,
    scores and output, FFN."""
    per_layer = 8 * s.t * s.d**2 + 4 * s.t**2 * s.d + 4 * s.t * s.d**2 + 4 * s.t * s.n * s.d + 4 * s.t * s.d * s.inter
    return s.fusion_layers * per_layer


def image_kv_forward(s: Shapes) -> float:
    return s.fusion_layers * 4 * s.n * s.w * s.d


def mlm_head_forward(s: Shapes) -> float:
    return 2 * s.masked * (s.d**2 + s.d * s.vocab)


def step_terms(cfg: PretrainConfig, t: int, vocab: int = 30522) -> dict[str, float]:
    """FLOP per pair of each part of the step (trained parts x3, momentum parts x1)."""
    s, c = shapes(cfg, t, vocab), cfg.loss
    distill = c.distill and c.alpha > 0
    proj = 2 * s.embed * (s.w + s.d)
    bank = s.batch + s.queue
    terms = {
        "vit (online)": 3 * vit_forward(s) - patch_embed_forward(s),  # no gradient w.r.t. the pixels
        "text (online)": 3 * text_forward(s),
        "projections (online + momentum)": 4 * proj,
        "vit (momentum)": vit_forward(s),
        "text (momentum)": text_forward(s),
        # online features x momentum bank (gradient on one side only: 2x), distillation targets 1x
        "itc similarities": 2 * 2 * bank * s.embed * (2 + (1 if distill else 0)),
    }
    if c.itm or c.mlm:
        terms["image k/v once (online)"] = 3 * image_kv_forward(s)
    if c.itm:
        terms["itm fusion (positive + 2 negatives)"] = 3 * 3 * fusion_body_forward(s)
        terms["itm head"] = 3 * 3 * 2 * s.d * 2
    if c.mlm:
        terms["mlm text + fusion (online)"] = 3 * (text_forward(s) + fusion_body_forward(s))
        terms["mlm head (online, masked positions)"] = 3 * mlm_head_forward(s)
        if distill:
            terms["mlm (momentum)"] = (
                text_forward(s) + fusion_body_forward(s) + image_kv_forward(s) + mlm_head_forward(s)
            )
    return terms


def step_flops(cfg: PretrainConfig, t: int, vocab: int = 30522) -> float:
    """Total FLOP per pair of one pretraining step."""
    return sum(step_terms(cfg, t, vocab).values())
