"""A command line that answers in a second (issue 54): ``vlp --help``, ``vlp COMMAND --help`` (every
command path of the parser) and an argument error import none of torch, transformers, timm,
open_clip, onnx and onnxruntime. Each is run in a fresh ``python`` and what it imported is read from ``sys.modules`` at its
end (or from ``-X importtime``, for the real ``python -m vlp``), not from a clock.

The parser reads light facts only: the tasks of ``vlp finetune TASK`` and ``vlp evaluate NAME`` come
from :data:`vlp.kinds.KINDS` (a plugin's kind among them); the heavy registries (runners, evaluators,
losses) are read when a command runs. Their rule agrees with those registries for the built-ins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT
from tests.test_cli_help import walk
from vlp.cli import build_parser

#: what ``vlp --help`` and an argument error must not import
HEAVY = ("torch", "transformers", "timm", "open_clip", "onnx", "onnxruntime")

#: runs ``vlp.cli.main`` on each command line of the JSON list argv[1], in one fresh process, and
#: prints, for each, the heavy modules imported so far (the first line that brings one is the culprit)
PROBE = f"""
import json, sys
from vlp.cli import main
seen = []
for argv in json.loads(sys.argv[1]):
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    seen.append([argv, status, sorted(m for m in {HEAVY!r} if m in sys.modules)])
print(json.dumps(seen))
"""

#: command lines the parser refuses (exit status 2) before any command runs
ARGUMENT_ERRORS = [
    ["nonsense"],
    ["pretrain"],
    ["finetune"],
    ["finetune", "no-such-task", "--config", "c.yaml"],
    ["evaluate", "vqa", "--checkpoint", "c"],
    ["analyze", "cocos", "--checkpoint", "c"],
    ["data", "check", "--kind", "no-such-kind", "f.json"],
    ["prepare", "coco"],
    ["export", "onnx", "runs/x"],
]


def python(args: list[str], site: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a fresh process started in the repository, ``site`` (a folder) on its path."""
    environ = {k: v for k, v in os.environ.items() if k not in ("VLP_PLUGINS", "PYTHONPATH")}
    path = os.pathsep.join(p for p in (site, str(ROOT)) if p)
    environ |= {"PYTHONPATH": path, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=environ, capture_output=True, text=True)


def probe(argvs: list[list[str]], site: str = "", **env: str) -> tuple[str, list[list]]:
    """Each command line run in order by one fresh python (:data:`PROBE`): its output, and for each
    ``[argv, exit status, heavy modules imported so far]``."""
    done = python(["-c", PROBE, json.dumps(argvs)], site, **env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(done.stdout.splitlines()[-1])


def test_python_m_vlp_help_imports_no_torch():
    done = python(["-X", "importtime", "-m", "vlp", "--help"])
    assert done.returncode == 0 and "usage: vlp" in done.stdout, done.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "vlp.cli" in imported  # the listing is the real one
    assert sorted(m for m in imported if m.split(".")[0] in HEAVY) == []


def test_every_commands_help_and_the_argument_errors_import_no_torch():
    paths = [path.split() for path, _ in walk(build_parser())]
    assert len(paths) > 50  # every command and subcommand, as in tests/cli_help_golden.json
    _, rows = probe([[*path, "--help"] for path in paths] + ARGUMENT_ERRORS)
    want = [[[*p, "--help"], 0] for p in paths] + [[argv, 2] for argv in ARGUMENT_ERRORS]
    assert [row[:2] for row in rows] == want
    assert [(argv, heavy) for argv, _, heavy in rows if heavy] == []


PLUGIN = '''"""A plugin that registers a kind and nothing heavy: the parser offers its task without torch."""
from vlp.kinds import KINDS, Kind

KINDS.register("light-task", Kind("light-task", "LIGHTABOUT", finetuned=True))
'''


def test_a_plugins_kind_is_offered_without_importing_torch(tmp_path: Path):
    (tmp_path / "light_vlp_plugin.py").write_text(PLUGIN)
    argvs = [["finetune", "--help"], ["evaluate", "--help"], ["finetune", "light-task", "--help"]]
    out, rows = probe(argvs, str(tmp_path), VLP_PLUGINS="light_vlp_plugin")
    assert out.count("LIGHTABOUT") == 2  # in the help of vlp finetune and of vlp evaluate
    assert rows == [[argv, 0, []] for argv in argvs]


def test_the_kinds_offer_the_tasks_the_heavy_registries_run():
    """``vlp finetune TASK``: the tasks with a runner and a help line; ``vlp evaluate NAME`` (generic):
    every evaluator without a command of its own, nor the same function as one (pretrain's and
    helper's evaluator is retrieval's). The parser reads neither registry, so this checks its rule."""
    from vlp.cli.evaluate import OWN_COMMANDS, generic_evaluations
    from vlp.cli.train import finetune_commands
    from vlp.kinds import KINDS
    from vlp.runs.evaluation import EVALUATORS
    from vlp.runs.training.finetune import RUNNERS

    assert [n for n, _ in finetune_commands()] == [n for n, k in KINDS.items() if n in RUNNERS and k.about]
    own = [EVALUATORS.get(n) for n in OWN_COMMANDS if n in EVALUATORS]
    generic = [n for n, e in EVALUATORS.items() if n not in OWN_COMMANDS and all(e is not o for o in own)]
    assert [n for n, _ in generic_evaluations()] == generic == ["vqa", "nlvr2", "ve"]


def test_open_clip_is_imported_only_when_an_open_clip_helper_is_used():
    """The modules that offer open_clip helpers (SRCL's helper, the feature cache, the student
    calibration) import it inside the functions that build one."""
    code = (
        "import sys\n"
        "import vlp.runs.training.pretrain, vlp.runs.training.features, vlp.runs.training.assembly\n"
        "import vlp.features.open_clip_cache, vlp.lab.helper_student, vlp.models.open_clip_helper, vlp.cli\n"
        "print('open_clip' in sys.modules, 'torch' in sys.modules)\n"
    )
    done = python(["-c", code])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True"]  # torch: the modules were imported for real


def test_an_unknown_loss_is_refused_when_vlp_analyze_cocos_runs(tmp_path: Path, capsys):
    """``--loss`` is free text to the parser (the losses register with torch); the command refuses an
    unknown one with the registered names, before it opens the checkpoint."""
    from vlp.cli import main

    argv = ["analyze", "cocos", "--checkpoint", str(tmp_path / "none"), "--data", "d.json", "--loss", "nope"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # the built-ins, and any loss a test registered
    assert len(err) == 1 and err[0].startswith(
        "vlp: error: config key 'loss.contrastive.name': unknown contrastive loss 'nope'; known: "
        "['infonce', 'triplet', 'triplet_sh', 'smoothap'"
    )
    assert not (tmp_path / "out").exists()
