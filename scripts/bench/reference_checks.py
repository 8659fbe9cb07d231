"""The checks of ``reference_step.py``'s reference step against vlp's: vlp's hard negatives and MLM masks
recorded (to inject them into the reference), the same-maths check on one batch and the FLOP count."""

from __future__ import annotations

import contextlib
import copy
from typing import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def record_vlp_draws() -> Iterator[dict[str, list]]:
    """Record the hard negatives and MLM masks vlp's step draws (``vlp.tasks.objectives``), so the
    reference can be run on the same ones: ``negatives`` gets ``(neg_img, neg_txt)`` per ITM call
    (vlp draws per text first, then per image), ``mlm`` gets ``(masked_ids, labels)``.

    vlp has no injection hook of its own; this wraps the module's functions for the duration."""
    from vlp.tasks import objectives

    rec: dict[str, list] = {"negatives": [], "mlm": []}
    sample, mask = objectives.sample_hard_negatives, objectives.mask_tokens
    pending: list[torch.Tensor] = []

    def sample_rec(*args, **kwargs):
        idx, ok = sample(*args, **kwargs)
        pending.append(idx.clone())
        if len(pending) == 2:
            rec["negatives"].append((pending[0], pending[1]))
            pending.clear()
        return idx, ok

    def mask_rec(*args, **kwargs):
        out = mask(*args, **kwargs)
        rec["mlm"].append(tuple(x.clone() for x in out))
        return out

    objectives.sample_hard_negatives, objectives.mask_tokens = sample_rec, mask_rec
    try:
        yield rec
    finally:
        objectives.sample_hard_negatives, objectives.mask_tokens = sample, mask


# --------------------------------------------------------------------------- benchmark


def check_same_maths(task: nn.Module, ref: nn.Module, batch: dict[str, torch.Tensor], step: int) -> dict:
    """Both steps on copies of themselves, one batch, vlp's draws injected: |loss differences|."""
    task, ref = copy.deepcopy(task), copy.deepcopy(ref)
    with record_vlp_draws() as rec:
        out = task(batch, step=step)
    r = ref(batch, step=step, negatives=rec["negatives"][0], mlm=rec["mlm"][0])
    return {k: abs(float(out[k].detach()) - float(r[k].detach())) for k in ("itc", "itm", "mlm", "loss")}


def count_flops(task: nn.Module, ref: nn.Module, batch: dict[str, torch.Tensor], step: int) -> dict:
    """Matmul FLOP (torch's counter) of one forward + backward of each, on copies, per pair. The
    attention runs on the math path while counting: the counter has no formula for some fused
    kernels (e.g. CPU flash attention) and would count them as 0."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    out = {}
    for name, module in (("reference", ref), ("vlp", task)):
        module = copy.deepcopy(module)
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            module(batch, step=step)["loss"].backward()
        out[name] = counter.get_total_flops() / len(batch["input_ids"])
    return out
