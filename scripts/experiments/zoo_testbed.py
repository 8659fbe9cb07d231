"""Contrastive loss zoo in ECIR 2022's setting, as closely as a CPU allows, with COCOS.

    python scripts/experiments/zoo_testbed.py --out runs/zoo_testbed      # 6 arms x 5 seeds

ECIR trains on a frozen ImageNet backbone for 30 epochs; from random weights the max-violation
triplet collapses (VSE++ warns it needs warmed-up features). Here, per seed:

1. the dual encoder (``configs/ltd/shapes_dual.yaml``) is warmed up with InfoNCE for
   ``--warmup-steps`` (with and without BatchNorm after the projection, for the arms that use it);
2. every arm continues from its warm-up for ``--steps`` with the same data order: InfoNCE,
   Triplet (all negatives) and Triplet-SH (max violation) on caption-level batches (64 images,
   one caption each), InfoNCE, Triplet-SH and SmoothAP on image-level batches of the same image
   count (64 images x 5 captions, ECIR's SmoothAP protocol); the triplet losses with BatchNorm
   before the L2 norm (the LTD reference's triplet runs) and Triplet-SH once without it;
3. zero-shot retrieval on the test split (R@k, R-precision, graded nDCG, mAP@k in both
   definitions) and, for seed 0, COCOS on 20 training batches (SmoothAP counted with and without
   the 1/tau factor of its gradient).

Writes ``OUT/results.json``, ``OUT/cocos.json`` and ``OUT/report.md``. Resumable.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from harness import (
    Sweep,
    experiment_parser,
    paired_table,
    prepare_lock,
    prepare_world,
    results_table,
    run_minutes,
    train_once,
    write_report,
)
from seed_results import SeedResults, slug

from vlp.lab.cocos import run_cocos
from vlp.locks import file_lock
from vlp.train.preemption import exit_status

PRESET = "configs/ltd/shapes_dual.yaml"
BN = ["model.dual.batchnorm=true"]
IMAGE_LEVEL = ["data.captions_per_image=5"]
# arm -> (contrastive loss, batch layout overrides, BatchNorm)
ARMS: dict[str, tuple[str, list[str], bool]] = {
    "InfoNCE, caption-level": ("infonce", [], False),
    "Triplet, caption-level, BN": ("triplet", [], True),
    "Triplet-SH, caption-level, BN": ("triplet_sh", [], True),
    "Triplet-SH, caption-level, no BN": ("triplet_sh", [], False),
    "InfoNCE, image-level": ("infonce", IMAGE_LEVEL, False),
    "SmoothAP, image-level": ("smoothap", IMAGE_LEVEL, False),
}
METRICS = (
    "rsum txt_r1 img_r1 img_r5 img_r5_rel img_r_precision txt_r_precision img_ndcg10 txt_map5 txt_map5_ecir"
).split()


def main(argv=None) -> int:
    p = experiment_parser(__doc__, out="runs/zoo_testbed", steps=300)
    p.set_defaults(seeds=[0, 1, 2, 3, 4])
    p.add_argument("--warmup-steps", type=int, default=200)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--cocos-batches", type=int, default=20)
    a = p.parse_args(argv)
    out = Path(a.out)
    t0 = time.time()
    with file_lock(prepare_lock(out)):  # shards (--shard) prepare one at a time
        root = prepare_world(out, a.images, a.test_images)
    data = root / "pretrain.json"
    base = ["train.progress=false"]

    def overrides(name: str, seed: int) -> list[str]:
        loss, layout, bn = ARMS[name]
        norm = BN if bn else []
        warm = train_once(
            out / f"warmup{'_bn' if bn else ''}_seed{seed}",
            PRESET,
            data,
            a.warmup_steps,
            [*base, *norm, f"train.seed={seed}"],
        )
        return [*base, *norm, *layout, f"init_from={warm}", f"loss.contrastive.name={loss}", "train.warmup_steps=0"]

    results = SeedResults(out / "results.json")
    Sweep(
        results,
        root,
        PRESET,
        data,
        a.steps,
        run_dir=lambda name, seed: out / f"{slug(name)}_seed{seed}",
        overrides=overrides,
        summary=lambda m: f"rsum {m['rsum']:.1f} R-prec(t2i) {m['img_r_precision']:.2f} nDCG@10 {m['img_ndcg10']:.2f}",
        name_width=34,
        graded=True,
        timed=True,
        t0=t0,
    ).run(a.seeds, a.arms, shard=a.shard)
    if a.shard != (0, 1):
        print(f"shard {a.shard[0]}/{a.shard[1]} done; run again without --shard for the report", flush=True)
        return 0

    cocos_file = out / "cocos.json"
    cocos = json.loads(cocos_file.read_text()) if cocos_file.exists() else {}
    seed = a.seeds[0]
    for name in a.arms:
        loss, layout, _ = ARMS[name]
        run = out / f"{slug(name)}_seed{seed}"
        for inv_tau in (False, True) if loss == "smoothap" else (False,):
            key = f"{name}{', with 1/tau' if inv_tau else ''}"
            if key in cocos or not results.has(name, seed):
                continue
            cocos[key] = run_cocos(
                run,
                [str(data)],
                loss,
                out / "cocos" / slug(key),
                batches=a.cocos_batches,
                show_progress=False,
                smoothap_inv_tau=inv_tau,
            )
            cocos_file.write_text(json.dumps(cocos, indent=1))
    write_report(
        out / "report.md",
        f"Shapes world: {a.images} training images (5 captions each), `{PRESET}`, {a.warmup_steps} warm-up steps of "
        f"InfoNCE per seed, then {a.steps} steps per arm; {len(a.seeds)} seeds; {run_minutes(results)} on this "
        f"machine. Zero-shot retrieval on the {a.test_images}-image test split (ITC cosine). COCOS: seed {seed}, "
        f"{a.cocos_batches} training batches, `{out / 'cocos.json'}`.",
        results_table(results, a.seeds, METRICS),
        "Differences from InfoNCE with the same batch layout, seed by seed (same warm-up and data order):",
        paired_table(results.data, a.seeds, METRICS, lambda name: f"InfoNCE, {name.split(', ')[1]}"),
        cocos_table(cocos),
    )
    return 0


def cocos_table(cocos: dict) -> str:
    """COCOS per run: valid queries, queries without gradient and contributing candidates per query,
    per direction (mean ± std over batches)."""
    rows = [
        "| run | queries i2t / t2i | with zero gradient i2t / t2i | contributing per query i2t / t2i |",
        "|---|---:|---:|---:|",
    ]
    for key, rec in cocos.items():
        cells = [
            " / ".join(
                f"{rec['stats'][f'{d}_{n}']['mean']:.2f} ± {rec['stats'][f'{d}_{n}']['std']:.2f}"
                for d in ("i2t", "t2i")
            )
            for n in ("valid", "zeros", "count_mean")
        ]
        rows.append(f"| {key} | {' | '.join(cells)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(exit_status(main, "zoo_testbed.py"))
