"""A run that reads its shards from an S3-compatible server (moto's, on 127.0.0.1; issue 42) is
killed and resumed, and gives the batches, log records and weights of an uninterrupted run
(scripts/soak.py's comparison); no file either run writes holds the server's credentials."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.data.shard_servers import S3_KEY, S3_SECRET, s3_server
from tests.helpers import load_script

soak = load_script("scripts/soak.py", "soak")
SETUP = soak.Setup(steps=6, ckpt_every=2, log_every=2)


def test_a_run_on_s3_shards_killed_mid_epoch_resumes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shards = soak.make_shards(tmp_path / "world")  # 8 shards of one image, one bad image, one bad JSON member
    for name, v in json.loads((shards / "sizes.json").read_text()).items():  # img2dataset's counts
        (shards / name.replace(".tar", "_stats.json")).write_text(json.dumps({"successes": v["images"]}))
    with s3_server(monkeypatch, "shards", shards):
        url = "s3://shards/shard-{00000..00007}.tar"  # unquoted in the list override
        ref = soak.reference(SETUP, url, tmp_path / "reference")
        assert soak.records(ref)[-1]["step"] == SETUP.steps and url in (ref / "config.yaml").read_text()
        outcome = soak.inject(SETUP, url, ref, tmp_path / "run", soak.Fault("KILL", "step", 3))
    logs = "".join(f"\n--- {p.name}:\n" + p.read_text()[-3000:] for p in sorted(tmp_path.rglob("attempt*.log")))
    assert not outcome.problems, outcome.line(SETUP) + logs
    assert outcome.resumed_at == 2
    written = [p for p in tmp_path.rglob("*") if p.is_file() and "world" not in p.relative_to(tmp_path).parts]
    assert any(p.name == "config.yaml" for p in written)
    leaks = [p for p in written if S3_KEY.encode() in p.read_bytes() or S3_SECRET.encode() in p.read_bytes()]
    assert leaks == []
