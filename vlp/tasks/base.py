"""What every training task shares: the model's post-step hook and an optional LTD / ITD head."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from vlp.dist import rank
from vlp.tasks.reconstruction import Reconstruction
from vlp.train.checkpoint import load_module_states, module_states


class Task(nn.Module):
    """Base of the tasks: ``model`` (with ``after_optimizer_step``), an optional
    :class:`Reconstruction` whose multiplier steps after the model's optimizer and whose state
    (head, lambda) is checkpointed next to the model, the distillation weight schedule and the
    task's random generator."""

    def __init__(self, model: nn.Module, reconstruction: Optional[Reconstruction] = None, *, alpha: float = 0.0,
                 alpha_ramp_steps: int = 0, distill: bool = False, seed: int = 0) -> None:
        super().__init__()
        if not 0.0 <= alpha <= 1.0 or alpha_ramp_steps < 0:
            raise ValueError(f"alpha must be in [0, 1] and alpha_ramp_steps >= 0, got {alpha}, {alpha_ramp_steps}")
        self.model = model
        self.reconstruction = reconstruction  # LTD / ITD on the contrastive text embedding
        self.alpha_max, self.alpha_ramp_steps, self.distill = alpha, alpha_ramp_steps, distill
        self.seed = seed
        self._gen: Optional[torch.Generator] = None

    def alpha(self, step: int) -> float:
        """Momentum-distillation weight: ``alpha * min(1, step / alpha_ramp_steps)`` (ALBEF's
        epoch-0 ramp, in steps); 0 without distillation."""
        if not self.distill:
            return 0.0
        r = self.alpha_ramp_steps
        return self.alpha_max * min(1.0, step / r) if r > 0 else self.alpha_max

    def generator(self, device: torch.device) -> torch.Generator:
        """The task's own RNG (negative sampling, masking, pair sampling), seeded ``seed + 1000 * rank``."""
        if self._gen is None or self._gen.device != device:
            self._gen = torch.Generator(device=device).manual_seed(self.seed + 1000 * rank())
        return self._gen

    def after_optimizer_step(self, step: int) -> None:
        self.model.after_optimizer_step(step)
        if self.reconstruction is not None:
            self.reconstruction.after_optimizer_step()

    def extra_state(self) -> dict[str, torch.Tensor]:
        return module_states(reconstruction=self.reconstruction)

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        load_module_states(state, reconstruction=self.reconstruction)
