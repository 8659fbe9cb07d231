"""Every option of a command reaches something (issue 43): :func:`vlp.cli.common.call` refuses a parsed
option that is neither a parameter of the run function, nor read by the handler (``used=``), nor
``vlp``'s dispatch's, and every command that goes through ``call`` binds its options as parsed from a
minimal command line, with the run function replaced by a recorder of the real signature: renaming a
parameter of any run function fails here.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
from types import SimpleNamespace
from typing import Any, Callable, Optional

import pytest

from tests.test_cli_help import walk
from vlp.cli import USER_ERRORS, build_parser, main
from vlp.cli.common import UnboundOptionError, call


def _run(cache: str, out: Optional[str] = "o", size: int = 256) -> dict[str, Any]:
    """A run function's stand-in: returns its keyword arguments."""
    return {"cache": cache, "out": out, "size": size}


def _ns(**options: Any) -> argparse.Namespace:
    """A parsed command line of ``vlp demo-cmd`` holding ``options`` (and the dispatch's own)."""
    return argparse.Namespace(command="demo-cmd", func=print, **options)


def test_an_option_that_reaches_nothing_is_named() -> None:
    with pytest.raises(UnboundOptionError, match=r"vlp demo-cmd: --image-sizes reaches no parameter of .*\._run"):
        call(_run, _ns(cache="c", image_sizes=3))
    assert issubclass(UnboundOptionError, RuntimeError)
    assert not issubclass(UnboundOptionError, USER_ERRORS)  # a programming error: no `vlp: error:` line


def test_an_option_read_by_the_handler_or_bound_passes() -> None:
    assert call(_run, _ns(cache="c", size=3)) == {"cache": "c", "out": "o", "size": 3}
    assert call(_run, _ns(cache="c", sizes=3), used=("sizes",), size=2) == {"cache": "c", "out": "o", "size": 2}


def test_used_names_an_option_of_the_command() -> None:
    with pytest.raises(UnboundOptionError, match="used= names --image-sizes, which is no option"):
        call(_run, _ns(cache="c"), used=("image_sizes",))


def test_none_keeps_the_run_functions_default() -> None:
    """None (an option left out) is not passed to a parameter with a default, is passed to one without,
    and an option that reaches nothing is refused whatever its value."""
    assert call(_run, _ns(cache="c", out=None, size=None)) == {"cache": "c", "out": "o", "size": 256}
    assert call(_run, _ns(cache=None)) == {"cache": None, "out": "o", "size": 256}
    with pytest.raises(UnboundOptionError, match="--sizes"):
        call(_run, _ns(cache="c", sizes=None))


def _anything(*args: Any, **kwargs: Any) -> str:
    """A formatter's stand-in: an empty table."""
    return ""


#: For each command that goes through ``call``: a minimal command line, the run function ``call``
#: receives (``module:name``) with what its recorder returns, and the other names to replace
#: (formatters of that result, a config loader) with what they return.
CASES: dict[str, tuple[list[str], str, Any, dict[str, Callable[..., Any]]]] = {
    "convert albef": (
        ["convert", "albef", "src.pth", "out"],
        "vlp.interop.albef:convert_albef_file",
        SimpleNamespace(summary=_anything),
        {},
    ),
    "export onnx": (
        ["export", "onnx", "runs/x", "--out", "o", "--overwrite", "--opset", "18"],
        "vlp.export.onnx:export_onnx",
        {},
        {"vlp.export.onnx:summary": _anything},
    ),
    "cache-helper-features": (
        ["cache-helper-features", "--helper", "h", "--data", "d.json", "--out", "o"],
        "vlp.runs.training.features:run_cache_helper_features",
        "o",
        {},
    ),
    "make-targets": (
        ["make-targets", "--data", "d.json", "--out", "t.npy"],
        "vlp.runs.training.features:run_make_targets",
        "t.npy",
        {},
    ),
    "make-shards": (["make-shards", "--data", "d.json", "--out", "o"], "vlp.data.shard_writer:write_shards", "o", {}),
    "bench": (
        ["bench", "--config", "c.yaml"],
        "vlp.runs.bench.step:run_bench",
        None,
        {"vlp.cli.demo_bench:load_config": _anything, "vlp.runs.bench.step:format_bench": _anything},
    ),
    "bench --count-ops": (
        ["bench", "--config", "c.yaml", "--count-ops"],
        "vlp.runs.bench.step:run_count_ops",
        None,
        {"vlp.cli.demo_bench:load_config": _anything, "vlp.runs.bench.step:format_count_ops": _anything},
    ),
    "demo": (["demo"], "vlp.runs.bench.demo:run_demo", None, {}),
    "demo --full": (["demo", "--full", "vqa:train.epochs=1"], "vlp.runs.bench.demo:run_demo_full", None, {}),
    "evaluate retrieval": (
        ["evaluate", "retrieval", "--checkpoint", "c", "--data", "d.json", "--out", "o"],
        "vlp.runs.evaluation.image_text_retrieval:run_evaluate_retrieval",
        SimpleNamespace(metrics={}),
        {},
    ),
    "evaluate classification": (
        ["evaluate", "classification", "--checkpoint", "c", "--data", "d", "--out", "o"],
        "vlp.runs.evaluation.zero_shot_classification:run_evaluate_classification",
        {},
        {},
    ),
    "evaluate grounding": (
        ["evaluate", "grounding", "--checkpoint", "c", "--data", "d.json", "--out", "o"],
        "vlp.runs.evaluation.gradcam_grounding:run_evaluate_grounding",
        {},
        {},
    ),
    "explain": (
        ["explain", "--checkpoint", "c", "--image", "i.png", "--text", "t", "--out", "o"],
        "vlp.runs.evaluation.explain:run_explain",
        None,
        {},
    ),
    "analyze cocos": (
        ["analyze", "cocos", "--checkpoint", "c", "--data", "d.json", "--loss", "infonce", "--out", "o"],
        "vlp.lab.cocos:run_cocos",
        None,
        {"vlp.lab.cocos:format_cocos": _anything},
    ),
    "analyze helper": (
        ["analyze", "helper", "--cache", "c", "--data", "d.json", "--out", "o"],
        "vlp.lab.calibration:run_helper_calibration",
        None,
        {"vlp.lab.calibration:calibration_summary": _anything},
    ),
    "analyze helper --world": (
        ["analyze", "helper", "--cache", "c", "--data", "d.json", "--out", "o", "--world", "w"],
        "vlp.lab.diagnostics:run_helper_diagnostics",
        None,
        {"vlp.lab.diagnostics:diagnostics_summary": _anything},
    ),
    "analyze false-negatives": (
        ["analyze", "false-negatives", "--world", "w", "--data", "d.json"],
        "vlp.lab.false_negatives:run_false_negatives",
        None,
        {"vlp.lab.false_negatives:format_false_negatives": _anything},
    ),
    "analyze probes": (
        ["analyze", "probes", "--checkpoint", "c", "--world", "w", "--out", "o"],
        "vlp.lab.probes:run_probes",
        None,
        {"vlp.lab.probes:format_probes": _anything},
    ),
    "analyze minimal-pairs": (
        ["analyze", "minimal-pairs", "--checkpoint", "c", "--world", "w", "--out", "o"],
        "vlp.lab.minimal_pairs:run_minimal_pairs",
        None,
        {"vlp.lab.minimal_pairs:format_minimal_pairs": _anything},
    ),
    "analyze ltd-floor": (
        ["analyze", "ltd-floor", "--targets", "t.npy", "--data", "d.json", "--out", "o"],
        "vlp.lab.ltd_floor:run_ltd_floor",
        None,
        {},
    ),
    "plot srcl-weights": (["plot", "srcl-weights", "run"], "vlp.lab.srcl_weights:run_srcl_weight_plots", {}, {}),
    "plot retrieval --gradcam": (
        ["plot", "retrieval", "eval_dir", "--gradcam"],
        "vlp.runs.evaluation.explain:run_retrieval_gradcam",
        [],
        {},
    ),
    "index": (
        ["index", "photos", "--checkpoint", "c", "--out", "o"],
        "vlp.search:run_index",
        SimpleNamespace(lines=lambda: []),
        {},
    ),
    "search": (["search", "idx", "a red circle"], "vlp.search:run_search", "", {}),
    "serve": (
        ["serve", "idx", "--host", "127.0.0.1", "--port", "0", "--layer", "1", "--device", "cpu"],
        "vlp.serve:open_server",
        SimpleNamespace(app=SimpleNamespace(index=[]), url="http://127.0.0.1:1/", serve_until_interrupted=lambda: None),
        {},
    ),
    "make-world": (
        ["make-world", "--out", "o"],
        "vlp.world:generate_world",
        {},
        {"vlp.world:format_world_files": _anything},
    ),
}


def _replace(monkeypatch: pytest.MonkeyPatch, target: str, value: Any) -> Any:
    """Replace ``module:name`` by ``value``; returns what was there."""
    module, name = target.split(":")
    mod = importlib.import_module(module)
    real = getattr(mod, name)
    monkeypatch.setattr(mod, name, value)
    return real


def _recorder(real: Callable[..., Any], result: Any, calls: list[dict[str, Any]]) -> Callable[..., Any]:
    """A stand-in of ``real`` with its signature (what :func:`call` reads) that checks its keyword
    arguments bind to ``real`` (a given name ``real`` lacks, a required parameter left out: TypeError),
    appends them to ``calls`` and returns ``result``."""

    @functools.wraps(real)
    def record(**kwargs: Any) -> Any:
        inspect.signature(real).bind(**kwargs)
        calls.append(kwargs)
        return result

    return record


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_option_of_the_command_reaches_its_run_function(
    case: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    argv, target, result, others = CASES[case]
    monkeypatch.chdir(tmp_path)
    for name, value in others.items():
        _replace(monkeypatch, name, value)
    calls: list[dict[str, Any]] = []
    module, name = target.split(":")
    real = getattr(importlib.import_module(module), name)
    _replace(monkeypatch, target, _recorder(real, result, calls))
    assert main(argv) == 0
    assert len(calls) == 1


def test_every_command_that_calls_a_run_function_has_a_case() -> None:
    """A command added with a handler that uses ``call`` is added to :data:`CASES` too."""
    parser = build_parser()
    handlers = {p.get_default("func") for _, p in walk(parser)} - {None}
    calling = {h for h in handlers if "call(" in inspect.getsource(h)}
    covered = {parser.parse_args(argv).func for argv, *_ in CASES.values()}
    assert calling - covered == set()
