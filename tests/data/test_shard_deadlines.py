"""Issue 42, item 3: a stalled or trickling server, a shard that vanished after listing, missing
credentials. A stall past data.url_read_timeout_s is retried, then breaks the shard; a trickle past
data.url_shard_timeout_s breaks it at once; a vanished shard is not retried; each costs the shard's
samples as bad samples, named once, and the loader goes on. Missing credentials fail at start-up
with one line. Servers on 127.0.0.1 only (tests/data/shard_servers.py)."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.data.shard_servers import Fault, http_server, s3_server
from tests.data.test_img2dataset_shards import PER_SHARD, loader, tiny_run, write_img2dataset
from vlp.config.data import DataConfig
from vlp.data.shard_format import read_sizes
from vlp.errors import ConfigError, DataError
from vlp.remote.url_deadlines import UrlTimeouts

BRACE = "{00000..00003}.tar"
SKIPPED = re.compile(r"skipped a bad shard \((\d+) bad samples?\): (.*)")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_img2dataset(tmp_path_factory.mktemp("deadlines") / "cc")


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("vlp.remote.shard_urls.BACKOFF_S", 0.01)


def skipped(err: str) -> list[tuple[int, str]]:
    """(bad samples, message) of each broken shard the loader named on stderr."""
    return [(int(m.group(1)), m.group(2)) for m in map(SKIPPED.search, err.splitlines()) if m]


def read_all(entry: str, timeouts: UrlTimeouts, workers: int) -> tuple[list[dict], float]:
    """An epoch of ``entry`` (bad samples skipped) and the seconds it took."""
    t0 = time.monotonic()
    batches = list(loader([entry], on_bad="skip", num_workers=workers, timeouts=timeouts))
    return batches, time.monotonic() - t0


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stall_past_the_read_deadline_is_retried_then_costs_the_shard(folder: Path, workers: int, capfd) -> None:
    with http_server(folder) as server:
        server.faults = [Fault("00002.tar", "stall", after=0, seconds=4.0)]
        batches, took = read_all(f"{server.url}/{BRACE}", UrlTimeouts(read_s=0.5, shard_s=30.0), workers)
        gets = server.log.count("GET /00002.tar")
    assert len(batches) == 5 and all(len(b["ids"]) == 4 for b in batches)  # the loader went on
    named = skipped(capfd.readouterr().err)
    assert len(named) == 1 and sum(b["bad"] for b in batches) == named[0][0] == PER_SHARD
    assert f"{server.url}/00002.tar: cannot read shard: no byte for 0.5 s (after 5 tries)" in named[0][1]
    assert gets >= 5  # the first read and 4 retries (a reader that reads the shard again tries again)
    assert took < 15


@pytest.mark.parametrize("workers", [0, 2])
def test_a_trickle_past_the_shard_deadline_breaks_the_shard_at_once(folder: Path, workers: int, capfd) -> None:
    size = (folder / "00002.tar").stat().st_size
    with http_server(folder) as server:  # 256 B every 0.05 s: the shard would take size / 5120 s
        server.faults = [Fault("00002.tar", "trickle", step=256, seconds=0.05)]
        assert size / 5120 > 2.0  # well past the deadline
        batches, took = read_all(f"{server.url}/{BRACE}", UrlTimeouts(read_s=2.0, shard_s=0.5), workers)
        gets = server.log.count("GET /00002.tar")
    assert len(batches) == 5 and all(len(b["ids"]) == 4 for b in batches)
    named = skipped(capfd.readouterr().err)
    assert len(named) == 1 and 1 <= named[0][0] <= PER_SHARD  # the samples not read by the deadline
    assert sum(b["bad"] for b in batches) == named[0][0]
    assert f"{server.url}/00002.tar: cannot read shard: not read within 0.5 s" in named[0][1]
    assert "tries" not in named[0][1] and gets <= 2  # not retried (a reader may read it once more)
    assert took < 15


def test_a_pipe_gets_both_deadlines(folder: Path, capfd) -> None:
    tar, good = folder / "00002.tar", f"pipe:cat {folder}/{{00000,00001,00003}}.tar"
    cases = [  # the command stops after 1000 bytes for 5 s / for 0.4 s
        (f"pipe:(head -c 1000 {tar}; sleep 5; tail -c +1001 {tar})", UrlTimeouts(1.0, 30.0), "no byte for 1 s"),
        (f"pipe:(head -c 1000 {tar}; sleep 0.4; tail -c +1001 {tar})", UrlTimeouts(5.0, 0.3), "not read within 0.3 s"),
    ]
    for entry, timeouts, reason in cases:
        t0 = time.monotonic()
        batches = list(loader([good, entry], on_bad="skip", timeouts=timeouts, num_samples=20))
        named = skipped(capfd.readouterr().err)
        assert len(named) == 1 and f"{entry}: cannot read shard: {reason}" in named[0][1], named
        assert len(batches) == 5 and time.monotonic() - t0 < 12


@pytest.mark.parametrize("store", ["http", "s3"])
def test_a_shard_that_vanished_after_listing_costs_its_samples_without_retries(
    tmp_path: Path, folder: Path, store: str, monkeypatch, capfd
) -> None:
    data = tmp_path / "cc"
    shutil.copytree(folder, data)
    if store == "http":
        with http_server(data) as server:
            ld = loader([f"{server.url}/{BRACE}"], on_bad="skip")
            (data / "00002.tar").unlink()
            batches = list(ld)
            tries = [r for r in server.log if r.endswith("/00002.tar")]
        url = f"{server.url}/00002.tar"
        assert len(tries) <= 4  # a HEAD (and fsspec's GET in its place) per pass: no retries
    else:
        import boto3

        with s3_server(monkeypatch, "shards", data) as endpoint:
            ld = loader([f"s3://shards/{BRACE}"], on_bad="skip")
            boto3.client("s3", endpoint_url=endpoint).delete_object(Bucket="shards", Key="00002.tar")
            batches = list(ld)
        url = "s3://shards/00002.tar"
    named = skipped(capfd.readouterr().err)
    assert len(batches) == 5 and len(named) == 1 and sum(b["bad"] for b in batches) == named[0][0] == PER_SHARD
    assert named[0][1].startswith(f"{url}: cannot read shard: FileNotFoundError") and "tries" not in named[0][1]


def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This process's S3 credentials gone: no keys, no profile files, no instance metadata (so
    botocore asks no address but the local server's)."""
    import fsspec

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    fsspec.filesystem("s3").clear_instance_cache()


NO_KEYS = (
    r"NoCredentialsError: Unable to locate credentials; expected S3 credentials in "
    r"AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile \(AWS_PROFILE\)"
)


def test_missing_credentials_fail_at_start_up_naming_the_url(tmp_path: Path, folder: Path, monkeypatch) -> None:
    with s3_server(monkeypatch, "shards", folder):
        no_credentials(monkeypatch, tmp_path)
        with pytest.raises(
            DataError, match=rf"^s3://shards/00000_stats.json: cannot read img2dataset's stats: {NO_KEYS}"
        ):
            read_sizes([f"s3://shards/{BRACE}"])
        with pytest.raises(DataError, match=rf"^s3://shards/00000.tar: cannot reach the shard: {NO_KEYS}"):
            read_sizes([f"s3://shards/{BRACE}"], num_samples=20)  # data.train_num_samples: asked all the same


def test_with_train_num_samples_a_wrong_bucket_fails_at_start_up(folder: Path, monkeypatch) -> None:
    with s3_server(monkeypatch, "shards", folder):
        with pytest.raises(DataError, match=r"^s3://nobucket/00000.tar: no such shard \(or no such bucket\)"):
            read_sizes([f"s3://nobucket/{BRACE}"], num_samples=20)
        with pytest.raises(DataError, match=r"^s3://nobucket/00000.tar: no such shard"):  # each entry is asked
            read_sizes([f"s3://shards/{BRACE}", f"s3://nobucket/{BRACE}"], num_samples=40)


@pytest.mark.parametrize("case", ["bucket", "credentials"])
def test_pretrain_stops_before_the_first_step_with_one_line(
    tmp_path: Path, folder: Path, case: str, monkeypatch, capfd
) -> None:
    from vlp.cli import main

    run = tmp_path / "run"
    with s3_server(monkeypatch, "shards", folder):
        if case == "credentials":
            no_credentials(monkeypatch, tmp_path)
        bucket = "shards" if case == "credentials" else "nobucket"
        extra = ["data.train_num_samples=20", "data.batch_size=4"]
        overrides = tiny_run(run, f"'s3://{bucket}/{BRACE}'", *extra)  # type: ignore[arg-type]
        assert main(["pretrain", "--config", "configs/pretrain/shapes_tiny.yaml", *overrides]) == 2
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"vlp: error: s3://{bucket}/00000.tar: ")
    expected = NO_KEYS if case == "credentials" else r"no such shard \(or no such bucket\)"
    assert re.search(expected, lines[0])
    assert "step" not in out and not (run / "metrics.jsonl").exists()


def test_the_deadlines_reach_the_reader_from_the_config(tmp_path: Path, folder: Path, capfd) -> None:
    """`vlp pretrain` with data.url_shard_timeout_s over a trickling shard, read by 2 loader workers."""
    from vlp.cli import main

    run = tmp_path / "run"
    with http_server(folder) as server:
        server.faults = [Fault("00002.tar", "trickle", step=256, seconds=0.05)]
        keys = ["data.url_shard_timeout_s=0.5", "data.url_read_timeout_s=2", "data.num_workers=2"]
        extra = ["data.max_bad_fraction=0.5", "data.batch_size=4", "data.shuffle_buffer=8", *keys]
        overrides = tiny_run(run, f"'{server.url}/{BRACE}'", *extra)  # type: ignore[arg-type]
        overrides.remove("data.num_workers=0")  # a key is given once (issue 52): 2 workers here
        overrides += ["train.steps=5", "train.log_every=5"]  # one epoch: 20 images / 4
        assert main(["pretrain", "--config", "configs/pretrain/shapes_tiny.yaml", *overrides]) == 0
    named = skipped(capfd.readouterr().err)
    assert len(named) == 1 and "00002.tar: cannot read shard: not read within 0.5 s" in named[0][1]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [5] and records[0]["bad_samples"] == named[0][0]


def test_the_deadline_keys_must_be_positive() -> None:
    for key in ("url_read_timeout_s", "url_shard_timeout_s"):
        with pytest.raises(ConfigError, match=rf"config key 'data.{key}': got 0, expected seconds > 0"):
            DataConfig(**{key: 0})
    assert (DataConfig().url_read_timeout_s, DataConfig().url_shard_timeout_s) == (60.0, 3600.0)
