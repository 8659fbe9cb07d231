"""``vlp data check URL`` (issue 42, item 5): a URL shard set (HTTP, S3, GCS, all on 127.0.0.1,
tests/data/shard_servers.py) is checked like the same shards on local disk: every member of every
shard, the same problem lines; with or without stats; ``--sample N`` reads N shards; a shard that
cannot be read is one problem and the others are still checked; an unreachable bucket is one line."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.data.shard_servers import Fault, gcs_server, http_server, s3_server
from tests.data.test_img2dataset_shards import add, write_img2dataset
from vlp.cli import main

BRACE = "{00000..00003}.tar"


def rewrite(tar: Path, changes: dict[str, bytes]) -> None:
    """Rewrite ``tar`` with the members named in ``changes`` given those bytes."""
    with tarfile.open(tar) as tf:
        members = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(tar, "w") as tf:
        for name, data in members:
            add(tf, name, changes.get(name, data))


def damaged(folder: Path, stats: bool = True) -> Path:
    """img2dataset shards with a malformed JSON member and a truncated image (shard 1), and (with
    stats) a stats file that says 6 where its tar holds 5 (shard 3)."""
    write_img2dataset(folder, stats=stats)
    with tarfile.open(folder / "00001.tar") as tf:  # keys 000010000 .. 000010004
        image = tf.extractfile("000010002.png").read()  # type: ignore[union-attr]
    rewrite(folder / "00001.tar", {"000010002.png": image[: len(image) // 2], "000010003.json": b'{"caption": '})
    if stats:
        (folder / "00003_stats.json").write_text(json.dumps({"count": 7, "successes": 6}))
    return folder


def check(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, list[str]]:
    """``vlp data check ARGS`` (one image thread): its exit status and the lines it printed."""
    status = main(["data", "check", *args, "--workers", "1"])
    return status, capsys.readouterr().out.splitlines()


def same_form(lines: list[str], entry: str, base: str) -> list[str]:
    """``lines`` with the entry checked written ENTRY and the shards' folder or URL prefix left out."""
    return [line.replace(f"{entry}:", "ENTRY:").replace(base, "") for line in lines if not line.startswith("indexing ")]


# A count mismatch's hint fits where the shards are: a local folder's stats files can be deleted there; a
# store's are removed from the store, then `vlp data index` counts the tars (a run never scans URL shards).
LOCAL_HINT = "delete the folder's *_stats.json files (vlp then counts the tars in one scan)"
STORE_HINT = (
    "remove the set's *_stats.json files from the store and count the tars once with `vlp data index` on the "
    "data.train entry"
)


def as_remote(local: list[str]) -> list[str]:
    """The lines a URL set gives where the local folder gave ``local``: the same, but for the hint."""
    assert any(LOCAL_HINT in line for line in local)
    return [line.replace(LOCAL_HINT, STORE_HINT) for line in local]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return damaged(tmp_path_factory.mktemp("check") / "cc")


def test_a_url_set_gives_the_local_problem_lines(folder: Path, monkeypatch, capsys) -> None:
    status, lines = check(capsys, str(folder))
    local = same_form(lines, str(folder), f"{folder}/")
    assert status == 1 and len(local) == 5  # 3 problems, the entry, the summary
    assert ": sample '000010003': invalid 000010003.json (JSONDecodeError" in "\n".join(local)
    assert "00001.tar: sample '000010002': cannot read image 000010002.png" in "\n".join(local)
    assert "00003.tar: 5 samples, but " in "\n".join(local)
    assert local[-1] == "checked 1 file, 20 entries, 19 images: 3 errors, 0 warnings"
    with http_server(folder) as server:
        entry = f"{server.url}/{BRACE}"
        status, lines = check(capsys, entry)
        assert status == 1 and same_form(lines, entry, f"{server.url}/") == as_remote(local)
        assert {r for r in server.log if r.startswith("GET") and r.endswith(".tar")} == {
            f"GET /{k:05d}.tar" for k in range(4)
        }
    with s3_server(monkeypatch, "shards", folder):
        entry = f"s3://shards/{BRACE}"
        status, lines = check(capsys, entry)
        assert status == 1 and same_form(lines, entry, "s3://shards/") == as_remote(local)


def test_without_stats_or_an_index_samples_are_counted_while_read(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "cache"))
    bare = damaged(tmp_path / "bare", stats=False)
    status, lines = check(capsys, str(bare))  # a local folder: counted in one scan first
    local = same_form(lines, str(bare), f"{bare}/")
    assert status == 1 and local[-1] == "checked 1 file, 20 entries, 19 images: 2 errors, 0 warnings"
    with http_server(bare) as server:
        entry = f"{server.url}/{BRACE}"
        status, lines = check(capsys, entry)
        assert status == 1 and same_form(lines, entry, f"{server.url}/") == local
        assert sum(r.startswith("GET") and r.endswith(".tar") for r in server.log) == 4  # each shard read once
    entry = f"pipe:cat {bare}/{BRACE}"  # a pipe: entry has no stats at all
    status, lines = check(capsys, entry)
    assert status == 1 and same_form(lines, entry, f"pipe:cat {bare}/") == local
    assert len(list((tmp_path / "cache" / "shard_index").iterdir())) == 1  # the local folder's scan; none of the URLs


def test_sample_checks_exactly_n_shards_drawn_with_a_printed_seed(folder: Path, capsys) -> None:
    with http_server(folder) as server:
        entry = f"{server.url}/{BRACE}"
        read = []
        for seed in (3, 3, 4):
            server.log.clear()
            status, lines = check(capsys, entry, "--sample", "2", "--seed", str(seed))
            read.append({r for r in server.log if r.startswith("GET") and r.endswith(".tar")})
            assert len(read[-1]) == 2 and sum(r.startswith("GET") and r.endswith(".tar") for r in server.log) == 2
            assert lines[-1].endswith(f"; 2 of 4 shards checked, drawn at random with --seed {seed}")
            assert f"{entry}: 10 entries (img2dataset shards: 2 of 4 shards)" in lines
        assert read[0] == read[1]  # the same seed draws the same shards
        status, lines = check(capsys, entry, "--sample", "9")
        assert status == 1 and lines[-1].endswith("; 4 of 4 shards checked, drawn at random with --seed 0")
    out = folder.parent / "sampled.json"
    status, lines = check(capsys, str(folder), "--sample", "3", "--seed", "1", "--json", str(out))  # local too
    assert json.loads(out.read_text())["sampled"] == {"shards": 3, "of": 4, "seed": 1}
    assert lines[-2].endswith("; 3 of 4 shards checked, drawn at random with --seed 1")  # then: wrote OUT
    assert f"{folder}: 15 entries (img2dataset shards: 3 of 4 shards)" in lines
    for args in ([entry, "--sample", "0"], [str(folder / "00000_stats.json"), "--sample", "2"]):
        assert main(["data", "check", *args]) == 2
        assert "--sample N checks N >= 1 shards of shard folders or URL entries" in capsys.readouterr().err


def test_a_shard_that_cannot_be_read_is_one_problem_and_the_rest_are_checked(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setattr("vlp.remote.shard_urls.BACKOFF_S", 0.01)
    data = write_img2dataset(tmp_path / "cc", shards=5)
    (data / "00001.tar").unlink()  # vanished after its stats were written
    with tarfile.open(data / "00003.tar") as tf:
        cut = tf.getmember("000030002.json").offset_data + 4
    tar = (data / "00003.tar").read_bytes()
    (data / "00003.tar").write_bytes(tar[:cut])  # broken mid-stream, in a member's data
    with http_server(data) as server:
        server.faults = [Fault("00002.tar", "500")]
        entry = f"{server.url}/{{00000..00004}}.tar"
        status, lines = check(capsys, entry, "--no-images")
        assert status == 1
        named = {k: [line for line in lines if line.startswith(f"{server.url}/{k:05d}.tar: ")] for k in range(5)}
        assert [len(v) for v in named.values()] == [0, 1, 1, 1, 0]
        assert "cannot read shard: FileNotFoundError" in named[1][0]
        assert "cannot read shard: " in named[2][0] and "500" in named[2][0] and "(after 5 tries)" in named[2][0]
        assert "cannot read shard: unexpected end of data, in member 000030002.json" in named[3][0]
        assert server.log.count("GET /00002.tar") == 5 and "GET /00004.tar" in server.log  # retried, then went on
        assert lines[-1] == "checked 1 file, 12 entries, images not checked: 3 errors, 0 warnings"  # 5 + 2 + 5


def test_an_unreachable_bucket_is_one_line_and_status_2(folder: Path, monkeypatch, capsys) -> None:
    with s3_server(monkeypatch, "shards", folder):
        assert main(["data", "check", f"s3://nobucket/{BRACE}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            "vlp: error: s3://nobucket/00000.tar: no such shard (or no such bucket); expected the tars data.train names"
        ]
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(k)
        for k in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
            monkeypatch.setenv(k, str(Path(folder) / "none"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no credentials looked for beyond 127.0.0.1
        import fsspec

        fsspec.filesystem("s3").clear_instance_cache()
        assert main(["data", "check", f"s3://shards/{BRACE}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("vlp: error: s3://shards/00000_stats.json: cannot read")
        assert "credentials" in err[0].lower()


def test_a_gcs_set_gives_the_local_problem_lines(folder: Path, monkeypatch, capsys) -> None:
    status, lines = check(capsys, str(folder))
    local = same_form(lines, str(folder), f"{folder}/")
    with gcs_server(monkeypatch, "shards", folder):
        entry = f"gs://shards/{BRACE}"
        status, lines = check(capsys, entry)
        assert status == 1 and same_form(lines, entry, "gs://shards/") == as_remote(local)
        assert main(["data", "check", f"gs://nobucket/{BRACE}"]) == 2
        assert capsys.readouterr().err.startswith("vlp: error: gs://nobucket/00000.tar: no such shard")
