"""The pretraining run config: every section, and the rules that tie sections together."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vlp.config.data import DataConfig
from vlp.config.load import reject_broken_rules
from vlp.config.loss import LossConfig, LossTraits, known_loss_traits, loss_traits
from vlp.config.model import ARCH_ALBEF, ARCH_DUAL, ModelConfig
from vlp.config.train import EvalConfig, TrainConfig


@dataclass
class PretrainConfig:
    output_dir: str = "runs/pretrain"
    # Start from the weights of an earlier vlp checkpoint (folder or run directory) instead of the
    # model's initialisation: a warmed-up model that later runs continue with other settings (a
    # queue, another loss). Queues of another size start empty, the momentum twin is copied from the
    # loaded online weights when the checkpoint has none; optimizer and step start fresh (unlike resume).
    init_from: Optional[str] = None
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        """Cross-section rules; each names the keys to change."""
        c, arch = self.loss, self.model.arch
        wrong: list[str] = []
        if self.train.epochs is not None:  # pretraining runs train.steps; epochs would be ignored
            wrong.append(f"train.epochs={self.train.epochs} (fine-tuning only: pretraining runs train.steps)")
        if self.train.eval_every and not self.data.eval:
            wrong.append(
                f"train.eval_every={self.train.eval_every} with data.eval unset (it evaluates data.eval: set "
                "data.eval to a retrieval split, or train.eval_every=0)"
            )
        if arch == ARCH_DUAL:
            wrong += [
                f"loss.{k}={getattr(c, k)} (the dual encoder has no fusion, ITM or MLM)"
                for k in ("itm", "mlm")
                if getattr(c, k) != 0
            ]
            wrong += ["loss.distill=true (the dual encoder has no momentum twin)"] if c.distill else []
            wrong += [f"eval.score={self.eval.score} (no ITM head: use itc)"] if self.eval.score != "itc" else []
        elif self.data.captions_per_image > 1:
            wrong.append(
                f"data.captions_per_image={self.data.captions_per_image} (image-level batches need model.arch=dual)"
            )
        traits = known_loss_traits(c.contrastive)  # an unknown loss: check_given / the build say so
        wrong += self.loss_rules(traits) if traits is not None else []
        if c.ltd.mode != "off" and c.ltd.decoder == "latent" and not c.ltd.targets:
            wrong.append("loss.ltd.targets unset (LTD needs a file from `vlp make-targets`)")
        reject_broken_rules(wrong)

    def check_given(self, given: dict[str, str]) -> None:
        """A config loaded from a file and overrides (``given``: the keys they set, unused): its contrastive
        loss checked in full once the losses are imported, an unknown ``loss.contrastive.name`` or a
        bad ``loss.contrastive.params`` key raising ConfigError. Returns nothing."""
        traits = loss_traits(self.loss.contrastive)
        if traits is not None:
            self.check_loss(traits)

    def loss_rules(self, loss: LossTraits) -> list[str]:
        """The broken rules between the contrastive loss (the traits of ``loss.contrastive.name``'s
        class) and the other sections, each naming the keys to change (empty: none). Checked when the
        config is built if the losses are loaded, and again when the loss is built (:meth:`check_loss`)."""
        c, arch = self.loss, self.model.arch
        wrong: list[str] = []
        if arch == ARCH_DUAL and loss.uses_tau and c.contrastive.tau is None:
            wrong.append("loss.contrastive.tau unset (the dual encoder has no learned temperature; LTD uses 0.05)")
        if c.regulation != "none" and (arch == ARCH_DUAL or not (loss.log_weights and loss.soft_targets)):
            wrong.append(f"loss.regulation={c.regulation} (SRCL regulates ALBEF's InfoNCE ITC only)")
        if arch == ARCH_ALBEF and c.distill and not loss.soft_targets:
            wrong.append(f"loss.distill=true (momentum distillation applies to InfoNCE, not {c.contrastive.name})")
        return wrong

    def check_loss(self, loss: LossTraits) -> None:
        """Raise one :class:`ConfigError` listing :meth:`loss_rules` broken by ``loss`` (the built
        contrastive loss); return nothing when none is."""
        reject_broken_rules(self.loss_rules(loss))
