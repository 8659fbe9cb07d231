"""Shared parts of the shapes-world experiments over seeds (``srcl_testbed.py``, ``ltd_testbed.py``, ``zoo_testbed.py``).

An experiment parses the common options (:func:`experiment_parser`), writes a shapes world under
``OUT/world`` (:func:`prepare_world`), pretrains every variant for every seed with the same data
order, steps and model and evaluates zero-shot retrieval on the world's test split
(:class:`Sweep`: resumable, a (variant, seed) with a recorded result is skipped), and writes a
report whose table gives the mean ± std over seeds (:func:`results_table`, :func:`write_report`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from seed_results import SeedResults, markdown_table, paired_differences, paired_t_test, summarise

from vlp.config import PretrainConfig, load_config
from vlp.locks import file_lock
from vlp.runs.evaluation.image_text_retrieval import run_evaluate_retrieval
from vlp.runs.training.pretrain import run_pretrain, run_train_helper
from vlp.weights import read_state, step_checkpoints
from vlp.world import generate_world


def experiment_parser(
    doc: str, out: str, steps: int, data_options: Optional[Callable[[argparse.ArgumentParser], None]] = None
) -> argparse.ArgumentParser:
    """The options of every experiment: ``--out`` (default ``out``), ``--seeds``, the script's own
    ``data_options``, ``--images``, ``--test-images`` and ``--steps`` (default ``steps``); the
    description is the first paragraph of ``doc``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", default=out)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    if data_options is not None:
        data_options(p)
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--test-images", type=int, default=1000)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument(
        "--shard",
        type=shard,
        default=(0, 1),
        metavar="I/N",
        help="run only the I-th of N interleaved shares of the (seed, variant) runs, e.g. 0/2 and 1/2 "
        "on two cores; the shards record into the same results file, and a last run without --shard "
        "writes the report",
    )
    return p


def shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)`` with ``0 <= I < N``."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard expects I/N such as 0/2, got {text!r}") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard I/N needs 0 <= I < N, got {text!r}")
    return i, n


#: every seed a learned helper is trained with is at least this; students' seeds are below it
HELPER_SEED_BASE = 1000


def helper_seed(seed: int, index: int = 0) -> int:
    """The ``train.seed`` of the ``index``-th learned helper of the student seed ``seed`` (``seed`` <
    1000): ``1000 * (index + 1) + seed``. Never a student's seed, so helper and student never start
    from the same weights (a helper sharing the student's initialisation shares its confusions), and
    two helpers of one seed (``index``: e.g. the grade) are independent draws too."""
    if not 0 <= seed < HELPER_SEED_BASE:
        raise ValueError(f"student seeds are 0 .. {HELPER_SEED_BASE - 1}, got {seed}")
    return HELPER_SEED_BASE * (index + 1) + seed


def prepare_lock(out: Path) -> Path:
    """The lock file that shards of the experiment in ``out`` hold while they prepare what they
    share (the world, helpers, caches, warm-ups), so only one of them builds each piece."""
    return out / ".prepare.lock"


def prepare_world(out: Path, n_train: int, n_test: int, n_helper: int = 0) -> Path:
    """``out/world``: a shapes world (seed 0, ``n_train`` / 50 / ``n_test`` images, and ``n_helper``
    disjoint helper images), written unless an earlier run of the experiment left it there."""
    out.mkdir(parents=True, exist_ok=True)
    root = out / "world"
    if not (root / "scenes.json").exists():
        generate_world(root, seed=0, n_train=n_train, n_val=50, n_test=n_test, n_helper=n_helper)
    return root


def pin_design(record: Optional[Path], design: dict[str, Any]) -> None:
    """Refuse a run whose ``design`` (the settings its records must share to be paired: precision,
    sizes, steps, batch...) differs from that of the runs already kept in ``record`` (their
    ``design.json``), before anything is written; a first run writes it. (bf16 records were once about
    to be paired with fp32 arms.) No ``record``: nothing is kept, nothing to check."""
    if record is None:
        return
    path = record / "design.json"
    if path.exists():
        kept = json.loads(path.read_text())
        differ = [f"{k} {kept.get(k)!r} there, {v!r} asked" for k, v in design.items() if kept.get(k) != v]
        if differ:
            raise SystemExit(
                f"{path}: the recorded runs were made with another design ({'; '.join(differ)}); run with "
                "theirs or record into another folder (--record)"
            )
        return
    record.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(design, indent=1) + "\n")


def train_once(
    run_dir: Path, preset: str, data: Path, steps: int, overrides: Sequence[str] = (), helper: bool = False
) -> Path:
    """Pretrain ``preset`` on ``data`` for ``steps`` steps into ``run_dir`` unless its last
    checkpoint is already at ``steps`` (an interrupted run resumes). ``helper``: ``vlp train-helper``
    (plain InfoNCE), whose ``overrides`` must set ``train.seed`` to a :func:`helper_seed`. Returns the
    run directory."""
    if helper:
        seeds = [int(o.split("=", 1)[1]) for o in overrides if o.startswith("train.seed=")]
        if not seeds or seeds[-1] < HELPER_SEED_BASE:
            raise ValueError(
                f"{run_dir}: a learned helper is trained with its own seed, train.seed=helper_seed(seed) "
                f"(>= {HELPER_SEED_BASE}), never a student's: got {seeds[-1] if seeds else 'none'}"
            )
    if steps_done(run_dir) >= steps:
        return run_dir
    saved = step_checkpoints(run_dir)
    cfg = load_config(
        PretrainConfig,
        preset,
        [
            f"output_dir={run_dir}",
            f"data.train=[{data}]",
            f"train.steps={steps}",
            *overrides,
            # a run killed before its first checkpoint left a folder: auto starts it again from step 0
            *(["train.resume=auto"] if saved or (run_dir / "metrics.jsonl").exists() else []),
        ],
    )
    (run_train_helper if helper else run_pretrain)(cfg)
    return run_dir


def steps_done(run_dir: Path) -> int:
    """The step of ``run_dir``'s last checkpoint (0 without one): what :func:`train_once` resumes from."""
    saved = step_checkpoints(run_dir)
    return int(read_state(saved[-1])["step"]) if saved else 0


def seconds_per_step(run_dir: Path, batch_size: int) -> Optional[float]:
    """The median seconds per training step of ``run_dir`` on this machine (``batch_size`` over each
    log window's ``pairs_per_s`` in its ``metrics.jsonl``); None before its first log window."""
    path = run_dir / "metrics.jsonl"
    rates = [r["pairs_per_s"] for r in map(json.loads, path.read_text().splitlines() if path.exists() else [])]
    rates = [x for x in rates if x and x > 0]
    return batch_size / statistics.median(rates) if rates else None


@dataclass
class Budget:
    """The time a process may still start runs in (``--hours``): a run starts only when its estimate
    ends before ``end`` (``time.time()`` seconds), so that a session's last minutes do not go to a run
    its machine will not outlive. The estimate of a run that trains ``steps`` steps (with those of a
    warm-up or helper it needs first) is ``steps`` at the slowest seconds per step measured so far, plus
    the most any finished run took beyond its steps (evaluation, features, calibration), or
    ``overhead_s`` before one has finished. Without a measured step time every run fits."""

    end: float
    overhead_s: float
    step_s: Optional[float] = None
    #: the most a finished run took beyond its steps (None before one has finished)
    extra_s: Optional[float] = None

    def estimate(self, steps: int) -> Optional[float]:
        """Seconds a run training ``steps`` steps is expected to take; None before a step is timed."""
        if self.step_s is None:
            return None
        return steps * self.step_s + (self.overhead_s if self.extra_s is None else self.extra_s)

    def fits(self, steps: int, now: float) -> bool:
        """Whether a run training ``steps`` steps, started at ``now``, is expected to end in time."""
        est = self.estimate(steps)
        return est is None or now + est <= self.end

    def timed_step(self, step_s: Optional[float]) -> None:
        """A measured seconds-per-step (None: none yet); the estimate keeps the slowest."""
        if step_s is not None:
            self.step_s = max(self.step_s or 0.0, step_s)

    def finished(self, steps: int, wall_s: float) -> None:
        """A run that trained ``steps`` steps took ``wall_s`` seconds: its time beyond them is kept."""
        if self.step_s is not None:
            self.extra_s = max(self.extra_s or 0.0, wall_s - steps * self.step_s)


@dataclass
class Sweep:
    """Every variant for every seed: pretrain ``preset`` on ``data`` for ``steps`` steps, evaluate
    zero-shot retrieval on the test split of the world at ``root`` and record the metrics in
    ``results``. A (variant, seed) with a recorded result is skipped and an unrecorded one's run
    folder emptied first, so an interrupted experiment resumes."""

    results: SeedResults
    root: Path
    preset: str
    data: Path
    steps: int
    #: (variant, seed) -> the run folder
    run_dir: Callable[[str, int], Path]
    #: (variant, seed) -> its config overrides, after output_dir, data.train, train.steps and train.seed
    overrides: Callable[[str, int], list[str]]
    #: metrics -> what the progress line of a finished run shows of them
    summary: Callable[[dict[str, float]], str]
    #: width of the variant name in the progress line
    name_width: int = 18
    #: evaluate with the world's graded relevance too (nDCG)
    graded: bool = False
    #: record each run's wall-clock seconds with its metrics
    timed: bool = False
    #: start of the experiment, for the elapsed time in the progress lines
    t0: float = field(default_factory=time.time)
    #: also evaluate each group of query captions (``caption_kinds_test.json`` of the world)
    caption_groups: bool = False
    #: (variant, seed, run folder) -> further metrics of the trained run (probes, COCOS), recorded with the rest
    after: Optional[Callable[[str, int, Path], dict[str, float]]] = None

    def run(self, seeds: Sequence[int], variants: Sequence[str], shard: tuple[int, int] = (0, 1)) -> None:
        """Every (seed, variant) without a recorded result; with ``shard=(i, n)`` only every n-th
        of them from the i-th on, so n processes can share the runs."""
        i, n = shard
        for seed, name in [(s, v) for s in seeds for v in variants][i::n]:
            if not self.results.has(name, seed):
                self._run_one(name, seed)

    def _run_one(self, name: str, seed: int) -> None:
        run_dir = self.results.fresh(self.run_dir(name, seed))
        with file_lock(prepare_lock(self.results.path.parent)):  # overrides may train a shared warm-up
            extra = self.overrides(name, seed)
        cfg = load_config(
            PretrainConfig,
            self.preset,
            [
                f"output_dir={run_dir}",
                f"data.train=[{self.data}]",
                f"train.steps={self.steps}",
                f"train.seed={seed}",
                *extra,
            ],
        )
        t = time.time()
        run_pretrain(cfg)
        graded = self.root / "relevance_graded_test.npy" if self.graded else None
        res = run_evaluate_retrieval(
            run_dir,
            self.root / "retrieval_test.json",
            self.root / "relevance_test.json",
            run_dir / "eval",
            graded_relevance=graded,
            show_progress=False,
            caption_groups=self.root / "caption_kinds_test.json" if self.caption_groups else None,
        )
        metrics = {**res.metrics, "seconds": time.time() - t} if self.timed else dict(res.metrics)
        if self.after is not None:
            metrics |= self.after(name, seed, run_dir)
        self.results.add(name, seed, metrics)
        print(
            f"[{time.time() - self.t0:6.0f}s] {name:{self.name_width}s} seed {seed}: {self.summary(metrics)} "
            f"({time.time() - t:.0f}s)",
            flush=True,
        )


def results_table(
    results: SeedResults, seeds: Sequence[int], metrics: Sequence[str], label: Optional[Callable[[str], str]] = None
) -> str:
    """The Markdown table of every variant's ``metrics``: mean ± std over the ``seeds`` it has;
    ``label`` names a variant's row (default: the variant)."""
    summary = summarise(results.data, seeds, metrics)
    return markdown_table({label(k) if label else k: v for k, v in summary.items()}, metrics)


def paired_table(
    data: dict[str, dict[str, dict[str, float]]],
    seeds: Sequence[int],
    metrics: Sequence[str],
    baseline_of: Callable[[str], Optional[str]],
    variants: Optional[Sequence[str]] = None,
) -> str:
    """The Markdown table of each variant minus its baseline (``baseline_of(variant)``; None: no row),
    seed by seed: mean ± std of the per-seed differences over the seeds both have. Arms that share
    a seed share its warm-up and data order, so this spread, not the arms' own, is the noise an
    effect must exceed."""
    rows: dict[str, dict[str, tuple[float, float, int]]] = {}
    for name in variants if variants is not None else list(data):
        base = baseline_of(name)
        if base is None or base == name or name not in data or base not in data:
            continue
        pair = {name: data[name], base: data[base]}
        rows[f"{name} - {base}"] = paired_differences(pair, seeds, metrics, base)[name]
    return markdown_table(rows, metrics) if rows else ""


def paired_tests_table(
    data: dict[str, dict[str, dict[str, float]]],
    seeds: Sequence[int],
    metrics: Sequence[str],
    baseline: str,
    variants: Sequence[str],
) -> str:
    """The Markdown table of each variant minus ``baseline`` on ``metrics``, seed by seed, with a
    paired t-test per cell: ``mean ± std (t, p)`` over the seeds both have (two-sided p, n - 1
    degrees of freedom, :func:`seed_results.paired_t_test`), and ``tests``: how many cells
    (the family a multiple-comparison correction divides by)."""
    lines = [f"| variant - {baseline} | seeds | {' | '.join(metrics)} |", "|---|---:|" + "---:|" * len(metrics)]
    base = data.get(baseline, {})
    for name in variants:
        if name == baseline or name not in data:
            continue
        shared = [str(s) for s in seeds if str(s) in data[name] and str(s) in base]
        cells = []
        for m in metrics:
            d = [data[name][s][m] - base[s][m] for s in shared if m in data[name][s] and m in base[s]]
            if len(d) < 2:
                cells.append("-")
                continue
            t, p = paired_t_test(d)
            cells.append(f"{statistics.mean(d):+.2f} ± {statistics.stdev(d):.2f} (t {t:.2f}, p {p:.3g})")
        lines.append(f"| {name} | {len(shared)} | {' | '.join(cells)} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def run_minutes(results: SeedResults, how: str = "one thread each") -> str:
    """The recorded wall-clock time of every run of ``results``, for a report ("412 min of runs (one
    thread each)", ``how`` in the brackets); a rerun that skips finished runs reports the same total."""
    secs = [m["seconds"] for per_seed in results.data.values() for m in per_seed.values() if "seconds" in m]
    return f"{sum(secs) / 60:.0f} min of runs ({how})" if secs else "run times not recorded"


def write_report(path: Path, *paragraphs: str) -> str:
    """Write the ``paragraphs`` (a blank line between two; empty ones left out) to ``path`` and print
    them; returns the text."""
    text = "\n\n".join(p for p in paragraphs if p)
    path.write_text(text + "\n")
    print(text)
    return text


def plot_sweep(
    results: SeedResults,
    seeds: Sequence[int],
    points: dict[str, float],
    metrics: Sequence[str],
    out: Path,
    title: str,
    xlabel: str,
    baselines: Optional[dict[str, dict[str, tuple[float, float, int]]]] = None,
) -> Optional[Path]:
    """Each of ``metrics`` against a swept parameter: variant -> x in ``points``, mean ± std over
    the ``seeds`` each variant has (error bars); ``baselines`` (label -> ``summarise`` row) are drawn
    as horizontal lines. Nothing is written before any variant has a result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarise({k: v for k, v in results.data.items() if k in points}, seeds, metrics)
    if not summary:
        return None
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.6), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        xs = sorted((points[k], row[m]) for k, row in summary.items() if m in row)
        ax.errorbar([x for x, _ in xs], [v[0] for _, v in xs], yerr=[v[1] for _, v in xs], marker="o", capsize=3)
        for label, row in (baselines or {}).items():
            if m in row:
                ax.axhline(row[m][0], ls=":", color="gray")
                ax.text(xs[0][0], row[m][0], f" {label}", fontsize=7, va="bottom")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(m)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_arm_bars(
    results: SeedResults,
    seeds: Sequence[int],
    metrics: Sequence[str],
    out: Path,
    title: str,
    chance: Optional[float] = None,
) -> Optional[Path]:
    """Grouped bars: one group per metric, one bar per variant, mean ± std over the seeds each
    variant has (error bars); ``chance`` a dotted line. Nothing is written before any result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarise(results.data, seeds, metrics)
    if not summary:
        return None
    width = 0.8 / len(summary)
    fig, ax = plt.subplots(figsize=(1.2 * len(metrics) + 3, 3.6))
    for i, (name, row) in enumerate(summary.items()):
        xs = [j + (i - (len(summary) - 1) / 2) * width for j in range(len(metrics))]
        ax.bar(
            xs,
            [row[m][0] if m in row else 0.0 for m in metrics],
            width,
            yerr=[row[m][1] if m in row else 0.0 for m in metrics],
            capsize=2,
            label=f"{name} (n={max(v[2] for v in row.values())})",
        )
    if chance is not None:
        ax.axhline(chance, ls=":", color="gray")
    ax.set_xticks(range(len(metrics)), list(metrics), fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
