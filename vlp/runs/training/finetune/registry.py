"""The fine-tuning runner of each task, by task name: :data:`RUNNERS`.

A runner is ``(FinetuneConfig) -> results dict`` (what it writes as ``results.json``). Each task
module of :mod:`vlp.runs.training.finetune` registers its runner where it is defined
(``@RUNNERS.register(VQA)``); this module imports none of them, so outside code registers its own the
same way (``RUNNERS.register("toy", recipe.run)``) with a :class:`vlp.kinds.Kind` of
``finetuned=True`` in :data:`vlp.kinds.KINDS` and a model builder in
:data:`vlp.models.build.MODEL_BUILDERS`. ``vlp finetune TASK`` offers every registered runner whose
kind has a help line (:attr:`vlp.kinds.Kind.about`).
"""

from __future__ import annotations

from typing import Callable

from vlp.config import FinetuneConfig
from vlp.registry import Registry

#: ``(FinetuneConfig) -> results dict``: one fine-tuning run of a task
Runner = Callable[[FinetuneConfig], dict]

#: the fine-tuning runner of each task, by task name (``FinetuneConfig.task``)
RUNNERS: Registry[Runner] = Registry("fine-tuning runner", key="task")
