"""The numbers check: rerun the quick documented commands whose outputs README and docs quote, and
report every quoted figure that moved.

Run it before each release (about 20 minutes on a 2-core CPU, most of it the demo's training) and
record its summary in docs/reproducing.md ("The numbers check"):

    python scripts/check_numbers.py --out numbers_check            # every check
    python scripts/check_numbers.py --out numbers_check --only count_ops
    python scripts/check_numbers.py --out numbers_check --reuse-demo demo_out   # an earlier `make demo`

Each check runs one documented command and compares the figures a document quotes with the fresh
ones at the precision the document prints them. A quoted passage that the check no longer finds
(the document was rewritten) is a failure too, so the check and the docs move together. The
result is printed and written to ``OUT/numbers_check.json``; the exit status is 1 when a figure
moved or a passage is missing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
VLP = [sys.executable, "-m", "vlp.cli"]
#: ``accelerate launch`` through this interpreter: works without the virtualenv's ``bin/`` on PATH
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]


@dataclass
class Figure:
    """One quoted figure and its fresh value."""

    check: str
    doc: str
    name: str
    quoted: str
    measured: Optional[str]

    @property
    def moved(self) -> bool:
        return self.quoted != self.measured


def run(cmd: list[str], log: Path, env: Optional[dict[str, str]] = None) -> None:
    """Run ``cmd`` from the repository root, its output into ``log``; a failure stops the check."""
    print("$ " + " ".join(cmd), flush=True)
    with log.open("w") as f:
        done = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    if done.returncode:
        raise SystemExit(f"check_numbers: {' '.join(cmd[:6])} ... failed (exit {done.returncode}); its output: {log}")


def like(quoted: str, value: float) -> str:
    """``value`` printed as ``quoted`` is (decimals, thousands separators)."""
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    text = f"{value:,.{decimals}f}" if "," in quoted else f"{value:.{decimals}f}"
    return text


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row, stripped (padding and ``**`` bold marks)."""
    return [c.strip().strip("*") for c in line.strip().strip("|").split("|")]


def quoted_table(doc: str, header: str, column: int = 1) -> dict[str, str]:
    """``{first cell: cell number column}`` of the Markdown table that starts with the row ``header``
    (cells compared without their padding: vlp prints its tables padded to line up)."""
    lines = (ROOT / doc).read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("|") and _cells(line) == _cells(header)]
    if not starts:
        return {}
    rows = {}
    for line in lines[starts[0] + 2 :]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        rows[cells[0]] = cells[column]
    return rows


def quoted_passage(doc: str, pattern: str) -> Optional[re.Match]:
    """The first match of ``pattern`` in ``doc`` (whitespace in the pattern matches line breaks)."""
    text = (ROOT / doc).read_text()
    return re.search(pattern.replace(" ", r"\s+"), text)


def check_demo(out: Path, reuse: Optional[Path]) -> list[Figure]:
    """README's demo table against a fresh ``vlp demo`` (``metrics.json``)."""
    demo = reuse or out / "demo_out"
    if reuse is None:
        run([*VLP, "demo", "--out", str(demo)], out / "demo.log")
    metrics = json.loads((demo / "metrics.json").read_text())
    table = quoted_table("README.md", "| metric | vlp tiny | chance | x chance |")
    if not table:
        return [Figure("demo", "README.md", "the demo table", "present", None)]
    return [
        Figure("demo", "README.md", name, q, like(q, metrics[name]) if name in metrics else None)
        for name, q in table.items()
    ]


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


EVAL_PASSAGE = (
    r"rsum goes from (?P<rsum32>[\d.]+) in fp32 to (?P<rsum16>[\d.]+) in bf16 "
    r"\(r_mean (?P<rmean32>[\d.]+) → (?P<rmean16>[\d.]+)\), with (?P<pairs>[\d,]+) ITM pairs"
)


def check_eval(out: Path, reuse: Optional[Path]) -> list[Figure]:
    """docs/evaluation.md's two-process evaluation of the demo checkpoint, fp32 and bf16 (its two
    documented commands, outputs under ``out``)."""
    demo = reuse or out / "demo_out"
    if not (demo / "run").is_dir():
        check_demo(out, reuse)
    args = [
        "evaluate",
        "retrieval",
        "--checkpoint",
        str(demo / "run"),
        "--data",
        str(demo / "world/retrieval_test.json"),
    ]
    dist = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", f"--master_port={_port()}"]
    run([*dist, "-m", "vlp.cli", *args, "--out", str(out / "eval_2proc"), "eval.k_test=16"], out / "eval_2proc.log")
    launch = [*ACCELERATE, "--multi_gpu", "--num_processes", "2"]
    bf16 = ["--out", str(out / "eval_2proc_bf16"), "eval.k_test=16", "eval.precision=bf16", "eval.itm_batch_size=512"]
    run([*launch, f"--main_process_port={_port()}", "-m", "vlp.cli", *args, *bf16], out / "eval_2proc_bf16.log")
    m32 = json.loads((out / "eval_2proc" / "metrics.json").read_text())
    m16 = json.loads((out / "eval_2proc_bf16" / "metrics.json").read_text())
    found = quoted_passage("docs/evaluation.md", EVAL_PASSAGE)
    if found is None:
        return [Figure("eval", "docs/evaluation.md", "the fp32/bf16 passage", "present", None)]
    fresh = {
        "rsum32": m32["rsum"],
        "rsum16": m16["rsum"],
        "rmean32": m32["r_mean"],
        "rmean16": m16["r_mean"],
        "pairs": m32.get("itm_pairs", 0),
    }
    return [Figure("eval", "docs/evaluation.md", k, found[k], like(found[k], v)) for k, v in fresh.items()]


COUNT_OPS = [
    "bench",
    "--count-ops",
    "--warmup",
    "1",
    "--config",
    "configs/pretrain/shapes_tiny.yaml",
]
COUNT_OPS_OVERRIDES = [
    "model.vision.preset=base",
    "model.text.preset=base",
    "model.text.init=random",
    "model.vision.img_size=64",
    "model.queue_size=65536",
    "data.batch_size=4",
    "data.num_workers=0",
    "train.precision=bf16",
    "model.momentum_warmup_steps=0",
    "loss.mlm_slots=fixed",
]


def check_count_ops(out: Path, reuse: Optional[Path]) -> list[Figure]:
    """docs/performance.md's launches, casts and syncs per step at the base topology (its
    documented ``vlp bench --count-ops`` command, on a 24-image world)."""
    world = out / "worlds" / "w"
    if not (world / "pretrain.json").exists():
        run([*VLP, "make-world", "--out", str(world), "--images", "24"], out / "make_world.log")
    ops = out / "ops.json"
    overrides = [*COUNT_OPS_OVERRIDES, f"data.train=[{world / 'pretrain.json'}]"]
    run([*VLP, *COUNT_OPS, "--out", str(ops), *overrides], out / "count_ops.log")
    r = json.loads(ops.read_text())
    table = quoted_table("docs/performance.md", "| | before | after | target |", column=2)  # "after"
    rows = {
        "kernel-launching ops per step": r["kernel_ops_per_step"],
        "casts per step": r["casts_per_step"],
        "casts of momentum weights": r["casts_of_watched_per_step"],
        "device syncs per step": r["syncs_per_step"],
        "module calls per forward": r["module_calls_per_forward"],
    }
    figures = []
    for name, value in rows.items():
        cell = table.get(name)
        quoted = re.match(r"[\d,.]+", cell or "")
        figures.append(
            Figure(
                "count_ops",
                "docs/performance.md",
                name,
                quoted[0] if quoted else "present",
                like(quoted[0], value) if quoted else None,
            )
        )
    return figures


CHECKS: dict[str, Callable[[Path, Optional[Path]], list[Figure]]] = {
    "count_ops": check_count_ops,
    "demo": check_demo,
    "eval": check_eval,
}


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="folder for the commands' outputs and numbers_check.json")
    parser.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated checks of {sorted(CHECKS)}")
    parser.add_argument(
        "--reuse-demo", type=Path, help="an earlier `vlp demo --out DIR` folder instead of a fresh demo"
    )
    args = parser.parse_args(argv)
    wanted = [c for c in args.only.split(",") if c]
    unknown = sorted(set(wanted) - set(CHECKS))
    if unknown:
        parser.error(f"--only: unknown check(s) {unknown}; known: {sorted(CHECKS)}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    figures: list[Figure] = []
    for name in wanted:
        print(f"[{name}]", flush=True)
        figures += CHECKS[name](out, args.reuse_demo.resolve() if args.reuse_demo else None)
    moved = [f for f in figures if f.moved]
    for f in figures:
        mark = "MOVED" if f.moved else "ok   "
        print(f"{mark} {f.doc}: {f.name}: quoted {f.quoted}, measured {f.measured}")
    print(f"{len(figures)} figures checked, {len(moved)} moved")
    record = {
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(),
        "checks": wanted,
        "figures": [asdict(f) | {"moved": f.moved} for f in figures],
        "moved": len(moved),
    }
    (out / "numbers_check.json").write_text(json.dumps(record, indent=2) + "\n")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
