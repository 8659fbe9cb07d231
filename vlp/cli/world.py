"""``vlp make-world``: write the synthetic shapes world (:mod:`vlp.world`), with optional caption mixes."""

from __future__ import annotations

import argparse
from typing import Any

from vlp.cli.common import call
from vlp.errors import ConfigError


def _make_world(a: argparse.Namespace) -> None:
    from vlp.world import check_templates, format_world_files, generate_world, write_caption_mix, write_generic_mix

    templates = None
    if a.nlvr_templates:
        try:
            templates = check_templates([t.strip() for t in a.nlvr_templates.split(",") if t.strip()])
        except ValueError as e:
            raise ConfigError(f"--nlvr-templates {a.nlvr_templates!r}: {e}") from None
    paths = call(
        generate_world,
        a,
        used=("images", "val_images", "test_images", "helper_images", "generic_share", "caption_kinds"),
        n_train=a.images,
        n_val=a.val_images,
        n_test=a.test_images,
        nlvr_templates=templates,
        n_helper=a.helper_images,
    )
    for share in a.generic_share or []:
        paths[f"generic_{share:g}"] = write_generic_mix(a.out, share, a.seed)
    for spec in a.caption_kinds or []:
        try:
            kinds, repeats = _kind_spec(spec)
            mix = write_caption_mix(a.out, kinds, a.seed, repeats=repeats)
        except ValueError as e:
            raise ConfigError(f"--caption-kinds {spec!r}: {e}") from None
        paths[mix.path.stem.removeprefix("pretrain_")] = mix.path
        if mix.dropped:
            print(f"caption kinds {spec}: {len(mix.dropped)} images without such a caption left out")
    print(format_world_files(paths))


def _kind_spec(spec: str) -> tuple[list[str], dict[str, int]]:
    """``scene:4,object,count`` -> (["scene", "object", "count"], {"scene": 4}); ``ValueError``
    names a repeat that is not a whole number."""
    kinds, repeats = [], {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        kind, _, times = part.partition(":")
        kinds.append(kind.strip())
        if times:
            if not times.strip().isdigit():
                raise ValueError(f"{part!r}: expected KIND or KIND:N with a whole number N >= 1")
            repeats[kind.strip()] = int(times)
    return kinds, repeats


def _add_make_world(sub: Any) -> None:
    """``vlp make-world``."""
    s = sub.add_parser("make-world", help="write the synthetic shapes world")
    s.add_argument("--out", required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--images", type=int, default=4000, help="training images")
    s.add_argument("--val-images", type=int, default=200)
    s.add_argument("--test-images", type=int, default=1000)
    s.add_argument("--image-size", type=int, default=64)
    s.add_argument(
        "--nlvr-templates",
        default=None,
        help="comma-separated NLVR statement templates (default: all of more, contains, exactly, both, "
        "one_image, neither, total, same)",
    )
    s.add_argument(
        "--generic-share",
        type=float,
        action="append",
        help="also write pretrain_generic_<share>.json: this share of images captioned only generically (repeatable)",
    )
    s.add_argument(
        "--caption-kinds",
        action="append",
        metavar="KINDS",
        help="also write pretrain_kinds_<kinds>.json: every image keeps only its captions of these comma-separated "
        "kinds (scene, object, relation, count), e.g. object,count; KIND:N lists that kind's captions N times, "
        "so it is drawn N times as often, e.g. scene:4,object,relation,count (repeatable)",
    )
    s.add_argument(
        "--helper-images",
        type=int,
        default=0,
        help="also write helper_split.json: this many further images, disjoint from every split, with every "
        "caption kind (an SRCL helper's training data)",
    )
    s.set_defaults(func=_make_world)


#: This family's commands, each with the function that adds it to ``vlp``'s subparsers.
COMMANDS = {"make-world": _add_make_world}
