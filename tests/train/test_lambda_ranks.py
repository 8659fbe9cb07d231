"""The LTD multiplier lambda is the same on every rank, under DDP and DeepSpeed ZeRO-2 (issue 17,
defect 4). lambda is kept out of the optimizer; ZeRO reduces only the optimizer's parameters, so its
gradient stayed per-rank and lambda drifted apart. The multiplier now averages its gradient over
the ranks itself."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, launch

pytestmark = pytest.mark.multiprocess  # every test here launches two processes (or uses runs that did)


@pytest.mark.parametrize("engine", ["ddp", "zero2"])
def test_lambda_is_identical_on_every_rank(engine, tmp_path):
    if engine == "zero2":
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed: pip install -e '.[deepspeed]'")
    deepspeed = "configs/deepspeed/zero2.json" if engine == "zero2" else None
    script = str(ROOT / "tests" / "train" / "lambda_ranks_script.py")
    launch([script, str(tmp_path)], processes=2, deepspeed=deepspeed, timeout=300)
    lam = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert lam[0] != 1.0  # it moved (ascent on a violated constraint)
    assert lam[0] == lam[1], lam
