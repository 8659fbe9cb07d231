"""The commands' work, one module per command family (:mod:`vlp.cli` parses and dispatches here).

This is the glue layer: it reads files, builds tokenizer, model, data and task, and runs the loop
(:mod:`vlp.train`) or the evaluators (:mod:`vlp.eval`); the layers below never touch run files.

* :mod:`vlp.runs.job`: :class:`~vlp.runs.job.Job`, one training run of any command as handed to the
  loop, and the queue check; :mod:`vlp.runs.run_dir`: the run directory and the resumed run's config;
  :mod:`vlp.runs.assembly`: the SRCL regulator and the LTD reconstruction of a task;
* :mod:`vlp.runs.pretrain`: ``vlp pretrain``, ``vlp train-helper`` (the pretraining job);
* :mod:`vlp.runs.finetune`: ``vlp finetune retrieval|vqa|nlvr2``, ``vlp pretrain nlvr-ta``;
* :mod:`vlp.runs.evaluate`: ``vlp evaluate retrieval`` and its protocol presets;
* :mod:`vlp.runs.features`: ``vlp cache-helper-features`` (SRCL helper features), ``vlp make-targets``
  (LTD targets);
* :mod:`vlp.runs.demo`: ``vlp demo [--full]``;
* :mod:`vlp.runs.bench`: ``vlp bench``.

The research analyses (``vlp analyze``, ``vlp plot srcl-weights``) are the lab's (:mod:`vlp.lab`), a
layer above this one that builds on it.

A command prints what its run function returns as a family's ``format_*`` function words it
(:func:`vlp.runs.bench.format_bench`, :func:`vlp.runs.evaluate.format_metrics`, ...).

Every command that reads a checkpoint opens it with :func:`vlp.checkpoint.open_checkpoint`, below
this layer (found, verified and read once: kind, config, model, tokenizer, preprocessing; the
inference API and the fine-tuning job use it too).
"""
