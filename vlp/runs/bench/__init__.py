"""Measuring and showing: ``vlp bench`` (the training step timed by phase: :mod:`~vlp.runs.bench.step`;
``--loader-only``: :mod:`~vlp.runs.bench.loader`) and ``vlp demo [--full]`` (:mod:`~vlp.runs.bench.demo`)."""
