"""vlp's pretraining step against a straightforward implementation of the same maths.

:class:`ReferenceALBEFStep` is the ALBEF pretraining step (ITC with queue and momentum
distillation, ITM with hard negatives, MLM with distillation) written the way the original
implementation is structured (docs: the project's performance reference, sections 3-4), over the
parameters of a vlp :class:`~vlp.models.albef.ALBEF`:

- the momentum update is a Python loop over parameter pairs at the start of the forward,
  ``p_m.data = p_m.data * m + p.data * (1 - m)``;
- ITC targets are a CPU ``zeros(B, B + Q)`` moved to the device; the queue is written with the
  original's pointer arithmetic (the queue size must be a multiple of the batch);
- ITM runs the fusion encoder on the B positives, then a second fusion forward on the 2B negatives,
  whose image tokens are re-gathered per negative in a Python loop; every fusion pass projects the
  image tokens to cross-attention K/V again; negatives are drawn one row at a time
  (``torch.multinomial`` + ``.item()``);
- MLM evaluates the head (transform + decoder over the vocabulary) at every token position, the
  loss uses ``ignore_index``; the momentum MLM pass likewise; the MLM fusion projects the image
  K/V again;
- attention is eager everywhere (matmul, softmax, dropout, matmul): timm's ``fused_attn=False`` in
  the ViT, transformers' ``eager`` implementation in the text tower, and a hand-written fusion
  forward over vlp's fusion parameters.

It computes the same maths as :class:`vlp.tasks.pretrain.PretrainTask`: with the same weights, batch,
hard negatives and MLM masks the losses agree to float rounding (``tests/test_reference_step.py``).
Single process only; ALBEF's objective as configured by default: all three losses on,
``loss.regulation=none``, ``loss.ltd.mode=off``, InfoNCE, pair positives, the local bank.

The benchmark times full training steps (forward, backward, AdamW, momentum update) of the
reference and of vlp's step as ``vlp pretrain`` runs it (``vlp.runs.training.pretrain.build_pretraining``, the
accelerator, ``vlp.train.step.optimizer_step``), from the same initial weights, interleaved
round-robin (``--steps`` steps each per round) on the same pre-loaded batches. Both run fp32;
``--vlp-precision bf16`` runs vlp under bf16 autocast (``train.precision=bf16``) against the fp32
reference, as the original trains in fp32:

    python scripts/bench/reference_step.py --config configs/pretrain/shapes_tiny.yaml \\
        --world /tmp/w --steps 1 --rounds 12 --flops --out runs/bench/reference_tiny.json
    python scripts/bench/reference_step.py --config configs/pretrain/shapes_tiny.yaml --world /tmp/w \\
        --preset small --steps 1 --rounds 4 --threads 1 data.batch_size=32 model.queue_size=65536

Data loading is excluded from both (batches are fetched before timing). Before timing, one batch is
run through both with vlp's negatives and masks injected into the reference, and the loss
differences are printed (``--no-check`` skips it); ``--flops`` counts the matmul FLOP per pair of
each step with torch's counter. The table gives the median and best round per variant, and the
vlp/reference ratio of each round (the two run back to back). On a shared machine ``--threads 1``
is much steadier than two threads competing with other jobs.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vlp.config import ContrastiveConfig, LossConfig, PretrainConfig, load_config
from vlp.errors import ConfigError
from vlp.models.albef import ALBEF, param_count
from vlp.tasks.objectives import TokenInfo

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reference_eager.py, reference_checks.py

from reference_checks import check_same_maths, count_flops  # noqa: E402
from reference_checks import record_vlp_draws as record_vlp_draws  # noqa: E402,F401 - tests/test_reference_step.py
from reference_eager import fusion_forward, text_forward, use_eager_attention  # noqa: E402

PRESETS = {
    "config": [],
    "small": [
        "model.vision.preset=small",
        "model.text.preset=small",
        "model.text.init=random",
        "model.vision.pretrained=null",
    ],
    "base": [
        "model.vision.preset=base",
        "model.text.preset=base",
        "model.text.init=random",
        "model.vision.pretrained=null",
    ],
}


# --------------------------------------------------------------------------- the reference step


class ReferenceALBEFStep(nn.Module):
    """The ALBEF pretraining step, structured like the original, over ``model``'s parameters.

    ``model`` is switched to eager attention in place: give it its own copy of the weights
    (``copy.deepcopy(vlp_model)``). ``forward(batch, step, negatives=None, mlm=None)`` returns
    ``itc``, ``itm``, ``mlm`` and ``loss``; ``negatives=(neg_img [B], neg_txt [B])`` (a hard image
    per text, a hard text per image) and ``mlm=(masked_ids [B, T], labels [B, T])`` replace the
    step's own draws, so that its losses can be compared with vlp's on identical randomness.
    """

    def __init__(self, model: ALBEF, loss: LossConfig, tokens: TokenInfo, seed: int = 0) -> None:
        super().__init__()
        unsupported = [
            k
            for k, bad in (
                ("loss.regulation", loss.regulation != "none"),
                ("loss.ltd.mode", loss.ltd.mode != "off"),
                # ALBEF's ITC: the default loss (InfoNCE), with the learned temperature
                (
                    "loss.contrastive",
                    loss.contrastive.name != ContrastiveConfig.name or loss.contrastive.tau is not None,
                ),
                ("loss.itc_positives", loss.itc_positives != "pair"),
                ("loss.itc_bank", loss.itc_bank != "local"),
                ("loss.itc/itm/mlm = 0", 0 in (loss.itc, loss.itm, loss.mlm)),
            )
            if bad
        ]
        if unsupported:
            raise ConfigError(f"the reference step implements ALBEF's objective only; unsupported: {unsupported}")
        self.model, self.loss_cfg, self.tokens = model, loss, tokens
        use_eager_attention(model)
        online = nn.ModuleDict(model.momentum_modules())  # same structure and order as the twin
        self.pairs = list(zip(online.parameters(), model.momentum.twin.parameters()))
        self.gen = torch.Generator().manual_seed(seed)

    def alpha(self, step: int) -> float:
        c = self.loss_cfg
        if not c.distill:
            return 0.0
        return c.alpha * min(1.0, step / c.alpha_ramp_steps) if c.alpha_ramp_steps > 0 else c.alpha

    @torch.no_grad()
    def momentum_update(self, m: float) -> None:
        """One EMA step, one parameter pair at a time."""
        for p, p_m in self.pairs:
            p_m.data = p_m.data * m + p.data * (1.0 - m)

    # -- the objective, top to bottom ------------------------------------------------------------

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        step: int = 0,
        negatives: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        mlm: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> dict[str, torch.Tensor]:
        md, c = self.model, self.loss_cfg
        image, ids, att = batch["images"], batch["input_ids"], batch["attention_mask"]
        alpha = self.alpha(step)
        with torch.no_grad():
            md.temp.clamp_(0.001, 0.5)

        image_embeds = md.vision.forward_features(image)
        image_feat = F.normalize(md.vision_proj(image_embeds[:, 0, :]), dim=-1)
        text_embeds = text_forward(md.text, ids, att)
        text_feat = F.normalize(md.text_proj(text_embeds[:, 0, :]), dim=-1)
        loss_itc, sim_i2t, sim_t2i, image_embeds_m = self.itc_loss(batch, image_feat, text_feat, step, alpha)
        loss_itm = self.itm_loss(batch, image_embeds, text_embeds, sim_i2t, sim_t2i, negatives)
        loss_mlm = self.mlm_loss(ids, att, image_embeds, image_embeds_m, alpha, mlm)
        loss = c.itc * loss_itc + c.itm * loss_itm + c.mlm * loss_mlm
        return {"loss": loss, "itc": loss_itc, "itm": loss_itm, "mlm": loss_mlm}

    def itc_loss(
        self, batch: dict[str, torch.Tensor], image_feat: torch.Tensor, text_feat: torch.Tensor, step: int, alpha: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """ITC with momentum features, queues and momentum distillation (the momentum update first, the
        batch's momentum features enqueued last) -> (loss, sim_i2t [B, B + Q], sim_t2i [B, B + Q], the
        momentum ViT's image tokens [B, N, W])."""
        md, tw = self.model, self.model.momentum
        image, ids, att, image_ids = batch["images"], batch["input_ids"], batch["attention_mask"], batch["image_ids"]
        with torch.no_grad():
            self.momentum_update(md.momentum_at(step))  # = vlp's update after the previous step
            image_embeds_m = tw["vision"].forward_features(image)
            image_feat_m = F.normalize(tw["vision_proj"](image_embeds_m[:, 0, :]), dim=-1)
            image_feat_all = torch.cat([image_feat_m, md.queue.image.clone().detach()], dim=0)
            text_out_m = text_forward(tw["text"], ids, att)
            text_feat_m = F.normalize(tw["text_proj"](text_out_m[:, 0, :]), dim=-1)
            text_feat_all = torch.cat([text_feat_m, md.queue.text.clone().detach()], dim=0)
            sim_i2t_m = image_feat_m @ text_feat_all.t() / md.temp
            sim_t2i_m = text_feat_m @ image_feat_all.t() / md.temp
            sim_targets = torch.zeros(sim_i2t_m.size())  # on the CPU, then copied over
            sim_targets.fill_diagonal_(1)
            sim_targets = sim_targets.to(image.device)
            sim_i2t_targets = alpha * F.softmax(sim_i2t_m, dim=1) + (1 - alpha) * sim_targets
            sim_t2i_targets = alpha * F.softmax(sim_t2i_m, dim=1) + (1 - alpha) * sim_targets
        sim_i2t = image_feat @ text_feat_all.t() / md.temp
        sim_t2i = text_feat @ image_feat_all.t() / md.temp
        loss_i2t = -torch.sum(F.log_softmax(sim_i2t, dim=1) * sim_i2t_targets, dim=1).mean()
        loss_t2i = -torch.sum(F.log_softmax(sim_t2i, dim=1) * sim_t2i_targets, dim=1).mean()
        loss_itc = (loss_i2t + loss_t2i) / 2
        self.enqueue(image_feat_m, text_feat_m, image_ids)
        return loss_itc, sim_i2t, sim_t2i, image_embeds_m

    def itm_loss(
        self,
        batch: dict[str, torch.Tensor],
        image_embeds: torch.Tensor,
        text_embeds: torch.Tensor,
        sim_i2t: torch.Tensor,
        sim_t2i: torch.Tensor,
        negatives: Optional[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """ITM: the positives, then the hard negatives (drawn here unless given) in a second fusion
        forward -> the loss over the rows that have a negative (a scalar)."""
        md = self.model
        image, att, image_ids = batch["images"], batch["attention_mask"], batch["image_ids"]
        bs = image.size(0)
        output_pos = fusion_forward(md.fusion, text_embeds, att, image_embeds)
        if negatives is None:
            with torch.no_grad():
                neg_img = self.sample_negatives(sim_t2i[:, :bs], image_ids)
                neg_txt = self.sample_negatives(sim_i2t[:, :bs], image_ids)
        else:
            neg_img, neg_txt = (n.tolist() for n in negatives)
        image_embeds_neg = torch.stack([image_embeds[neg_img[b]] for b in range(bs)], dim=0)
        text_embeds_neg = torch.stack([text_embeds[neg_txt[b]] for b in range(bs)], dim=0)
        text_atts_neg = torch.stack([att[neg_txt[b]] for b in range(bs)], dim=0)
        text_embeds_all = torch.cat([text_embeds, text_embeds_neg], dim=0)
        text_atts_all = torch.cat([att, text_atts_neg], dim=0)
        image_embeds_all = torch.cat([image_embeds_neg, image_embeds], dim=0)
        output_neg = fusion_forward(md.fusion, text_embeds_all, text_atts_all, image_embeds_all)
        vl_embeddings = torch.cat([output_pos[:, 0, :], output_neg[:, 0, :]], dim=0)
        vl_output = md.itm_head(vl_embeddings)
        itm_labels = torch.cat([torch.ones(bs, dtype=torch.long), torch.zeros(2 * bs, dtype=torch.long)], dim=0).to(
            image.device
        )
        # A row whose every batch item shares the anchor's image has no negative: it is left out
        # (its "negative" is the anchor itself, a positive).
        valid = torch.cat(
            [torch.ones(bs, dtype=torch.bool), self.has_negative(image_ids), self.has_negative(image_ids)]
        ).to(image.device)
        ce = F.cross_entropy(vl_output, itm_labels, reduction="none")
        return ce[valid].mean()

    def mlm_loss(
        self,
        ids: torch.Tensor,
        att: torch.Tensor,
        image_embeds: torch.Tensor,
        image_embeds_m: torch.Tensor,
        alpha: float,
        mlm: Optional[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """MLM through all the text and fusion layers with cross-attention, the head at every position
        (masks drawn here unless given), distilled from the momentum model -> the loss (a scalar)."""
        md, c, tw = self.model, self.loss_cfg, self.model.momentum
        if mlm is None:
            masked_ids, labels = self.mask(ids, att)
        else:
            masked_ids, labels = mlm
        text_mlm = text_forward(md.text, masked_ids, att)
        fused = fusion_forward(md.fusion, text_mlm, att, image_embeds)
        prediction_scores = md.mlm_head(fused)  # [B, T, V]
        vocab = prediction_scores.shape[-1]
        if c.distill:
            with torch.no_grad():
                text_mlm_m = text_forward(tw["text"], masked_ids, att)
                fused_m = fusion_forward(tw["fusion"], text_mlm_m, att, image_embeds_m)
                soft_labels = F.softmax(tw["mlm_head"](fused_m), dim=-1)
        selected = labels != -100
        if bool(selected.any()):
            loss_mlm = F.cross_entropy(prediction_scores.view(-1, vocab), labels.view(-1), ignore_index=-100)
            if c.distill:
                loss_distill = -torch.sum(F.log_softmax(prediction_scores, dim=-1) * soft_labels, dim=-1)
                loss_mlm = (1 - alpha) * loss_mlm + alpha * loss_distill[selected].mean()
        else:  # nothing masked in this batch
            loss_mlm = prediction_scores.sum() * 0.0
        return loss_mlm

    # -- the pieces ------------------------------------------------------------------------------

    @torch.no_grad()
    def enqueue(self, image_feat: torch.Tensor, text_feat: torch.Tensor, image_ids: torch.Tensor) -> None:
        q = self.model.queue
        if q.size == 0:
            return
        batch_size = image_feat.shape[0]
        ptr = int(q.ptr)
        assert q.size % batch_size == 0  # the original's pointer arithmetic
        q.image[ptr : ptr + batch_size, :] = image_feat
        q.text[ptr : ptr + batch_size, :] = text_feat
        q.ids[ptr : ptr + batch_size] = image_ids
        q.ptr[0] = (ptr + batch_size) % q.size

    @staticmethod
    def has_negative(image_ids: torch.Tensor) -> torch.Tensor:
        """[B] bool: some other batch item shows a different image."""
        return (image_ids[:, None] != image_ids[None, :]).any(1)

    @torch.no_grad()
    def sample_negatives(self, sim: torch.Tensor, image_ids: torch.Tensor) -> list[int]:
        """One hard negative per row of ``sim`` [B, B], ``softmax`` over the row's valid negatives
        (other images), one ``multinomial`` and one ``.item()`` per row."""
        out = []
        for b in range(sim.shape[0]):
            invalid = image_ids == image_ids[b]
            if bool(invalid.all()):
                out.append(b)  # no negative: ignored by the loss
                continue
            weights = F.softmax(sim[b].masked_fill(invalid, float("-inf")), dim=0)
            out.append(torch.multinomial(weights, 1, generator=self.gen).item())
        return out

    @torch.no_grad()
    def mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """BERT masking: tokens (not padding, not special) selected with ``mlm_probability``; of
        those 80% -> [MASK], 10% -> a random token, 10% kept. Returns (masked ids, labels)."""
        g, t = self.gen, self.tokens
        ids = input_ids.clone()
        labels = input_ids.clone()
        probability = torch.full(ids.shape, self.loss_cfg.mlm_probability)
        for special in t.special_ids:
            probability[input_ids.cpu() == special] = 0.0
        probability[attention_mask.cpu() == 0] = 0.0
        masked = torch.bernoulli(probability, generator=g).bool().to(ids.device)
        labels[~masked] = -100
        replaced = torch.bernoulli(torch.full(ids.shape, 0.8), generator=g).bool().to(ids.device) & masked
        ids[replaced] = t.mask_id
        rand = torch.bernoulli(torch.full(ids.shape, 0.5), generator=g).bool().to(ids.device) & masked & ~replaced
        words = torch.randint(t.vocab_size, ids.shape, generator=g, dtype=ids.dtype).to(ids.device)
        ids[rand] = words[rand]
        return ids, labels


# --------------------------------------------------------------------------- benchmark


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/pretrain/shapes_tiny.yaml")
    p.add_argument("--world", help="shapes world directory for data.train (generated with 600 images if missing)")
    p.add_argument(
        "--preset",
        default="config",
        choices=list(PRESETS),
        help="model size: the config's, or small/base towers with random init",
    )
    p.add_argument("--steps", type=int, default=3, help="steps per variant per round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant")
    p.add_argument("--batches", type=int, default=4, help="distinct batches, fetched before timing and cycled")
    p.add_argument("--variants", nargs="+", default=["reference", "vlp"], choices=["reference", "vlp"])
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--no-check", action="store_true", help="skip the same-maths check before timing")
    p.add_argument("--flops", action="store_true", help="count the matmul FLOP of one step of each (torch's counter)")
    p.add_argument(
        "--vlp-precision",
        default="fp32",
        choices=["fp32", "bf16"],
        help="vlp's train.precision (the reference is always fp32, like the original)",
    )
    p.add_argument("--out")
    p.add_argument("overrides", nargs="*", help="dotted config overrides (model.queue_size=4096 ...)")
    return p.parse_args(argv)


def bench_config(a: argparse.Namespace) -> PretrainConfig:
    """The pretraining config of the benchmark: ``--config`` with the preset, the world (generated when
    missing) and the overrides; vlp's precision, and enough steps for the lr schedule to span the run."""
    overrides = list(PRESETS[a.preset])
    if a.world:
        world = Path(a.world)
        if not (world / "pretrain.json").exists():
            from vlp.world import generate_world

            generate_world(
                world, seed=0, n_train=600, n_val=0, n_test=0, progress=False, vqa_per_image=0, nlvr_per_image=0
            )
        overrides.append(f"data.train=[{world / 'pretrain.json'}]")
    overrides += ["data.num_workers=0", "train.progress=false", *a.overrides]
    cfg = load_config(PretrainConfig, a.config, overrides)
    if cfg.model.arch != "albef":
        raise ConfigError("the reference step is ALBEF only (model.arch=albef)")
    cfg.train.precision = a.vlp_precision  # vlp's accelerator; the reference runs fp32 outside it
    cfg.train.steps = max(cfg.train.steps, a.warmup + a.steps * a.rounds)  # the lr schedule spans the benchmark
    return cfg


class Bench:
    """vlp's step as ``vlp pretrain`` runs it (accelerator, optimizer step) and the reference step with
    its own AdamW, from the same initial weights, on the accelerator's device."""

    def __init__(self, cfg: PretrainConfig) -> None:
        # the training stack (accelerate etc.) only for the benchmark, not for importing the step
        from vlp.runs.training.pretrain import build_pretraining
        from vlp.train.optim import build_optimizer
        from vlp.train.setup import apply_train_options

        self.cfg = cfg
        self.run = run = build_pretraining(cfg)
        self.ref = ReferenceALBEFStep(copy.deepcopy(run.model), cfg.loss, run.task.tokens, cfg.train.seed)
        self.acc = run.accelerator()
        apply_train_options(run.task, cfg.train)
        opt_vlp = build_optimizer(run.task, cfg.train)
        self.task, self.opt_vlp = self.acc.prepare(run.task, opt_vlp)
        self.inner = self.acc.unwrap_model(self.task)
        self.params_vlp = [q for g in self.opt_vlp.param_groups for q in g["params"]]
        self.opt_ref = build_optimizer(self.ref, cfg.train)
        self.params_ref = [q for g in self.opt_ref.param_groups for q in g["params"]]
        self.device = self.acc.device
        self.ref.to(self.device)

    def sync(self) -> float:
        """``time.perf_counter()`` after the device's queued work has finished."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def step_vlp(self, step: int, batch: dict) -> None:
        """One training step of vlp's task: lr, forward, backward, ``optimizer_step``."""
        from vlp.train.step import optimizer_step, set_lr

        set_lr(self.opt_vlp, step, self.cfg.train)
        loss = self.task(batch, step=step)["loss"]
        self.acc.backward(loss)
        optimizer_step(self.acc, self.opt_vlp, self.inner, self.params_vlp, step, self.cfg.train)

    def step_ref(self, step: int, batch: dict) -> None:
        """One training step of the reference: lr, forward, backward, gradient clipping, AdamW."""
        from vlp.train.step import set_lr

        set_lr(self.opt_ref, step, self.cfg.train)
        self.ref(batch, step=step)["loss"].backward()
        if self.cfg.train.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.params_ref, self.cfg.train.grad_clip)
        self.opt_ref.step()
        self.opt_ref.zero_grad(set_to_none=True)

    def batches(self, a: argparse.Namespace) -> list[dict[str, torch.Tensor]]:
        """The first ``--batches`` batches of the loader on the device (exits when the world has fewer)."""
        run = self.run
        if len(run.loader) < a.batches:
            raise SystemExit(
                f"reference_step.py: --world {a.world} gives {len(run.loader)} batches of "
                f"{self.cfg.data.batch_size}, fewer than --batches {a.batches}; use a larger world (or a new "
                "--world folder, which is generated at the right size)"
            )
        it = iter(run.loader)
        return [{k: v.to(self.device) for k, v in next(it).items()} for _ in range(a.batches)]


def checks_before_timing(
    a: argparse.Namespace, bench: Bench, batch: dict[str, torch.Tensor]
) -> tuple[Optional[dict], Optional[dict]]:
    """The FLOP count (``--flops``) and the same-maths check (fp32, unless ``--no-check``) on one batch,
    printed -> (the check's |differences| or None, the FLOP per pair or None)."""
    check = flops = None
    if a.flops:
        flops = count_flops(bench.inner, bench.ref, batch, a.warmup)
        print(
            "GFLOP per pair (one forward + backward, matmuls): "
            + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in flops.items())
            + f", ratio {flops['reference'] / flops['vlp']:.2f}"
        )
    if a.vlp_precision != "fp32":
        print("vlp runs bf16: the same-maths check (fp32) is skipped")
    elif not a.no_check:
        check = check_same_maths(bench.inner, bench.ref, batch, a.warmup)
        print(
            "same maths, |vlp - reference| on one batch with vlp's draws injected: "
            + ", ".join(f"{k} {v:.1e}" for k, v in check.items())
        )
    return check, flops


def time_variants(a: argparse.Namespace, bench: Bench, batches: list[dict]) -> dict[str, dict[str, Any]]:
    """``--warmup`` untimed steps per variant, then ``--rounds`` rounds of ``--steps`` steps each (the
    order rotated each round) -> {variant: {"step": next step, "times": seconds per step per round}}."""
    fns = {"reference": bench.step_ref, "vlp": bench.step_vlp}
    state: dict[str, dict[str, Any]] = {name: {"step": 0, "times": []} for name in a.variants}
    bench.task.train()
    bench.ref.train()

    def run_steps(name: str, n: int) -> float:
        s = state[name]
        t0 = bench.sync()
        for _ in range(n):
            fns[name](s["step"], batches[s["step"] % len(batches)])
            s["step"] += 1
        return bench.sync() - t0

    for name in a.variants:
        run_steps(name, a.warmup)
    for r in range(a.rounds):
        order = a.variants[r % len(a.variants) :] + a.variants[: r % len(a.variants)]
        for name in order:
            state[name]["times"].append(run_steps(name, a.steps) / a.steps)
    return state


def report_variants(
    state: dict[str, dict[str, Any]], pairs_per_step: int, flops: Optional[dict], result: dict[str, Any]
) -> None:
    """Each variant's median and best ms per step, pairs/s (and GFLOP/s with ``--flops``) into
    ``result`` and the printed table."""
    print(f"{'variant':12s} {'ms/step':>9s} {'best':>9s} {'pairs/s':>8s} {'pairs/s over rounds':>20s}")
    for name, s in state.items():
        med, best = statistics.median(s["times"]), min(s["times"])
        rates = [pairs_per_step / t for t in s["times"]]
        result["ms_per_step"][name] = 1000 * med
        result.setdefault("ms_per_step_best", {})[name] = 1000 * best
        result["ms_per_step_rounds"][name] = [1000 * t for t in s["times"]]
        result["pairs_per_s"][name] = pairs_per_step / med
        result["pairs_per_s_range"][name] = [min(rates), max(rates)]
        gf = ""
        if flops:  # at the first batch's text length
            result.setdefault("achieved_gflop_per_s", {})[name] = flops[name] * pairs_per_step / med / 1e9
            gf = f"   {result['achieved_gflop_per_s'][name]:.1f} GFLOP/s"
        print(
            f"{name:12s} {1000 * med:9.1f} {1000 * best:9.1f} {pairs_per_step / med:8.1f} "
            f"{min(rates):11.1f} - {max(rates):.1f}{gf}"
        )


def report_speedup(state: dict[str, dict[str, Any]], result: dict[str, Any]) -> None:
    """vlp's throughput over the reference's (medians, best rounds, per round) into ``result``, printed."""
    ref_t, vlp_t = state["reference"]["times"], state["vlp"]["times"]
    per_round = [tr / tv for tr, tv in zip(ref_t, vlp_t)]  # each round's two figures are adjacent in time
    result["speedup"] = statistics.median(ref_t) / statistics.median(vlp_t)
    result["speedup_best"] = min(ref_t) / min(vlp_t)
    result["speedup_per_round"] = per_round
    result["speedup_per_round_median"] = statistics.median(per_round)
    print(
        f"vlp / reference throughput: {result['speedup']:.2f}x (medians), {result['speedup_best']:.2f}x (best "
        f"rounds), per round median {statistics.median(per_round):.2f}x, range {min(per_round):.2f}-"
        f"{max(per_round):.2f}x"
    )


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = bench_config(a)
    bench = Bench(cfg)
    device = bench.device
    batches = bench.batches(a)
    pairs_per_step = len(batches[0]["input_ids"])
    check, flops = checks_before_timing(a, bench, batches[0])
    state = time_variants(a, bench, batches)
    result: dict[str, Any] = {
        "date": date.today().isoformat(),
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "args": vars(a),
        "pairs_per_step": pairs_per_step,
        "trainable_params_m": param_count(bench.run.model) / 1e6,
        "image_size": cfg.model.vision.img_size,
        "text_len": [int(b["input_ids"].shape[1]) for b in batches],
        "queue_size": cfg.model.queue_size,
        "vlp_precision": a.vlp_precision,
        "torch": torch.__version__,
        "same_maths_abs_diff": check,
        "gflop_per_pair": {k: v / 1e9 for k, v in flops.items()} if flops else None,
        "ms_per_step": {},
        "ms_per_step_rounds": {},
        "pairs_per_s": {},
        "pairs_per_s_range": {},
    }
    print(
        f"{pairs_per_step} pairs per step, {result['trainable_params_m']:.1f}M trainable parameters, "
        f"{a.rounds} rounds x {a.steps} steps, {result['device']}"
    )
    report_variants(state, pairs_per_step, flops, result)
    if len(state) == 2:
        report_speedup(state, result)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    from vlp.console import show_logs

    show_logs()  # vlp's log records printed as `vlp` prints them
    sys.exit(main())
