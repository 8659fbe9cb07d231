"""What every training task shares: the model's post-step hook and an optional LTD / ITD head."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from vlp.tasks.reconstruction import Reconstruction
from vlp.train.checkpoint import load_module_states, module_states


class Task(nn.Module):
    """Base of the tasks: ``model`` (with ``after_optimizer_step``) and an optional
    :class:`Reconstruction` whose multiplier steps after the model's optimizer and whose state
    (head, lambda) is checkpointed next to the model."""

    def __init__(self, model: nn.Module, reconstruction: Optional[Reconstruction] = None) -> None:
        super().__init__()
        self.model = model
        self.reconstruction = reconstruction  # LTD / ITD on the contrastive text embedding

    def after_optimizer_step(self, step: int) -> None:
        self.model.after_optimizer_step(step)
        if self.reconstruction is not None:
            self.reconstruction.after_optimizer_step()

    def extra_state(self) -> dict[str, torch.Tensor]:
        return module_states(reconstruction=self.reconstruction)

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        load_module_states(state, reconstruction=self.reconstruction)
