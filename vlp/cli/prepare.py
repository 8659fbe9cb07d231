"""``vlp prepare coco|flickr30k|cc3m|sbu|vg|vg-qa|vqa|vqa-answers|nlvr2|snli-ve|refcoco+|eccv-caption``: the official
dataset releases converted into vlp's (ALBEF's) annotation files by :mod:`vlp.prepare`
(``eccv-caption``: into a relevance file of the Karpathy COCO test file); ``vlp prepare folder|csv``: your own
images and captions (:mod:`vlp.prepare.own_data`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from vlp.data.downstream_formats import VQA_V2


def _print_counts(what: str, counts: dict[str, int], outs: Sequence[str | Path]) -> None:
    print(f"{what}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    for o in outs:
        print(f"wrote {o}")


def _own_data(a: argparse.Namespace) -> None:
    """``vlp prepare folder|csv``: each left-out item as ``vlp data check`` prints a problem, then the counts."""
    from vlp.prepare.own_data import csv_pairs, image_folder

    if a.dataset == "folder":
        prepared = image_folder(a.folder, a.out)
    else:
        prepared = csv_pairs(a.csv, a.out, a.csv_img_key, a.csv_caption_key, a.csv_separator)
    for problem in prepared.problems:
        print(problem)
    _print_counts(a.dataset, prepared.counts, [a.out])


def _run(a: argparse.Namespace) -> None:
    if a.dataset in ("folder", "csv"):
        _own_data(a)
        return
    from vlp.prepare import (
        answer_list,
        cc3m,
        coco_karpathy,
        eccv_caption,
        flickr30k_karpathy,
        nlvr2,
        prepare_refcoco,
        sbu,
        snli_ve,
        snli_ve_split,
        visual_genome,
        visual_genome_qa,
        vqa_v2,
    )

    d = a.dataset
    if d in ("coco", "flickr30k"):
        if d == "coco":
            counts = coco_karpathy(a.karpathy_json, a.image_root, a.out)
        else:
            counts = flickr30k_karpathy(a.karpathy_json, a.image_root, a.out, a.prefix)
        _print_counts(d, counts, [Path(a.out) / f"{d}_{s}.json" for s in ("train", "val", "test")])
        return
    if d == "cc3m":
        counts = cc3m(a.tsv, a.images, a.out)
    elif d == "sbu":
        counts = sbu(a.captions, a.urls, a.images, a.out)
    elif d == "vg":
        counts = visual_genome(a.region_descriptions, a.image_data, a.image_root, a.out)
    elif d == "vg-qa":
        counts = visual_genome_qa(a.question_answers, a.image_data, a.image_root, a.out, a.answer_list)
    elif d == VQA_V2:
        counts = vqa_v2(a.questions, a.annotations, a.split, a.image_root, a.out)
    elif d == "eccv-caption":
        counts = eccv_caption(a.karpathy_test, a.coco_captions, a.eccv, a.out, a.benchmark)
        d = a.benchmark
    elif d == "vqa-answers":
        counts = answer_list(a.annotations, a.top_k, a.out)
    elif hasattr(a, "refs"):  # refcoco+, whose --dataset (the files' prefix) stands in a.dataset
        paths = prepare_refcoco(a.refs, a.instances, a.out, a.dataset, a.dets, a.dets_by, a.image_prefix, a.image_root)
        counts = {split: len(json.loads(p.read_text())) for split, p in paths.items()}
        _print_counts(f"{a.dataset} (entries)", counts, list(paths.values()))
        return
    elif d == "snli-ve":
        for src in a.jsonl:  # every name checked before any file is written
            snli_ve_split(src)
        for src in a.jsonl:
            out = Path(a.out) / f"ve_{snli_ve_split(src)}.json"
            _print_counts(f"{d} {Path(src).name}", snli_ve(src, out, a.image_root), [out])
        return
    else:
        counts = nlvr2(a.jsonl, a.split, a.out, a.image_root)
    _print_counts(d, counts, [a.out])


def _add_karpathy(pp: Any) -> None:
    """Adds ``coco`` and ``flickr30k`` (Karpathy split files) to the ``prepare`` subparsers ``pp``; returns None."""
    for name, text in (
        ("coco", "Karpathy dataset_coco.json -> coco_{train,val,test}.json"),
        ("flickr30k", "Karpathy dataset_flickr30k.json -> flickr30k_{train,val,test}.json"),
    ):
        c = pp.add_parser(name, help=text)
        c.add_argument("karpathy_json", metavar="KARPATHY_JSON")
        c.add_argument("--out", required=True, metavar="DIR", help="output folder")
        c.add_argument("--image-root", metavar="ROOT", help="if given, check that every image exists under it")
        if name == "flickr30k":
            c.add_argument(
                "--prefix", default="flickr30k-images", help="folder put before each file name ('' for none)"
            )


def _add_pretraining(pp: Any) -> None:
    """Adds the pretraining-pair sources ``cc3m``, ``sbu``, ``vg`` and ``vg-qa`` to ``pp``; returns None."""
    c = pp.add_parser("cc3m", help="CC3M Train_GCC-training.tsv + img2dataset images -> pretraining pairs")
    c.add_argument("tsv", metavar="TSV")
    c.add_argument("--images", required=True, metavar="DIR", help="img2dataset output folder (00000/, 00001/, ...)")
    c.add_argument("--out", required=True, metavar="JSON")
    c = pp.add_parser("sbu", help="SBU captions + urls files + img2dataset images -> pretraining pairs")
    c.add_argument("captions", metavar="CAPTIONS_TXT")
    c.add_argument("urls", metavar="URLS_TXT")
    c.add_argument("--images", required=True, metavar="DIR", help="img2dataset output folder")
    c.add_argument("--out", required=True, metavar="JSON")
    for name, source, text in (
        ("vg", "region_descriptions", "region_descriptions.json + image_data.json -> pretraining entries"),
        ("vg-qa", "question_answers", "question_answers.json + image_data.json -> vg_qa.json (VQA training)"),
    ):
        c = pp.add_parser(name, help=f"Visual Genome {text}")
        c.add_argument(source, metavar=source.upper() + "_JSON")
        c.add_argument("image_data", metavar="IMAGE_DATA_JSON")
        c.add_argument("--image-root", required=True, metavar="ROOT", help="folder holding VG_100K/ and VG_100K_2/")
        if name == "vg-qa":
            c.add_argument(
                "--answer-list", metavar="JSON", help="keep only answers in this answer_list.json (vqa-answers)"
            )
        c.add_argument("--out", required=True, metavar="JSON")


def _add_vqa_nlvr_ve(pp: Any) -> None:
    """Adds ``vqa``, ``vqa-answers``, ``nlvr2`` and ``snli-ve`` (the classification tasks) to ``pp``; returns None."""
    from vlp.prepare.nlvr import NLVR_SPLITS
    from vlp.prepare.vqa import VQA_SPLITS

    c = pp.add_parser(VQA_V2, help="official VQA v2 questions (+ annotations) -> vqa_*.json")
    c.add_argument("questions", metavar="QUESTIONS_JSON")
    c.add_argument("--annotations", metavar="ANNOTATIONS_JSON", help="omit for the test splits")
    c.add_argument("--split", required=True, choices=list(VQA_SPLITS), help="the split of the files (image folder)")
    c.add_argument("--image-root", metavar="ROOT", help="if given, check that every image exists under it")
    c.add_argument("--out", required=True, metavar="JSON")
    c = pp.add_parser("vqa-answers", help="official VQA v2 annotations -> answer_list.json (most frequent answers)")
    c.add_argument("annotations", nargs="+", metavar="ANNOTATIONS_JSON")
    c.add_argument("--top-k", type=int, default=3128, help="number of answers (ALBEF's list has 3128)")
    c.add_argument("--out", required=True, metavar="JSON")
    c = pp.add_parser("nlvr2", help="official NLVR2 train.json / dev.json / test1.json -> nlvr_*.json")
    c.add_argument("jsonl", metavar="NLVR2_JSON")
    c.add_argument("--split", required=True, choices=list(NLVR_SPLITS))
    c.add_argument("--image-root", metavar="ROOT", help="if given, check that every image exists under it")
    c.add_argument("--out", required=True, metavar="JSON")
    c = pp.add_parser("snli-ve", help="official snli_ve_{train,dev,test}.jsonl -> ve_{train,dev,test}.json")
    c.add_argument("jsonl", nargs="+", metavar="SNLI_VE_JSONL", help="snli_ve_train.jsonl, snli_ve_dev.jsonl, ...")
    c.add_argument("--image-root", metavar="ROOT", help="if given, check that every <Flickr30K_ID>.jpg exists under it")
    c.add_argument("--out", required=True, metavar="DIR", help="output folder")


def _add_refcoco(pp: Any) -> None:
    """Adds ``refcoco+`` (grounding files from the refer toolkit's refs) to ``pp``; returns None."""
    c = pp.add_parser(
        "refcoco+",
        help="refer toolkit refs(unc).p + COCO instances.json -> refcoco+_{train,val,testA,testB}.json (grounding)",
    )
    c.add_argument("refs", metavar="REFS_PICKLE", help="refs(unc).p (read with a restricted unpickler: data only)")
    c.add_argument("instances", metavar="INSTANCES_JSON", help="COCO instances.json of the refs' images")
    c.add_argument("--out", required=True, metavar="DIR", help="output folder")
    c.add_argument("--dataset", default="refcoco+", help="file-name prefix (refcoco, refcoco+, refcocog)")
    c.add_argument(
        "--dets", metavar="JSON", help="detections replacing the gold candidate boxes (ALBEF used MAttNet's)"
    )
    c.add_argument("--dets-by", default="image_id", choices=["image_id", "ref_id"], help="the detections' keys")
    c.add_argument("--image-prefix", default="", help="put before each COCO file_name, e.g. train2014/")
    c.add_argument("--image-root", metavar="ROOT", help="if given, check that every image exists under it")


def _add_eccv_caption(pp: Any) -> None:
    """Adds ``eccv-caption`` (a relevance file of the Karpathy COCO test file) to ``pp``; returns None."""
    from vlp.prepare.eccv import ECCV_BENCHMARKS

    c = pp.add_parser(
        "eccv-caption",
        help="ECCV Caption (or CxC) positives by COCO id -> vlp relevance file of the Karpathy 5k test file",
    )
    c.add_argument(
        "--karpathy-test",
        required=True,
        metavar="JSON",
        help="the Karpathy test file (vlp prepare coco's coco_test.json)",
    )
    c.add_argument("--coco-captions", required=True, metavar="JSON", help="COCO's captions_val2014.json")
    c.add_argument(
        "--eccv",
        default="auto",
        metavar="DIR|WHEEL|auto",
        help="folder or wheel of the eccv-caption package's id files; auto: the installed package (default)",
    )
    c.add_argument(
        "--benchmark",
        default="eccv-caption",
        choices=list(ECCV_BENCHMARKS),
        help="whose positives (default: %(default)s)",
    )
    c.add_argument("--out", required=True, metavar="JSON", help="the relevance file to write")


def _add_own_data(pp: Any) -> None:
    """Adds ``folder`` and ``csv`` (your own images and captions) to ``pp``; returns None."""
    from vlp.prepare.own_data import CSV_CAPTION_KEY, CSV_IMG_KEY, CSV_SEPARATOR

    c = pp.add_parser(
        "folder", help="your images with same-name .txt captions (a.jpg + a.txt; recursive) -> one annotation file"
    )
    c.add_argument("folder", metavar="DIR", help="the folder of images and .txt captions (one caption per line)")
    c.add_argument("--out", required=True, metavar="JSON", help="annotation file to write (absolute image paths)")
    c = pp.add_parser("csv", help="open_clip's CSV (an image path and a caption per row) -> one annotation file")
    c.add_argument("csv", metavar="CSV", help="the CSV file; relative image paths are read from its folder")
    c.add_argument("--out", required=True, metavar="JSON", help="annotation file to write (absolute image paths)")
    c.add_argument("--csv-img-key", default=CSV_IMG_KEY, metavar="COLUMN", help="image path column (%(default)s)")
    c.add_argument("--csv-caption-key", default=CSV_CAPTION_KEY, metavar="COLUMN", help="caption column (%(default)s)")
    c.add_argument(
        "--csv-separator",
        default=CSV_SEPARATOR,
        metavar="CHAR",
        help="field separator, one character (default: a tab; '\\t' too)",
    )


def _add_prepare(sub: Any) -> None:
    """``vlp prepare coco|flickr30k|cc3m|sbu|vg|vg-qa|vqa|vqa-answers|nlvr2|snli-ve|refcoco+|eccv-caption|folder|csv``."""
    s = sub.add_parser(
        "prepare", help="convert official dataset releases, or your own images and captions, into annotation files"
    )
    pp = s.add_subparsers(dest="dataset", required=True)
    for add in (_add_karpathy, _add_pretraining, _add_vqa_nlvr_ve, _add_refcoco, _add_eccv_caption, _add_own_data):
        add(pp)
    s.set_defaults(func=_run)


#: This family's commands, each with the function that adds it to ``vlp``'s subparsers.
COMMANDS = {"prepare": _add_prepare}
