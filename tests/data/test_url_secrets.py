"""Credentials never leak (issue 42, item 4): a URL holding credentials (a user part, a signed URL's
query, an Authorization header in a pipe: command) is refused by the config check, by shard_urls()
and by `vlp data check`, with one line that names it with the secret as ***; the override parser's
own errors never echo a secret; a refused `vlp pretrain` writes nothing; a run on the local S3
server (tests/data/shard_servers.py) writes no credential of its environment into any file."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import tests.data.shard_servers as servers
from tests.data.shard_servers import S3_KEY, S3_SECRET, http_server, s3_server
from tests.data.test_img2dataset_shards import write_img2dataset
from tests.helpers import ROOT, SHAPES_TINY, pretrain
from vlp.cli import main
from vlp.config import PretrainConfig, load_config
from vlp.errors import ConfigError, DataError
from vlp.remote.shard_urls import open_url, shard_urls
from vlp.remote.url_credentials import SECRET_PARAMS, redacted, secret_in_url

SECRET = "vlpSECRETsecret/with+slash"  # what must never appear (as an AWS secret, it holds / and +)
REFUSED = [
    f"s3://AKIAVLPTEST:{SECRET}@bucket/{{00000..00003}}.tar",  # key:secret, the secret holding /
    f"https://user:{SECRET}@127.0.0.1:1/cc/00000.tar",
    f"https://{SECRET.replace('/', '')}@127.0.0.1:1/cc/00000.tar",  # user@ alone (a token as user name)
    *(f"https://127.0.0.1:1/cc/{{00000..00003}}.tar?a=1&{p}={SECRET}" for p in sorted(SECRET_PARAMS)),
    f"gs://bucket/x.tar?X-GOOG-SIGNATURE={SECRET}",  # names are compared case-insensitively
    f"https://127.0.0.1:1/x.tar?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA%2F{SECRET}&X-Amz-Signature={SECRET}",
    f"pipe:curl -s -H 'Authorization: Bearer {SECRET}' https://127.0.0.1:1/{{00000..00003}}.tar",
    f"pipe:curl -s https://me:{SECRET}@127.0.0.1:1/00000.tar",
    f"pipe:curl -s 'https://127.0.0.1:1/00000.tar?sig={SECRET}'",
]
ACCEPTED = [
    "s3://bucket/{00000..00003}.tar",
    "s3://bucket/release@v2/00000.tar",  # an @ in the key, not before the bucket
    "https://127.0.0.1:8080/a@b/00000.tar",  # a port, then an @ in the path
    "https://[::1]:8080/00000.tar",
    "pipe:curl -s 'https://127.0.0.1:1/00000.tar?part=1&signed=no&sigma=2'",  # no secret's name
    "pipe:aws s3 cp s3://bucket/00000.tar -",
]


def secret_free(text: str) -> bool:
    """Whether ``text`` holds no piece of the secret (nor the token built from it)."""
    return all(s not in text for s in (SECRET, SECRET.replace("/", ""), SECRET.split("/")[1]))


@pytest.mark.parametrize("url", REFUSED)
def test_each_form_is_refused_by_shard_urls_in_one_line_without_the_secret(url: str) -> None:
    assert secret_in_url(url) is not None
    with pytest.raises(DataError) as e:
        shard_urls(url)
    text = str(e.value)
    assert "\n" not in text and secret_free(text) and "***" in text and "holds credentials" in text
    assert "AWS_ACCESS_KEY_ID" in text and "GOOGLE_APPLICATION_CREDENTIALS" in text
    assert secret_free(redacted(url)) and redacted(url) != url


@pytest.mark.parametrize("url", ACCEPTED)
def test_urls_without_credentials_pass(url: str) -> None:
    assert secret_in_url(url) is None and redacted(url) == url
    assert shard_urls(url)


@pytest.mark.parametrize("url", REFUSED)
def test_the_config_check_refuses_each_form_naming_the_key(url: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(PretrainConfig, ROOT / SHAPES_TINY, ["data.format=webdataset", f'data.train=["{url}"]'])
    assert str(e.value).startswith("config key 'data.train': entry ") and secret_free(str(e.value))


def test_a_config_file_with_a_signed_url_is_refused_and_its_errors_do_not_echo_one(tmp_path: Path) -> None:
    f = tmp_path / "run.yaml"
    f.write_text(f"data:\n  format: webdataset\n  train: ['https://h.example/00000.tar?Signature={SECRET}']\n")
    with pytest.raises(ConfigError, match="query parameter 'signature'") as e:
        load_config(PretrainConfig, f)
    assert secret_free(str(e.value))
    f.write_text(f"train:\n  steps: https://user:{SECRET}@h.example/00000.tar\n")  # the wrong type
    with pytest.raises(ConfigError, match="train.steps") as e:
        load_config(PretrainConfig, f)
    assert secret_free(str(e.value)) and "***" in str(e.value)


URL = f"https://user:{SECRET}@127.0.0.1:1/00000.tar"


@pytest.mark.parametrize(
    "overrides",
    [
        [f"data.train=[{URL.replace('00000', '{00000..00003')}]"],  # unbalanced braces
        [f"data.train=[{URL}, ]]"],  # YAML cannot parse it
        [URL],  # no key=value
        [f"train.steps={URL}"],  # the wrong type
        [f"data.format={URL}"],  # not one of the choices
        [f"data.nosuchkey={URL}"],  # no such key
    ],
)
def test_the_override_parsers_own_errors_do_not_echo_the_secret(overrides: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(PretrainConfig, ROOT / SHAPES_TINY, overrides)
    assert secret_free(str(e.value)), str(e.value)


def test_a_refused_pretrain_exits_2_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    status = pretrain(run, f"s3://AKIAVLPTEST:{SECRET}@bucket/{{00000..00003}}.tar", "data.format=webdataset")
    out, err = capsys.readouterr()
    assert status == 2 and err.startswith("vlp: error: config key 'data.train'") and err.count("\n") == 1
    assert secret_free(out + err)
    assert not run.exists()  # refused before the run directory, config.yaml or run_info.json
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert not any(SECRET.encode() in p.read_bytes() for p in written)


def test_data_index_and_data_check_refuse_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["data", "index", REFUSED[1]], ["data", "check", REFUSED[0]], ["data", "check", REFUSED[-1]]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert "holds credentials" in err and err.count("\n") == 1 and secret_free(out + err)


def test_the_error_line_blots_out_a_url_credential_from_any_user_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(entry: str, caption_key: str) -> None:  # a user error from anywhere naming a URL with credentials
        raise DataError(f"cannot read {URL}")

    monkeypatch.setattr("vlp.data.shard_format.index_entry", fail)
    assert main(["data", "index", "s3://bucket/00000.tar"]) == 2
    assert capsys.readouterr().err == "vlp: error: cannot read https://***@127.0.0.1:1/00000.tar\n"


def test_run_info_records_the_command_line_without_url_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    from vlp.train.logging import run_info

    monkeypatch.setattr(sys, "argv", ["vlp", "pretrain", f"model.pretrained={URL}", "train.steps=2"])
    argv = run_info()["argv"]
    assert argv[1:] == ["pretrain", "model.pretrained=https://***@127.0.0.1:1/00000.tar", "train.steps=2"]


def authorizing(token: str) -> object:
    """shard_servers' request handler, answering 401 to a request without ``Authorization: token``."""
    plain = servers._handler

    def handler(state: servers.ShardServer) -> type:
        class Handler(plain(state)):  # type: ignore[misc]
            def _serve(self, body: bool) -> None:
                if self.headers.get("Authorization") != token:
                    self.send_error(401)
                    return
                super()._serve(body)

        return Handler

    return handler


def test_http_credentials_go_in_fsspecs_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal's advice for HTTP(S) works: FSSPEC_HTTP's headers reach the server."""
    import fsspec
    import fsspec.config

    monkeypatch.setattr("vlp.remote.shard_urls.BACKOFF_S", 0.01)
    monkeypatch.setattr(servers, "_handler", authorizing(f"Bearer {SECRET}"))
    folder = write_img2dataset(tmp_path / "cc", shards=1)
    with http_server(folder) as server:
        url = f"{server.url}/00000.tar"
        with pytest.raises(OSError), open_url(url) as f:  # fsspec: FileNotFoundError for a 401
            f.read()
        conf: dict = {}  # what fsspec makes of the variable when it is imported
        fsspec.config.set_conf_env(
            conf, {"FSSPEC_HTTP": json.dumps({"headers": {"Authorization": f"Bearer {SECRET}"}})}
        )
        monkeypatch.setitem(fsspec.config.conf, "http", conf["http"])
        try:
            with open_url(url) as f:
                assert f.read() == (folder / "00000.tar").read_bytes()
        finally:
            fsspec.filesystem("http").clear_instance_cache()


#: not credentials: the local server's address, its region, a CA bundle's path (set on some machines)
NOT_SECRET = ("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_CA_BUNDLE")


def test_an_s3_run_writes_no_credential_of_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two steps from the local S3 server with a checkpoint, then a resume refused for a URL with
    the keys (nothing rewritten): no file under the run directory, and nothing the runs printed,
    holds any AWS_*/GOOGLE_* value of the environment."""
    folder = write_img2dataset(tmp_path / "cc")
    run = tmp_path / "run"
    monkeypatch.setenv("AWS_SESSION_TOKEN", "vlptestsessiontoken000000")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "vlp-test-google-key.json"))
    common = ["data.format=webdataset", "data.batch_size=4", "data.num_workers=0", "train.progress=false"]
    common += ["train.steps=2", "train.ckpt_every=2", "train.log_every=1", "train.warmup_steps=0"]
    common += ["model.vision.depth=1", "model.text.layers=1", "model.text.fusion_layers=1"]
    common += ["model.vision.img_size=32", "model.queue_size=16", "data.shuffle_buffer=4"]
    with s3_server(monkeypatch, "shards", folder):
        assert pretrain(run, "s3://shards/{00000..00003}.tar", *common) == 0
        before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
        keyed = f"s3://{S3_KEY}:{S3_SECRET}@shards/{{00000..00003}}.tar"
        four = [o.replace("train.steps=2", "train.steps=4") for o in common]  # a key is given once
        assert pretrain(run, keyed, *four, "train.resume=auto") == 2
    printed = capsys.readouterr()
    written = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert written == before  # the refused resume wrote nothing
    names = {p.name for p in written}
    assert {"config.yaml", "run_info.json", "metrics.jsonl", "state.json", "model.safetensors"} <= names
    assert b"s3://shards/{00000..00003}.tar" in (run / "config.yaml").read_bytes()
    assert len((run / "metrics.jsonl").read_text().splitlines()) >= 2
    values = [v for k, v in os.environ.items() if k.startswith(("AWS_", "GOOGLE_")) and k not in NOT_SECRET]
    assert S3_KEY in values and S3_SECRET in values and len(values) >= 4
    leaks = [(str(p.relative_to(run)), v) for p, data in written.items() for v in values if v.encode() in data]
    assert leaks == [] and not any(v in printed.out + printed.err for v in values)
