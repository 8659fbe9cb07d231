"""ALBEF pretraining task: ITC (queue + momentum distillation) + ITM (hard negatives) + MLM."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Optional

import torch

from vlp.config import LossConfig
from vlp.dist import all_gather_nograd, world_size
from vlp.errors import ConfigError
from vlp.losses.registry import build_loss
from vlp.models.albef import ALBEF, TextFeatures
from vlp.models.text import ImageKV, select_kv
from vlp.tasks.base import Task
from vlp.tasks.objectives import (
    ITMPairs,
    MaskedText,
    TokenInfo,
    draw_masks,
    enqueue,
    global_batch_sims,
    itc_step,
    itm_loss_at,
    itm_noise,
    itm_pairs,
    mlm_loss_at,
    pair_kv,
)
from vlp.tasks.reconstruction import Reconstruction
from vlp.tasks.regulation import SRCLRegulator


@dataclass
class StepDraws:
    """The random draws of a pretraining step (:meth:`PretrainTask.draws`)."""

    masks: Optional[MaskedText]  # MLM's masked captions and labels (None without MLM)
    negatives: Optional[tuple[torch.Tensor, torch.Tensor]]  # ITM's races (:func:`itm_noise`), None without ITM


class PretrainTask(Task):
    """Model + losses in one module: ``forward(batch, step)`` returns a dict with ``loss``.

    ``batch``: ``images`` [B, 3, H, W], ``input_ids``/``attention_mask`` [B, T], ``image_ids`` [B].
    ``max_len``: the tokenizer's truncation length (MLM masks are drawn for [B, max_len], so they do
    not depend on the padding); ``text_padding``: the loader's ``data.text_padding`` (the global
    ITM/MLM modes need ``max_len`` across processes).
    """

    model: ALBEF

    def __init__(
        self,
        model: ALBEF,
        loss: LossConfig,
        tokens: TokenInfo,
        seed: int = 0,
        regulator: Optional[SRCLRegulator] = None,
        reconstruction: Optional[Reconstruction] = None,
        max_len: Optional[int] = None,
        text_padding: str = "longest",
    ) -> None:
        super().__init__(
            model,
            reconstruction,
            alpha=loss.alpha,
            alpha_ramp_steps=loss.alpha_ramp_steps,
            distill=loss.distill,
            seed=seed,
        )
        if (loss.regulation != "none") != (regulator is not None):
            raise ValueError(f"loss.regulation={loss.regulation!r} needs exactly one SRCLRegulator")
        self.regulator = regulator
        self.loss_cfg = loss
        self.contrastive = build_loss(loss.contrastive)
        self.tokens = tokens
        self.max_len, self.text_padding = max_len, text_padding
        self._compiled: Optional[Callable[..., dict[str, torch.Tensor]]] = None  # train.compile=full
        self._cuda_graphs = False  # ... replayed as CUDA graphs (train.cuda_graphs)
        # the context of the compiled graph's call, by phase name "graph" (vlp bench --count-ops lifts its
        # counter there: the eager work before the graph in the forward is counted, the graph is not)
        self.graph_phase: Callable[[str], ContextManager[None]] = lambda name: contextlib.nullcontext()

    def log_warnings(self, record: dict[str, Any]) -> list[str]:
        """Warnings about a log record (the training loop prints them): SRCL that hardly regulates."""
        msg = self.regulator.check_log(record) if self.regulator is not None else None
        return [msg] if msg else []

    def unused_parameters(self) -> list[str]:
        """Parameters this configuration's objective never reaches (the loop freezes them, so DDP
        needs no ``find_unused_parameters``): the learned temperature under a fixed
        ``loss.contrastive.tau`` or a loss that takes none (``uses_tau``: the zoo ranks cosines), the ITM / MLM head of a
        zero-weight loss (not computed), the fusion encoder when neither runs.
        ``tests/tasks/test_unused_parameters.py`` checks that every other parameter gets a gradient."""
        c = self.loss_cfg
        prefixes = []
        if c.contrastive.tau is not None or not self.contrastive.uses_tau:
            prefixes.append("model.temp")
        if not c.itm:
            prefixes.append("model.itm_head.")
        if not c.mlm:
            prefixes.append("model.mlm_head.")
        if not c.itm and not c.mlm:
            prefixes.append("model.fusion.")
        return [
            n
            for n, p in self.named_parameters()
            if p.requires_grad and any(n == q or (q.endswith(".") and n.startswith(q)) for q in prefixes)
        ]

    def _check_text_gathers(self) -> None:
        """Global ITM/MLM gather text: refuse rank-dependent lengths before the first collective
        (every rank raises the same error, no hang)."""
        keys = [f"loss.{k}" for k in ("itm_negatives", "mlm_masking") if getattr(self.loss_cfg, k) == "global"]
        if keys and world_size() > 1 and self.text_padding != "max_len":
            modes = " and ".join(f"{k}=global" for k in keys)
            verb = "gathers" if len(keys) == 1 else "gather"
            raise ConfigError(
                f"config keys {'/'.join(repr(k) for k in keys)}/'data.text_padding': {modes} {verb} "
                f"text from every rank, so on {world_size()} processes every rank's text must have "
                f"the same length: set data.text_padding=max_len (got {self.text_padding})"
            )

    def _text(
        self, ids: torch.Tensor, mask: torch.Tensor, draw: Optional[MaskedText], momentum: bool
    ) -> tuple[TextFeatures, Optional[torch.Tensor]]:
        """Text features of the captions, and the text states of the masked captions when MLM
        needs them: one text pass over both."""
        if draw is None:
            return self.model.encode_text(ids, mask, momentum), None
        return self.model.encode_text_and_masked(ids, draw.ids, mask, momentum)

    def _fuse(
        self, kv: Optional[ImageKV], pairs: Optional[ITMPairs], h_masked: Optional[torch.Tensor], mask: torch.Tensor
    ) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """The fused states of the ITM pairs [3B, T, H] and of the masked captions [B, T, H], in one
        pass of the fusion layers over their 4B rows (the masked captions attend to their own
        images). With local negatives the rows index the batch's K/V; with global negatives, whose
        K/V are projected from gathered tokens, the batch's K/V are appended to the pairs'."""
        m = self.model
        if kv is None or (pairs is None and h_masked is None):
            return None, None
        if pairs is None:
            return None, m.fuse(h_masked, mask, kv)
        if h_masked is None:
            return m.fuse(pairs.hidden, pairs.mask, pair_kv(pairs, kv)), None
        b3 = pairs.hidden.shape[0]
        if pairs.kv_index is not None:
            own = torch.arange(h_masked.shape[0], device=h_masked.device)
            rows_kv = select_kv(kv, torch.cat([pairs.kv_index, own]))
        else:
            rows_kv = [(torch.cat([k_p, k]), torch.cat([v_p, v])) for (k_p, v_p), (k, v) in zip(pair_kv(pairs, kv), kv)]
        fused = m.fuse(torch.cat([pairs.hidden, h_masked]), torch.cat([pairs.mask, mask]), rows_kv)
        return fused[:b3], fused[b3:]

    def forward(self, batch: dict[str, torch.Tensor], step: int = 0) -> dict[str, torch.Tensor]:
        """The step's losses and statistics (0-d tensors; ``loss`` the weighted sum)."""
        m, c = self.model, self.loss_cfg
        batch = self.on_device(batch)
        self._check_text_gathers()
        m.clamp_temp()
        draws = self.draws(batch, step)
        alpha = self.alpha(step)
        distill_mlm = draws.masks is not None and alpha > 0
        if self._compiled is not None:  # train.compile=full: alpha enters as a tensor, no per-step guard
            alpha_in: float | torch.Tensor = torch.full((), alpha, device=batch["images"].device)
            distill_mlm = draws.masks is not None and c.distill  # the graph does not change at alpha 0
            losses = self._compiled
            if self._cuda_graphs:  # a new step: the graphs' earlier outputs may be overwritten
                torch.compiler.cudagraph_mark_step_begin()
        else:
            alpha_in, losses = alpha, self._losses
        with m.momentum.lowered():  # bf16 copies of the twin's weights under a bf16 autocast
            if self._compiled is None:
                return losses(batch, draws, alpha_in, distill_mlm, step)
            with self.graph_phase("graph"):
                return losses(batch, draws, alpha_in, distill_mlm, step)

    def draws(self, batch: dict[str, torch.Tensor], step: int) -> StepDraws:
        """Every random draw of the step, made before the encoders run (outside a compiled graph):
        the MLM masks, then the ITM negatives' exponential races, from the task's generators."""
        c = self.loss_cfg
        images, ids, mask = batch["images"], batch["input_ids"], batch["attention_mask"]
        gen, shared = self.generator(images.device, step), self.shared_generator(images.device, step)
        masks = negatives = None
        if c.mlm:
            global_mlm = c.mlm_masking == "global"
            slots = "fixed" if self._compiled is not None else c.mlm_slots
            gen_mlm = shared if global_mlm else gen
            masks = draw_masks(ids, mask, self.tokens, c.mlm_probability, gen_mlm, self.max_len, global_mlm, slots)
        if c.itm:
            global_itm = c.itm_negatives == "global"
            rows = ids.shape[0] * (world_size() if global_itm else 1)
            negatives = itm_noise(rows, images.device, shared if global_itm else gen)
        return StepDraws(masks, negatives)

    def compile_full(self, backend: str = "inductor", mode: Optional[str] = None) -> None:
        """``train.compile=full``: the step's forward (online and twin encoders, losses, queue
        writes) as one compiled graph. Its random draws are made before it (:meth:`draws`), alpha
        enters as a tensor, the text has a fixed length (``data.text_padding=max_len``) and the
        masked tokens fixed slots, so neither the warm-up nor the ramps recompile it. ``mode``:
        torch.compile's (``reduce-overhead``: CUDA graphs)."""
        unsupported = [
            k
            for k, bad in (
                ("loss.regulation", self.regulator is not None),
                ("loss.ltd.mode", self.reconstruction is not None),
                ("data.text_padding (needs max_len)", self.text_padding != "max_len"),
                ("loss.mlm_slots=exact", self.loss_cfg.mlm_slots == "exact"),
            )
            if bad
        ]
        if unsupported:
            raise ConfigError(
                f"config key 'train.compile': 'full' compiles the ALBEF objective with a fixed text "
                f"length; unsupported here: {unsupported} (train.compile=blocks works with all of them)"
            )
        self._compiled = torch.compile(self._losses, backend=backend, mode=mode, fullgraph=True, dynamic=False)
        self._cuda_graphs = mode == "reduce-overhead"

    def _losses(
        self,
        batch: dict[str, torch.Tensor],
        draws: StepDraws,
        alpha: float | torch.Tensor,
        distill_mlm: bool,
        step: int,
    ) -> dict[str, torch.Tensor]:
        m, c = self.model, self.loss_cfg
        images, ids, mask, image_ids = batch["images"], batch["input_ids"], batch["attention_mask"], batch["image_ids"]
        draw = draws.masks
        img = m.encode_image(images)
        txt, h_masked = self._text(ids, mask, draw, momentum=False)
        with torch.no_grad():
            img_m = m.encode_image(images, momentum=True)
            txt_m, h_masked_m = self._text(ids, mask, draw if distill_mlm else None, momentum=True)
        out: dict[str, torch.Tensor] = {}
        reg, helper, regulate = self.regulator, None, None
        if reg is not None:
            helper = reg.helper_features(batch, step)

            def regulate(cos_i2t, cos_t2i, pos, same):
                return reg.regulate(cos_i2t, cos_t2i, pos, same, helper, step)

        itc = itc_step(
            m,
            img,
            txt,
            img_m.feat,
            txt_m.feat,
            image_ids,
            alpha,
            c.itc_positives,
            regulate,
            c.contrastive,
            global_bank=c.itc_bank == "global",
            loss_fn=self.contrastive,
        )
        kv = m.image_kv(img.tokens) if c.itm or c.mlm else None  # cross-attention K/V once, for ITM and MLM
        out["itc"] = itc.loss
        pairs = None
        if c.itm and c.itm_negatives == "global":  # negatives from the global batch, drawn alike on every rank
            sims = global_batch_sims(img.feat, txt.feat, img_m.feat, txt_m.feat, itc.temp)
            ids_all = all_gather_nograd(image_ids)
            pairs = itm_pairs(
                m,
                txt,
                *sims,
                ids_all,
                None,
                img.tokens,
                global_batch=True,
                hardness=c.itm_hardness,
                noise=draws.negatives,
            )
        elif c.itm:
            sims = itc.sim_i2t[:, itc.batch_cols].detach(), itc.sim_t2i[:, itc.batch_cols].detach()
            pairs = itm_pairs(m, txt, *sims, image_ids, None, hardness=c.itm_hardness, noise=draws.negatives)
        fused_itm, fused_mlm = self._fuse(kv, pairs, h_masked, mask)
        if pairs is not None:
            out["itm"] = itm_loss_at(m, fused_itm, pairs)
        if draw is not None:
            fused_m = None
            if distill_mlm:
                with torch.no_grad():
                    fused_m = m.fuse(h_masked_m, mask, img_m.tokens, momentum=True)
            out["mlm"] = mlm_loss_at(m, fused_mlm, fused_m, draw, alpha)
        weights = dict(itc=c.itc, itm=c.itm, mlm=c.mlm)
        out["loss"] = sum(weights[k] * v for k, v in out.items())
        if self.reconstruction is not None:
            out["loss"], stats = self.reconstruction(out["loss"], txt.feat, batch)
            out.update(stats)
        enqueue(m, image_ids, img_m.feat, txt_m.feat)
        if reg is not None:
            reg.enqueue(image_ids, helper)  # same step, same slots as the momentum queue
        out.update(itc.stats)
        out["temp"] = m.temp.detach()
        # a fill, not a copy from host memory
        out["alpha"] = alpha.float() if isinstance(alpha, torch.Tensor) else torch.full((), alpha, device=images.device)
        return out
