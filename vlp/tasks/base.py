"""What every training task shares: the model's post-step hook and an optional LTD / ITD head."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

from vlp.dist import rank
from vlp.losses.nlvr import accuracy, distilled_ce
from vlp.preprocess.device_decode import DeviceBatch, decode_images
from vlp.preprocess.transforms import PixelNorm
from vlp.tasks.reconstruction import Reconstruction
from vlp.weights import load_module_states, module_states


class Task(nn.Module):
    """Base of the tasks: ``model`` (with ``after_optimizer_step``), an optional
    :class:`Reconstruction` whose multiplier steps after the model's optimizer and whose state
    (head, lambda) is checkpointed next to the model, the distillation weight schedule and the
    task's random generators (per rank, and shared by the ranks for draws over the global batch)."""

    def __init__(
        self,
        model: nn.Module,
        reconstruction: Optional[Reconstruction] = None,
        *,
        alpha: float = 0.0,
        alpha_ramp_steps: int = 0,
        distill: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not 0.0 <= alpha <= 1.0 or alpha_ramp_steps < 0:
            raise ValueError(f"alpha must be in [0, 1] and alpha_ramp_steps >= 0, got {alpha}, {alpha_ramp_steps}")
        self.model = model
        self.reconstruction = reconstruction  # LTD / ITD on the contrastive text embedding
        self.alpha_max, self.alpha_ramp_steps, self.distill = alpha, alpha_ramp_steps, distill
        self.seed = seed
        self._gen: Optional[torch.Generator] = None
        # uint8 images from the loader (data.image.uint8) are normalised here, on the device
        self.pixel_norm: Optional[PixelNorm] = None
        self._shared_gen: Optional[torch.Generator] = None
        self._gen_key: Optional[tuple] = None  # (device, step) the generator was seeded for
        self._shared_key: Optional[tuple] = None

    def on_device(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The batch as the model takes it: ``images`` [B, 3, H, W], uint8 ones normalised
        (:class:`PixelNorm`). Under ``data.image.decode=device`` they arrive as a
        :class:`~vlp.preprocess.device_decode.DeviceBatch` and are decoded and augmented first, on the
        device of the task's buffers (eagerly: before any compiled graph)."""
        images, norm = batch["images"], self.pixel_norm
        if not isinstance(images, DeviceBatch) and images.dtype != torch.uint8:
            return batch
        if norm is None:
            raise ValueError("uint8 images but no PixelNorm: build the task with data.image.uint8=true")
        if isinstance(images, DeviceBatch):
            images = decode_images(images, next(norm.buffers()).device)
        return {**batch, "images": norm(images)}

    def alpha(self, step: int) -> float:
        """Momentum-distillation weight: ``alpha * min(1, step / alpha_ramp_steps)`` (ALBEF's
        epoch-0 ramp, in steps); 0 without distillation."""
        if not self.distill:
            return 0.0
        r = self.alpha_ramp_steps
        return self.alpha_max * min(1.0, step / r) if r > 0 else self.alpha_max

    def distilled_classification(
        self, classify: Callable[..., torch.Tensor], args: tuple, labels: torch.Tensor, step: int, name: str
    ) -> dict[str, torch.Tensor]:
        """A classifier's step with momentum distillation (NLVR2, SNLI-VE): ``classify(*args)`` ->
        logits [B, C], and with ``momentum=True`` the twin's; ``(1 - alpha) CE + alpha * soft CE``
        against the twin's softmax (:func:`~vlp.losses.distill.distilled_ce`), the twin skipped at
        alpha 0. Returns ``loss``, the loss under ``name``, ``acc`` and ``alpha``."""
        alpha = self.alpha(step)
        logits = classify(*args)
        logits_m = None
        if alpha > 0:
            with torch.no_grad():
                logits_m = classify(*args, momentum=True)
        loss = distilled_ce(logits, labels, logits_m, alpha)
        return {"loss": loss, name: loss.detach(), "acc": accuracy(logits, labels), "alpha": torch.tensor(alpha)}

    def generator(self, device: torch.device, step: Optional[int] = None) -> torch.Generator:
        """This rank's RNG for the task's draws (negative sampling, masking, pair sampling).

        With ``step`` (the optimizer step): reseeded from (seed, rank, step) at the first call of
        every step, so a resumed run draws what an uninterrupted one draws without storing any
        generator state; micro-batches of one step continue the stream. Without: seeded once,
        ``seed + 1000 * rank``."""
        self._gen, self._gen_key = self._draws(self._gen, self._gen_key, device, rank(), step)
        return self._gen

    def shared_generator(self, device: torch.device, step: Optional[int] = None) -> torch.Generator:
        """The RNG of draws made for the *global* batch: :meth:`generator` of rank 0, on every
        rank. Every rank makes the same calls on the same (gathered) tensors and keeps its own
        rows, so a run on n processes draws what one process with the global batch draws. On one
        process it is the same stream as :meth:`generator`."""
        self._shared_gen, self._shared_key = self._draws(self._shared_gen, self._shared_key, device, 0, step)
        return self._shared_gen

    def _draws(
        self, gen: Optional[torch.Generator], key: Optional[tuple], device: torch.device, r: int, step: Optional[int]
    ) -> tuple[torch.Generator, tuple]:
        """``gen`` while ``(device, step)`` is unchanged, else a new generator seeded for (seed, r, step)."""
        new_key = (torch.device(device), step)
        if gen is not None and key == new_key:
            return gen, key
        seed = self.seed + 1000 * r if step is None else ((self.seed * 1_000_003 + r) * 1_000_000_007 + step) % 2**63
        return torch.Generator(device=device).manual_seed(seed), new_key

    def batch_report(self, batch: dict[str, torch.Tensor]) -> tuple[int, Optional[torch.Tensor]]:
        """What the training loop logs of a batch: its pairs on this rank, and ``bad_samples`` (0-d,
        the bad loads its items replaced; None: not counted). No read from the device."""
        return len(batch["input_ids"]), batch.get("bad_samples")

    def after_optimizer_step(self, step: int | torch.Tensor, skipped: Optional[torch.Tensor] = None) -> None:
        """Momentum EMA and the LTD multiplier's step; neither moves when ``skipped`` (0-d bool, device)."""
        self.model.after_optimizer_step(step, skipped)
        if self.reconstruction is not None:
            self.reconstruction.after_optimizer_step(skipped)

    def extra_state(self) -> dict[str, torch.Tensor]:
        return module_states(reconstruction=self.reconstruction)

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        load_module_states(state, reconstruction=self.reconstruction)
