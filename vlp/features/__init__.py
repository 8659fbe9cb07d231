"""Precomputed features: tensors computed once by a frozen model and read by the data path.

``helper_cache``  the SRCL helper's features of every image and caption (``vlp cache-helper-features``;
                  an oracle cache holds a shapes world's relevance table instead: :mod:`vlp.lab.oracle`)
``targets``       LTD's latent targets: every caption embedded by a sentence encoder (``vlp make-targets``)
``store``         the one-file safetensors store the targets are kept in
``row_index``     their keys' rows in sorted numpy arrays, shared by forked loader workers
``packed_keys``   64-bit keys of packed strings computed by numpy (a helper cache's row index)

The datasets of :mod:`vlp.data` take them as lookups (``HelperFeatures``, ``CaptionTargets``) and
import nothing from here; the commands (:mod:`vlp.runs`) load them and hand them over.
"""
