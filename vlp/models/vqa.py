"""VQA as answer generation (ALBEF §5): the question encoder is ALBEF's ViT + text + fusion run on the
question; a causal answer decoder cross-attends to the multimodal question states in every layer.

Answers are ranked over a fixed candidate list (:meth:`VQAModel.rank_answers`); training losses
live in :mod:`vlp.losses.vqa`, the training step in :mod:`vlp.tasks.vqa`.
"""

from __future__ import annotations

import re
from typing import Union

import torch
from torch import nn
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertEmbeddings

from vlp.config import ModelConfig
from vlp.errors import CheckpointError
from vlp.losses.vqa import first_token_topk, select_answers, sequence_nll
from vlp.models.albef import ALBEF
from vlp.models.heads import MLMHead
from vlp.models.text import FusionEncoder, ImageKV, bert_init, select_kv

#: Cross-attention context of the decoder: question states [A, T, H] or their projected K/V.
QuestionContext = Union[torch.Tensor, ImageKV]


class AnswerDecoder(nn.Module):
    """BERT-style LM decoder: embeddings -> causal fusion layers (cross-attention to the question
    states in every layer) -> LM head tied to the word embeddings.

    Parameter names: ``embeddings.*`` (HF ``BertEmbeddings``), ``encoder.layer.{i}.*`` (our
    :class:`FusionLayer`, BERT naming), ``lm_head.*`` (:class:`MLMHead`), so a pretraining
    checkpoint's embeddings, fusion layers and MLM head load into it (:meth:`VQAModel.adapt_pretrained`).
    """

    def __init__(self, bert_config: BertConfig, n_layers: int) -> None:
        super().__init__()
        c = bert_config
        self.embeddings = BertEmbeddings(c)
        bert_init(self.embeddings, c.initializer_range)
        self.encoder = FusionEncoder(
            c.hidden_size,
            n_layers,
            c.num_attention_heads,
            c.intermediate_size,
            image_width=c.hidden_size,
            dropout=c.hidden_dropout_prob,
            eps=c.layer_norm_eps,
            causal=True,
        )
        self.lm_head = MLMHead(c.hidden_size, c.vocab_size, c.layer_norm_eps)
        self.lm_head.tie(self.embeddings.word_embeddings)

    def question_kv(self, question_states: torch.Tensor) -> ImageKV:
        """Project question states [B, T, H] to every layer's cross-attention K/V once."""
        return self.encoder.image_kv(question_states)

    def forward(
        self,
        answer_ids: torch.Tensor,
        answer_mask: torch.Tensor,
        question: QuestionContext,
        question_mask: torch.Tensor,
    ) -> torch.Tensor:
        """``answer_ids``/``answer_mask`` [A, L]; ``question`` [A, T, H] states (or their K/V from
        :meth:`question_kv`, rows aligned with the answers); ``question_mask`` [A, T] (1 = token,
        padding is masked in cross-attention). Returns logits [A, L, V]; position ``t`` predicts
        token ``t + 1`` and sees answer tokens ``0..t`` only."""
        h = self.embeddings(input_ids=answer_ids)
        h = self.encoder(h, answer_mask, question, question_mask)
        return self.lm_head(h)


class VQAModel(ALBEF):
    """ALBEF encoder (no ITC/ITM/MLM heads) + :class:`AnswerDecoder` with as many layers as the
    fusion block; momentum twins of vision, text, fusion and decoder (``cfg.momentum``, ALBEF 0.995)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, itc=False, itm=False, mlm=False)

    def build_heads(self) -> None:
        self.decoder = AnswerDecoder(self.text.config, n_layers=len(self.fusion.layer))

    def momentum_modules(self) -> dict[str, nn.Module]:
        return {**super().momentum_modules(), "decoder": self.decoder}

    # -- encoder / decoder ---------------------------------------------------------------------

    def encode_question(
        self, images: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor, momentum: bool = False
    ) -> torch.Tensor:
        """ALBEF ``multi_modal`` mode: images [B, 3, H, W], question ids/mask [B, T] -> fused
        question states [B, T, H] (text layers, then fusion layers cross-attending to the ViT tokens)."""
        tokens = self.encode_image(images, momentum).tokens
        hidden = self.text_states(input_ids, attention_mask, momentum)
        return self.fuse(hidden, attention_mask, tokens, momentum)

    def question_kv(self, question_states: torch.Tensor, momentum: bool = False) -> ImageKV:
        """Decoder cross-attention K/V of question states [B, T, H], projected once per question
        (index rows with :func:`vlp.models.text.select_kv` to repeat them per answer)."""
        return self._m("decoder", momentum).question_kv(question_states)

    def answer_logits(
        self,
        question_states: QuestionContext,
        question_mask: torch.Tensor,
        answer_ids: torch.Tensor,
        answer_mask: torch.Tensor,
        momentum: bool = False,
    ) -> torch.Tensor:
        """Teacher-forced decoder: question states [A, T, H] (or K/V), mask [A, T], answers [A, L]
        -> logits [A, L, V]."""
        return self._m("decoder", momentum)(answer_ids, answer_mask, question_states, question_mask)

    @torch.no_grad()
    def rank_answers(
        self,
        question_states: torch.Tensor,
        question_mask: torch.Tensor,
        cand_ids: torch.Tensor,
        cand_mask: torch.Tensor,
        k: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pick each question's answer from a candidate list (ALBEF's two-step ranking, first token
        counted once).

        ``question_states`` [B, T, H], ``question_mask`` [B, T]; ``cand_ids``/``cand_mask`` [C, L]
        ``[CLS] answer [SEP]`` candidates. Step 1 decodes one step from [CLS] and keeps the
        ``min(k, C)`` candidates with the most probable first answer token; step 2 teacher-forces
        them and scores each by -(token-summed NLL). Returns ``(pred [B] long, scores [B, C])``:
        candidate indices and the scores, -inf outside each question's top k.
        """
        b, c = question_states.shape[0], cand_ids.shape[0]
        kv = self.question_kv(question_states)
        start = cand_ids[:1, :1].expand(b, 1)  # [CLS] for every question
        first_logits = self.decoder(start, torch.ones_like(start), kv, question_mask)[:, 0]  # [B, V]
        topk = first_token_topk(first_logits, cand_ids[:, 1], k)  # [B, k]
        kk = topk.shape[1]
        rows = topk.reshape(-1)  # candidate of each (question, slot), question-major
        q_index = torch.arange(b, device=topk.device).repeat_interleave(kk)
        ids, mask = cand_ids.index_select(0, rows), cand_mask.index_select(0, rows)
        logits = self.decoder(ids, mask, select_kv(kv, q_index), question_mask.index_select(0, q_index))
        nll = sequence_nll(logits, ids, mask).view(b, kk)
        return select_answers(topk, nll, c)

    # -- checkpoints ---------------------------------------------------------------------------

    @staticmethod
    def adapt_pretrained(state: dict[str, torch.Tensor], model: VQAModel) -> tuple[dict[str, torch.Tensor], list[str]]:
        """Turn a vlp pretraining state into a VQA state (ALBEF's decoder initialisation).

        Online and inside ``momentum.twin.``: ``vision.*``, ``text.*`` and ``fusion.*`` are kept;
        ``fusion.layer.{i}.*`` is copied to ``decoder.encoder.layer.{i}.*`` (cross-attention K/V
        too, unless its shape differs because the image width != text hidden size: then those keys
        stay new), ``text.embeddings.*`` to ``decoder.embeddings.*`` and ``mlm_head.*`` to
        ``decoder.lm_head.*``; the tied word embeddings come from whichever tied name was saved.
        ``vision_proj``, ``text_proj``, ``itm_head``, ``temp``, ``queue.*`` and ``mlm_head`` are
        dropped. Any other key raises :class:`CheckpointError` (nothing is dropped silently).

        Returns ``(new_state, allow_missing)``: fnmatch patterns (exact names) of the model keys
        legitimately left new, for :func:`vlp.weights.load_strict`. A state that already has
        ``decoder.*`` keys is a VQA state and is returned unchanged with ``[]``.
        """
        if any(k.startswith("decoder.") for k in state):
            return state, []
        own = model.state_dict()
        twin = "momentum.twin."
        parts = {
            "": {k: v for k, v in state.items() if not k.startswith(twin)},
            twin: {k[len(twin) :]: v for k, v in state.items() if k.startswith(twin)},
        }
        new_state: dict[str, torch.Tensor] = {}
        allow: list[str] = []
        for prefix, part in parts.items():
            adapted = {prefix + k: v for k, v in _adapt_part(part, prefix).items()}
            # image width != text hidden: the decoder's cross-attention K/V Linear (weight and
            # bias) cannot take the fusion layer's, it stays new
            new_kv = {
                k.rsplit(".", 1)[0]
                for k, v in adapted.items()
                if _is_decoder_cross_kv(k) and k in own and tuple(own[k].shape) != tuple(v.shape)
            }
            for k, v in adapted.items():
                if k not in own and k.endswith("position_ids"):
                    continue  # a buffer that is non-persistent in this transformers version
                if k.rsplit(".", 1)[0] in new_kv:
                    allow.append(k)
                    continue
                new_state[k] = v
            if part and not any(k.startswith("mlm_head.") for k in part):  # no MLM head saved
                allow += [
                    k for k in own if k.startswith(prefix + "decoder.lm_head.") and not k.endswith(".decoder.weight")
                ]
        # VQA's (empty) queue buffers, and a position_ids buffer the checkpoint lacks
        allow += [k for k in own if k not in new_state and (k.startswith("queue.") or k.endswith("position_ids"))]
        return new_state, sorted(set(allow))


_DROP = re.compile(r"^(vision_proj|text_proj|itm_head|temp|queue)(\.|$)")
_KEEP = re.compile(r"^(vision|text|fusion)\.")
_CROSS_KV = re.compile(r"(^|\.)decoder\.encoder\.layer\.\d+\.crossattention\.self\.(key|value)\.(weight|bias)$")
_WORD = "embeddings.word_embeddings.weight"


def _is_decoder_cross_kv(key: str) -> bool:
    return bool(_CROSS_KV.search(key))


def _adapt_part(part: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """One model (online, or the momentum twin with its prefix removed): pretraining keys -> VQA keys."""
    out: dict[str, torch.Tensor] = {}
    for k, v in part.items():
        if _KEEP.match(k):
            out[k] = v
            if k.startswith("text.embeddings."):
                out["decoder." + k[len("text.") :]] = v
            elif k.startswith("fusion.layer."):
                out["decoder.encoder." + k[len("fusion.") :]] = v
        elif k.startswith("mlm_head."):
            out["decoder.lm_head." + k[len("mlm_head.") :]] = v
        elif not _DROP.match(k):
            raise CheckpointError(f"adapt_pretrained: unrecognised pretraining key {prefix + k!r}")
    # The tied group (text word embeddings = MLM decoder): whichever name was saved fills every
    # name of the VQA model's groups (text tower; decoder embeddings = LM head decoder).
    word = part.get("text." + _WORD, part.get("mlm_head.decoder.weight"))
    if word is not None:
        for k in ("text." + _WORD, "decoder." + _WORD, "decoder.lm_head.decoder.weight"):
            out[k] = word
    return out
