"""The research lab: diagnostics of models, SRCL helpers and LTD targets, mostly on the shapes world
(:mod:`vlp.world`), where the ground truth is known. ``vlp analyze`` and ``vlp plot srcl-weights``
dispatch here (:mod:`vlp.cli.lab`), as does ``vlp cache-helper-features --oracle``.

The lab is built on the product and never the other way round: it may import every layer below
the command line (the commands' glue in :mod:`vlp.runs` included), and nothing but :mod:`vlp.cli`
imports it.

``oracle``           the world's ground truth for any of its annotation files (``WorldTruth``), an
                     oracle SRCL helper cache of it, exact or corrupted to a chosen ROC-AUC
``false_negatives``  batches as training draws them, the share of true false negatives among their
                     negatives (``vlp analyze false-negatives``)
``diagnostics``      an SRCL helper against a world's ground truth (``vlp analyze helper --world``)
``calibration``      an SRCL helper on real data, delta from same-image captions (``vlp analyze helper``)
``attributes``       what a world caption says about each attribute, and the caption with some hidden
``probes``           linear suppression probes on caption embeddings (``vlp analyze probes``)
``minimal_pairs``    distractor scenes one attribute away, minimal-pair accuracy (``vlp analyze minimal-pairs``)
``ltd_floor``        LTD's lowest reconstruction loss with an attribute suppressed (``vlp analyze ltd-floor``)
``cocos``            candidates contributing to each query's gradient (``vlp analyze cocos``)
``srcl_weights``     a checkpoint's SRCL weights on its training data (``vlp plot srcl-weights``)
"""
