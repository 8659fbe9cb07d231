"""The "shapes world": a deterministic synthetic vision-language dataset (``docs/shapes_world.md``),
the embedded dataset of ``make demo``.

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
``tasks``       the downstream tasks' files: ``vqa`` (questions, answers, simulated annotators),
                ``nlvr`` (statements about image pairs and their labels), ``grounding``
                (referring expressions and boxes), ``ve`` (entailment triples),
                ``classification`` (zero-shot classification splits)
``writer``      the world writer: ``generate_world`` (images, annotation, relevance and task
                files, the optional helper split)
``mix``         pretraining files that mix the world's captions (``write_generic_mix``,
                ``write_caption_mix``)

The world writes vlp's own file formats (:mod:`vlp.data`) and imports nothing above them. What the
lab measures with it (the oracle helper, false negatives, probes, minimal pairs) is :mod:`vlp.lab`.

This module only re-exports the names used outside the package; import everything else from
its module.
"""

from vlp.world.mix import CaptionMix, write_caption_mix, write_generic_mix
from vlp.world.predicates import caption_matches
from vlp.world.scene import Obj, Scene, scene_from_dict
from vlp.world.task_files.nlvr import NLVR_TEMPLATES, check_templates
from vlp.world.writer import format_world_files, generate_world

__all__ = [
    "NLVR_TEMPLATES",
    "CaptionMix",
    "Obj",
    "Scene",
    "caption_matches",
    "check_templates",
    "generate_world",
    "format_world_files",
    "scene_from_dict",
    "write_caption_mix",
    "write_generic_mix",
]
