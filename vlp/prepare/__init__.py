"""``vlp prepare``: convert official dataset releases into vlp's (ALBEF's) annotation files.

One function per source; each reads the official release files, writes our JSON files atomically
(:func:`vlp.data.json_entries.write_json_atomic`), returns a dict of counts, and raises
:class:`~vlp.errors.DataError` naming the file and key of malformed input. One module per release
(``karpathy``, ``img2dataset``, ``vg``, ``vqa``, ``nlvr``, ``ve``, ``refcoco``, ``eccv``, ``own_data``; every
function is importable from here), with the shared helpers of :mod:`vlp.prepare.common`; the command line
is :mod:`vlp.cli.prepare`.

- :func:`coco_karpathy`, :func:`flickr30k_karpathy`: Karpathy's ``dataset_coco.json`` /
  ``dataset_flickr30k.json`` -> ``{coco,flickr30k}_{train,val,test}.json`` (train: one entry per
  caption with ``image_id``, train + restval; val/test: one entry per image with its caption list).
  Image paths are relative to the image root (``data.image_root``).
- :func:`cc3m`, :func:`sbu`: caption files + images downloaded by img2dataset (``00000/000000012.jpg``
  with a sidecar ``000000012.json`` holding ``url``, ``caption``, ``key``, ``status``) -> pretraining
  pairs; rows whose image is missing are counted and left out. Images are matched by URL through the
  sidecars, so the row order, a header line or img2dataset's shard size do not matter.
- :func:`visual_genome`: ``region_descriptions.json`` + ``image_data.json`` -> one pretraining entry
  per image with its region phrases as a caption list.
- :func:`visual_genome_qa`: ``question_answers.json`` + ``image_data.json`` -> VG-QA entries
  (ALBEF's ``vg_qa.json``), answers normalised, optionally only those in the VQA answer list.
- :func:`vqa_v2`, :func:`answer_list`: official VQA v2 questions / annotations -> ``vqa_*.json``
  entries and the most frequent answers (``answer_list.json``).
- :func:`nlvr2`: official NLVR2 JSON-lines files -> ``nlvr_*.json``.
- :func:`snli_ve`: official SNLI-VE JSON-lines files -> ``ve_*.json`` (:mod:`vlp.prepare.ve`).
- :func:`eccv_caption`: ECCV Caption's (or CxC's) COCO-id positives + COCO's ``captions_val2014.json``
  -> a relevance file of the Karpathy 5k test file (:mod:`vlp.prepare.eccv`).
- :func:`image_folder`, :func:`csv_pairs`: your own data, a folder of images with same-name ``.txt``
  captions or open_clip's CSV -> one entry per image with its caption list (:mod:`vlp.prepare.own_data`);
  what cannot be used is left out, each item named in a warning (:class:`Prepared`).

Pretraining pairs (CC3M, SBU, VG, your own) hold absolute image paths (the resolved image folder joined with
the file's place in it), so several of them can go into one ``data.train`` with any
``data.image_root``; the downstream files hold paths relative to the dataset's image root, as ALBEF's.
"""

from __future__ import annotations

from vlp.prepare.eccv import ECCV_BENCHMARKS, eccv_caption
from vlp.prepare.img2dataset import IMAGE_SUFFIXES, cc3m, img2dataset_index, sbu
from vlp.prepare.karpathy import KARPATHY_SPLITS, coco_karpathy, flickr30k_karpathy
from vlp.prepare.nlvr import NLVR_SPLITS, nlvr2, nlvr_images
from vlp.prepare.own_data import FOLDER_IMAGE_SUFFIXES, Prepared, csv_pairs, image_folder
from vlp.prepare.refcoco import prepare_refcoco
from vlp.prepare.ve import VE_SPLITS, snli_ve, snli_ve_split
from vlp.prepare.vg import VG_FOLDERS, visual_genome, visual_genome_qa
from vlp.prepare.vqa import VQA_SPLITS, answer_list, vqa_image, vqa_v2

__all__ = [
    "ECCV_BENCHMARKS",
    "FOLDER_IMAGE_SUFFIXES",
    "IMAGE_SUFFIXES",
    "KARPATHY_SPLITS",
    "NLVR_SPLITS",
    "Prepared",
    "VE_SPLITS",
    "VG_FOLDERS",
    "VQA_SPLITS",
    "answer_list",
    "cc3m",
    "coco_karpathy",
    "csv_pairs",
    "eccv_caption",
    "flickr30k_karpathy",
    "image_folder",
    "img2dataset_index",
    "nlvr2",
    "nlvr_images",
    "prepare_refcoco",
    "sbu",
    "snli_ve",
    "snli_ve_split",
    "visual_genome",
    "visual_genome_qa",
    "vqa_image",
    "vqa_v2",
]
