"""The training commands: ``vlp pretrain``, ``vlp train-helper`` (:mod:`~vlp.runs.training.pretrain`),
``vlp finetune TASK`` and ``vlp pretrain nlvr-ta`` (:mod:`~vlp.runs.training.finetune`), and the
inputs computed once before a run (``vlp cache-helper-features``, ``vlp make-targets``:
:mod:`~vlp.runs.training.features`). What they share: the :class:`~vlp.runs.training.job.Job` handed
to the loop, the run directory (:mod:`~vlp.runs.training.run_dir`) and the SRCL / LTD parts of an
objective (:mod:`~vlp.runs.training.assembly`)."""
