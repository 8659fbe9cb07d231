"""The pretraining run config: every section, and the rules that tie sections together."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vlp.config.data import DataConfig
from vlp.config.load import reject_broken_rules
from vlp.config.loss import LossConfig
from vlp.config.model import ModelConfig
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
        if arch == "dual":
            wrong += [
                f"loss.{k}={getattr(c, k)} (the dual encoder has no fusion, ITM or MLM)"
                for k in ("itm", "mlm")
                if getattr(c, k) != 0
            ]
            wrong += ["loss.distill=true (the dual encoder has no momentum twin)"] if c.distill else []
            wrong += [f"eval.score={self.eval.score} (no ITM head: use itc)"] if self.eval.score != "itc" else []
            if c.contrastive.name == "infonce" and c.contrastive.tau is None:
                wrong.append("loss.contrastive.tau unset (the dual encoder has no learned temperature; LTD uses 0.05)")
        elif self.data.captions_per_image > 1:
            wrong.append(
                f"data.captions_per_image={self.data.captions_per_image} (image-level batches need model.arch=dual)"
            )
        if c.regulation != "none" and (arch == "dual" or c.contrastive.name != "infonce"):
            wrong.append(f"loss.regulation={c.regulation} (SRCL regulates ALBEF's InfoNCE ITC only)")
        if arch == "albef" and c.contrastive.name != "infonce" and c.distill:
            wrong.append(f"loss.distill=true (momentum distillation applies to InfoNCE, not {c.contrastive.name})")
        if c.ltd.mode != "off" and c.ltd.decoder == "latent" and not c.ltd.targets:
            wrong.append("loss.ltd.targets unset (LTD needs a file from `vlp make-targets`)")
        reject_broken_rules(wrong)
