"""BERT's text tower and our fusion block (self-attn, cross-attn to image, FFN), one layer type.

:class:`FusionLayer` is BERT's post-LN layer with an optional cross-attention. Parameter names
follow BERT (``attention.self.query``, ``crossattention.output.LayerNorm``, ``intermediate.dense``,
``output.dense`` ...), so BERT layers 0-5 load into :class:`TextEncoder` (HF ``BertEmbeddings`` +
layers without cross-attention) and BERT layers 6-11, and ALBEF's fusion layers with their
cross-attention, into :class:`FusionEncoder` by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import BertConfig, BertModel
from transformers.models.bert.modeling_bert import BertEmbeddings

from vlp.config import TEXT_PRESETS, TextConfig, resolved
from vlp.sources import resolve_source
from vlp.weights import load_strict, read_state_dict, rename

# Cross-attention K/V of every fusion layer for a set of images: one (K, V) pair per layer,
# each [B, heads, N, head_dim]. Projected once and reused by every fusion pass of a step.
ImageKV = list[tuple[torch.Tensor, torch.Tensor]]


class _QKV(nn.Module):
    """The projections of an attention, fused: self-attention projects Q, K and V with one ``qkv``
    Linear [3H, H]; cross-attention has ``query`` on the text and one ``kv`` Linear [2H, W] on the
    context (projected once per step for every fusion pass; NLVR2 ties it across layer pairs). One
    matmul instead of three (two), and under autocast one cast of the input and of each weight.

    Checkpoints keep BERT's names: ``state_dict`` splits ``qkv`` / ``kv`` into ``query`` / ``key``
    / ``value`` (``.weight`` and ``.bias``) and ``load_state_dict`` joins them, so BERT and ALBEF
    checkpoints, the converters and saved vlp checkpoints load unchanged. Initialised as the
    separate Linears would be (the same random draws, in the same order)."""

    #: fused Linear -> the BERT Linears it holds, in row order
    FUSED = {"qkv": ("query", "key", "value"), "kv": ("key", "value")}

    def __init__(self, hidden: int, kv_width: int, cross: bool) -> None:
        super().__init__()
        self.cross = cross
        if cross:
            self.query = nn.Linear(hidden, hidden)
            self.kv = _fused([nn.Linear(kv_width, hidden) for _ in self.FUSED["kv"]])
        else:
            self.qkv = _fused([nn.Linear(hidden, hidden) for _ in self.FUSED["qkv"]])
        self.register_state_dict_post_hook(_QKV._split_state)
        self.register_load_state_dict_pre_hook(_QKV._join_state)

    @staticmethod
    def _split_state(module: _QKV, state: dict, prefix: str, local_metadata: dict) -> None:
        for fused, parts in _QKV.FUSED.items():
            for kind in ("weight", "bias"):
                whole = state.pop(f"{prefix}{fused}.{kind}", None)
                if whole is None:
                    continue
                for name, part in zip(parts, whole.chunk(len(parts), 0)):
                    state[f"{prefix}{name}.{kind}"] = part if isinstance(whole, nn.Parameter) else part.clone()

    @staticmethod
    def _join_state(module: _QKV, state: dict, prefix: str, *args: object) -> None:
        fused = "kv" if module.cross else "qkv"
        for kind in ("weight", "bias"):
            keys = [f"{prefix}{name}.{kind}" for name in _QKV.FUSED[fused]]
            if all(k in state for k in keys):  # else torch reports the missing / unexpected keys
                state[f"{prefix}{fused}.{kind}"] = torch.cat([state.pop(k) for k in keys], 0)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Self-attention queries, keys and values, each [B, T, H], of ``x`` [B, T, H]."""
        return self.qkv(x).chunk(3, -1)

    def project_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Cross-attention keys and values, each [B, N, H], of ``context`` [B, N, W]."""
        return self.kv(context).chunk(2, -1)


def _fused(parts: list[nn.Linear]) -> nn.Linear:
    """One Linear holding ``parts`` stacked by rows (their weights, not new draws)."""
    d_in = parts[0].in_features
    whole = nn.Linear(d_in, sum(p.out_features for p in parts), device="meta")  # no draws of its own
    whole.weight = nn.Parameter(torch.cat([p.weight.detach() for p in parts]))
    whole.bias = nn.Parameter(torch.cat([p.bias.detach() for p in parts]))
    return whole


class _AddNorm(nn.Module):
    def __init__(self, d_in: int, hidden: int, dropout: float, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(d_in, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(x)))


class Attention(nn.Module):
    """Multi-head attention with BERT naming, post-LN residual, PyTorch SDPA."""

    def __init__(self, hidden: int, heads: int, kv_width: int, dropout: float, eps: float, cross: bool) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by {heads} heads")
        self.heads, self.dropout_p = heads, dropout
        self.self = _QKV(hidden, kv_width, cross)
        self.output = _AddNorm(hidden, hidden, dropout, eps)
        # Opt-in capture (Grad-CAM, :mod:`vlp.models.gradcam`): when True, forward computes the
        # attention explicitly and keeps its probabilities [B, heads, T, N] in ``probs``.
        self.capture = False
        self.probs: Optional[torch.Tensor] = None

    def _split(self, x: torch.Tensor) -> torch.Tensor:  # [B, L, H] -> [B, heads, L, H/heads]
        b, n, h = x.shape
        return x.view(b, n, self.heads, h // self.heads).transpose(1, 2)

    def project_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention K/V of ``context`` [B, N, kv_width] -> two [B, heads, N, head_dim]."""
        k, v = self.self.project_kv(context)
        return self._split(k), self._split(v)

    def forward(
        self,
        x: torch.Tensor,
        kv: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        mask: Optional[torch.Tensor] = None,
        groups: Optional[KVGroups] = None,
    ) -> torch.Tensor:
        """``x`` [B, T, H] attends to ``kv`` (cross-attention: :meth:`project_kv` of the context), or
        to itself when ``kv`` is None (self-attention: Q, K, V in one projection); ``mask``
        [B, 1, 1, N] bool (True = attend).

        ``groups``: ``kv`` (and ``mask``) hold one entry per distinct context, shared by the rows
        ``groups.index`` maps to it (:class:`KVGroups`), instead of one per row."""
        if kv is None:
            q, k, v = (self._split(t) for t in self.self.project_qkv(x))
        else:
            q, (k, v) = self._split(self.self.query(x)), kv
        p = self.dropout_p if self.training else 0.0
        if self.capture:
            a = self._attend_explicit(q, k, v, mask, groups, p)
        elif groups is None:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        else:
            a = groups.attend(q, k, v, mask, p)
        a = a.transpose(1, 2).reshape(x.shape)
        return self.output(a, x)

    def _attend_explicit(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: Optional[torch.Tensor],
        groups: Optional[KVGroups],
        dropout_p: float,
    ) -> torch.Tensor:
        """The capture path: ``softmax(q k^T / sqrt(d))`` materialised, the same output as SDPA.
        ``q`` [B, heads, T, d]; ``k``/``v`` [B or n_groups, heads, N, d] -> [B, heads, T, d]. The
        probabilities (before dropout) are kept in ``self.probs``; they require grad whenever
        gradients are on (made a leaf when nothing upstream requires grad) so a caller can take
        ``torch.autograd.grad(score, attention.probs)``."""
        if groups is not None:  # one K/V entry per distinct context: index them per row
            # index_select: its backward adds repeated rows in index order (x[index]'s: atomic adds)
            k, v = k.index_select(0, groups.index), v.index_select(0, groups.index)
            mask = None if mask is None else mask.index_select(0, groups.index)
        scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = scores.softmax(-1)
        if torch.is_grad_enabled() and not probs.requires_grad:
            probs.requires_grad_()
        self.probs = probs
        return F.dropout(probs, dropout_p, training=dropout_p > 0) @ v


class KVGroups:
    """Rows of a batch that share a cross-attention context: row b attends to entry ``index[b]``
    of K/V holding one entry per distinct context (e.g. ITM re-ranking: the candidate captions of
    one image). :meth:`attend` broadcasts each entry's K/V to its rows without copying them: the
    queries of a group are laid end to end as one longer query sequence (rows of a cross-attention
    do not interact), padded to the largest group, and attend to the group's K/V once. Only the
    queries ([B, T] rows) are moved, never the K/V ([B, N] rows, N the image tokens)."""

    def __init__(self, index: torch.Tensor, n_groups: int) -> None:
        self.index, self.n_groups = index, n_groups
        counts = torch.bincount(index, minlength=n_groups)
        self.size = int(counts.max()) if len(index) else 0  # the one host sync, per fusion pass
        self.order = torch.argsort(index, stable=True)
        group = index[self.order]
        self.slot = (group, torch.arange(len(index), device=index.device) - (counts.cumsum(0) - counts)[group])

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], dropout_p: float = 0.0
    ) -> torch.Tensor:
        """``q`` [B, heads, T, d]; ``k``/``v`` [n_groups, heads, N, d]; ``mask`` [n_groups, 1, 1, N]
        or None -> [B, heads, T, d], equal to attending with ``k[index]``, ``v[index]``."""
        b, h, t, d = q.shape
        u, c = self.n_groups, self.size
        if u == 1:  # one context (the usual re-ranking batch): no padding, only a reshape of q
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1).reshape(1, h, b * t, d), k, v, attn_mask=mask, dropout_p=dropout_p
            )
            return out.view(h, b, t, d).transpose(0, 1)
        grouped = q.new_zeros(u, c, h, t, d)
        grouped[self.slot] = q[self.order]
        out = F.scaled_dot_product_attention(
            grouped.permute(0, 2, 1, 3, 4).reshape(u, h, c * t, d), k, v, attn_mask=mask, dropout_p=dropout_p
        )
        out = out.view(u, h, c, t, d).permute(0, 2, 1, 3, 4)  # [u, c, h, t, d]
        result = torch.empty_like(q)
        result[self.order] = out[self.slot]
        return result


class FusionLayer(nn.Module):
    """Self-attention -> cross-attention to image tokens -> FFN (post-LN); with ``image_width=None``
    no cross-attention (a BERT text layer).

    Self-attention is bidirectional by default; ``causal=True`` (the VQA answer decoder) lets
    position ``i`` attend only to valid positions ``j <= i``. The cross-attention context may be
    any width (``image_width``): the ViT width, or the text hidden size for the answer decoder
    attending to the multimodal question states.
    """

    def __init__(
        self,
        hidden: int,
        heads: int,
        intermediate: int,
        image_width: Optional[int],
        dropout: float,
        eps: float,
        causal: bool = False,
    ) -> None:
        super().__init__()
        self.causal = causal
        self.attention = Attention(hidden, heads, hidden, dropout, eps, cross=False)
        self.crossattention: Optional[Attention] = None
        if image_width is not None:
            self.crossattention = Attention(hidden, heads, image_width, dropout, eps, cross=True)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(hidden, intermediate)
        self.output = _AddNorm(intermediate, hidden, dropout, eps)

    def forward(
        self,
        x: torch.Tensor,
        text_mask: torch.Tensor,
        image_kv: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        image_mask: Optional[torch.Tensor] = None,
        groups: Optional[KVGroups] = None,
    ) -> torch.Tensor:
        """``x`` [B, T, H]; ``text_mask`` [B, 1, 1, T] bool (True = token); ``image_kv`` two
        [B, heads, N, head_dim] (None without cross-attention); ``image_mask`` [B, 1, 1, N] bool or
        None. Returns [B, T, H]. ``groups``: ``image_kv`` / ``image_mask`` hold one entry per
        distinct image (:class:`KVGroups`)."""
        if self.causal:
            text_mask = causal_mask(text_mask)
        x = self.attention(x, None, text_mask)
        if self.crossattention is not None:
            x = self.crossattention(x, image_kv, image_mask, groups)
        return self.output(F.gelu(self.intermediate.dense(x)), x)


class FusionEncoder(nn.Module):
    """A stack of :class:`FusionLayer`; parameters ``layer.{i}.*`` in BERT naming.

    With a list of image inputs, layer ``i`` attends to element ``i mod len(list)`` (NLVR2).
    ``causal=True`` makes every layer's self-attention causal (the VQA answer decoder).
    ``image_width=None``: no cross-attention (the text tower's layers), called without ``image``.
    """

    def __init__(
        self,
        hidden: int,
        layers: int,
        heads: int,
        intermediate: int,
        image_width: Optional[int],
        dropout: float = 0.1,
        eps: float = 1e-12,
        causal: bool = False,
    ) -> None:
        super().__init__()
        self.causal = causal
        self.grad_checkpointing = False  # recompute each layer in the backward pass (training only)
        self.layer = nn.ModuleList(
            FusionLayer(hidden, heads, intermediate, image_width, dropout, eps, causal) for _ in range(layers)
        )

    def image_kv(self, image_tokens: Union[torch.Tensor, Sequence[torch.Tensor]]) -> ImageKV:
        """Project image tokens [B, N, W] to every layer's cross-attention K/V once."""
        imgs = [image_tokens] if isinstance(image_tokens, torch.Tensor) else list(image_tokens)
        return [_cross(lay).project_kv(imgs[i % len(imgs)]) for i, lay in enumerate(self.layer)]

    def forward(
        self,
        hidden: torch.Tensor,
        text_mask: torch.Tensor,
        image: Union[torch.Tensor, Sequence[torch.Tensor], ImageKV, None] = None,
        image_mask: Optional[torch.Tensor] = None,
        image_index: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``hidden`` [B, T, H] text states, ``text_mask`` [B, T] (1 = token), ``image``: tokens
        [B, N, W], a list of token tensors, or precomputed :meth:`image_kv`. Returns [B, T, H].

        ``image_index`` [B] (optional): ``image`` (and ``image_mask``) hold one entry per distinct
        image and text row b attends to entry ``image_index[b]``; each image's K/V are broadcast to
        its rows (:class:`KVGroups`), not copied per row. Same result as indexing them per row."""
        kv: Sequence[Optional[tuple[torch.Tensor, torch.Tensor]]]
        if image is None:  # the text tower's layers
            kv = [None] * len(self.layer)
        else:
            kv = image if _is_kv(image) else self.image_kv(image)  # type: ignore[arg-type]
        tmask = text_mask.bool()[:, None, None, :]
        imask = None if image_mask is None else image_mask.bool()[:, None, None, :]
        groups = None if image_index is None or kv[0] is None else KVGroups(image_index, kv[0][0].shape[0])
        recompute = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        for lay, layer_kv in zip(self.layer, kv):
            if recompute:
                hidden = checkpoint(lay, hidden, tmask, layer_kv, imask, groups, use_reentrant=False)
            else:
                hidden = lay(hidden, tmask, layer_kv, imask, groups)
        return hidden


def causal_mask(text_mask: torch.Tensor) -> torch.Tensor:
    """Padding mask [B, 1, 1, T] (or already [B, 1, T, T]) bool -> [B, 1, T, T]: query ``i`` may attend
    key ``j`` iff ``j <= i`` and ``j`` is a token. Idempotent."""
    t = text_mask.shape[-1]
    tri = torch.ones(t, t, dtype=torch.bool, device=text_mask.device).tril()
    return text_mask & tri


def _cross(layer: nn.Module) -> Attention:
    if layer.crossattention is None:
        raise ValueError("these layers have no cross-attention (a text tower's): there is no image K/V to project")
    return layer.crossattention


def _is_kv(x: object) -> bool:
    return isinstance(x, list) and len(x) > 0 and isinstance(x[0], tuple)


def select_kv(kv: ImageKV, index: torch.Tensor) -> ImageKV:
    """Rows ``index`` [M] of every layer's K/V (gradients flow back to the shared projection)."""
    return [(k.index_select(0, index), v.index_select(0, index)) for k, v in kv]


class TextEncoder(nn.Module):
    """BERT's text tower: HF ``BertEmbeddings`` -> :class:`FusionLayer` s without cross-attention
    (self-attention with one ``qkv`` projection, FFN, post-LN), in BERT's parameter names
    (``embeddings.*``, ``encoder.layer.{i}.attention.self.query.weight`` ...), so BERT and ALBEF
    checkpoints load by name. ``config``: its ``BertConfig``.

    The same computation as HF's ``BertModel`` without pooler (SDPA attention; the same dropout
    draws in training), and initialised as it is from the same random state (BERT's N(0, 0.02)
    Linear and embedding weights, zero biases, unit LayerNorms), but without its per-call mask
    preparation or separate Q, K and V launches."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embeddings = BertEmbeddings(c)
        self.encoder = FusionEncoder(
            c.hidden_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.intermediate_size,
            image_width=None,
            dropout=c.hidden_dropout_prob,
            eps=c.layer_norm_eps,
        )
        bert_init(self, c.initializer_range)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``input_ids`` [B, T], ``attention_mask`` [B, T] (1 = token) -> hidden states [B, T, H]."""
        return self.encoder(self.embeddings(input_ids=input_ids), attention_mask)


@torch.no_grad()
def bert_init(module: nn.Module, std: float) -> None:
    """BERT's initialisation, module by module in registration order (HF ``BertModel``'s draws):
    Linear and embedding weights N(0, ``std``), zero biases and padding rows, unit LayerNorms."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            m.weight.normal_(0.0, std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            m.bias.zero_()
        elif isinstance(m, nn.Embedding) and m.padding_idx is not None:
            m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            m.weight.fill_(1.0)
            m.bias.zero_()


#: BertConfig key <- text preset key (vlp's TextConfig names)
BERT_KEYS = {
    "hidden_size": "hidden",
    "num_hidden_layers": "layers",
    "num_attention_heads": "heads",
    "intermediate_size": "intermediate",
    "hidden_dropout_prob": "dropout",
    "attention_probs_dropout_prob": "dropout",
}


def build_text(cfg: TextConfig, image_width: int) -> tuple[TextEncoder, FusionEncoder]:
    """Text tower (:class:`TextEncoder`) + fusion encoder, initialised per ``cfg.init``.

    With an init source, its embeddings and layers ``0..layers-1`` fill the text tower and layers
    ``layers..layers+fusion_layers-1`` fill the fusion block (whose cross-attention is new).
    """
    r = resolved(cfg, TEXT_PRESETS)
    bert_cfg = BertConfig(vocab_size=30522, max_position_embeddings=512, **{k: r[v] for k, v in BERT_KEYS.items()})
    text = TextEncoder(bert_cfg)
    width, heads, ffn, dropout = r["hidden"], r["heads"], r["intermediate"], r["dropout"]
    fusion = FusionEncoder(width, r["fusion_layers"], heads, ffn, image_width, dropout, bert_cfg.layer_norm_eps)
    if r["init"] and r["init"] != "random":
        init_from_bert(text, fusion, resolve_source(r["init"]), r["layers"])
    return text, fusion


def init_from_bert(text: TextEncoder, fusion: FusionEncoder, source: str, n_text: int) -> None:
    """Load a BERT checkpoint (directory, weights file or hub name) into text + fusion, strictly."""
    if Path(source).exists():
        state = read_state_dict(source)
    else:  # hub name: transformers resolves it (needs network or a local HF cache)
        state = BertModel.from_pretrained(source, add_pooling_layer=False).state_dict()
    state = rename(state, [(r"^bert\.", ""), (r"^(pooler|cls)\..*", ""), (r"^embeddings\.position_ids$", "")])
    n_fusion = len(fusion.layer)
    text_state, fusion_state = {}, {}
    for k, v in state.items():
        if k.startswith("encoder.layer."):
            i = int(k.split(".")[2])
            rest = k.split(".", 3)[3]
            if i < n_text:
                text_state[k] = v
            elif i < n_text + n_fusion:
                fusion_state[f"layer.{i - n_text}.{rest}"] = v
        else:
            text_state[k] = v
    load_strict(text, text_state, source=source)
    # A plain BERT has no cross-attention: it is newly initialised. An ALBEF-style checkpoint
    # that has it loads it too.
    load_strict(fusion, fusion_state, source=source, allow_missing=["layer.*.crossattention.*"])
