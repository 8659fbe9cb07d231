"""The commands' work, in three groups (:mod:`vlp.cli` parses and dispatches here).

This is the glue layer: it reads files, builds tokenizer, model, data and task, and runs the loop
(:mod:`vlp.train`) or the evaluators (:mod:`vlp.eval`); the layers below never touch run files.

Three groups, one module per command family within each:

* :mod:`vlp.runs.training`: ``vlp pretrain``, ``vlp train-helper``, ``vlp finetune TASK``, ``vlp pretrain
  nlvr-ta``, ``vlp cache-helper-features``, ``vlp make-targets``, and what they share (the
  :class:`~vlp.runs.training.job.Job` handed to the loop, the run directory, the SRCL / LTD assembly);
* :mod:`vlp.runs.evaluation`: ``vlp evaluate retrieval|classification|grounding``, ``vlp explain``, a
  checkpoint evaluated by its kind's evaluator;
* :mod:`vlp.runs.bench`: ``vlp bench`` (the step, the loader) and ``vlp demo [--full]``.

The research analyses (``vlp analyze``, ``vlp plot srcl-weights``) are the lab's (:mod:`vlp.lab`), a
layer above this one that builds on it.

A command prints what its run function returns as a family's ``format_*`` function words it
(:func:`vlp.runs.bench.step.format_bench`, ...); metrics and results as the one table of
:func:`vlp.metrics_table.format_metrics` (``vlp evaluate``, ``vlp finetune``).

Every command that reads a checkpoint opens it with :func:`vlp.checkpoint.open_checkpoint`, below
this layer (found, verified and read once: kind, config, model, tokenizer, preprocessing; the
inference API and the fine-tuning job use it too).
"""
