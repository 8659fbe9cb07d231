"""The "shapes world": a deterministic synthetic vision-language dataset (``docs/shapes_world.md``).

Each image is a light-grey canvas split into an (invisible) 3x3 grid holding 1-4 coloured
shapes, at most one per cell. Each image gets five distinct captions written by a small
grammar; every caption is the surface form of an explicit, serialisable predicate over scenes,
so the set of images a caption truly describes -- including the "false negatives" of
contrastive learning -- is known exactly, and so are the answers of the world's VQA questions
and the labels of its NLVR2 statements.

Modules, each importing only the ones above it:

``scene``       attributes, objects (``Obj``), scenes (``Scene``), partial descriptions
                (``Desc``), the per-purpose RNG, random scene sampling and rendering to images
``phrases``     the shared words: cell phrases, number words, the a/an article, noun
                phrases and their parser
``predicates``  caption predicates (scene / object / relation / count) and
                ``caption_matches``, their exact truth on a scene
``captions``    predicate <-> caption text, and the five captions of an image
``relevance``   exact and graded relevance of captions to images, vectorised (``SceneTable``)
``oracle``      ``WorldTruth``: the ground truth of a world for any of its annotation files
                (the oracle SRCL helper, the false negatives of SRCL diagnostics), and
                ``noisy_relevance``: that truth corrupted to a helper of a chosen ROC-AUC
``vqa``         VQA questions, their answers and simulated annotators
``nlvr``        NLVR2 statements about image pairs and their labels
``world``       the world writer: ``generate_world`` (images, annotation, relevance and task
                files, the optional helper split)
``mix``         pretraining files that mix the world's captions (``write_generic_mix``,
                ``write_caption_mix``) and the false negatives of their batches
                (``false_negative_share``)
``attributes``  the attribute values a caption determines, and captions with attributes hidden
``minimal_pairs``  distractor scenes differing from a caption's image in one attribute of one object

This module only re-exports the names used outside the package; import everything else from
its module.
"""

from vlp.data.synthetic.minimal_pairs import Distractor, sample_distractors
from vlp.data.synthetic.mix import (
    CaptionMix,
    false_negative_share,
    training_batches,
    write_caption_mix,
    write_generic_mix,
)
from vlp.data.synthetic.nlvr import NLVR_TEMPLATES, check_templates
from vlp.data.synthetic.oracle import WorldTruth, noisy_relevance
from vlp.data.synthetic.predicates import caption_matches
from vlp.data.synthetic.scene import Obj, Scene, scene_from_dict
from vlp.data.synthetic.world import format_world_files, generate_world

__all__ = [
    "Distractor",
    "NLVR_TEMPLATES",
    "CaptionMix",
    "Obj",
    "Scene",
    "WorldTruth",
    "noisy_relevance",
    "caption_matches",
    "check_templates",
    "false_negative_share",
    "training_batches",
    "generate_world",
    "format_world_files",
    "sample_distractors",
    "scene_from_dict",
    "write_caption_mix",
    "write_generic_mix",
]
