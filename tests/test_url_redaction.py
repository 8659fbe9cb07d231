"""Secrets never printed (issue 52, item 5): redaction parses a URL (its user part, its query
parameters that carry secrets) instead of matching text up to a space or a quote, so a password
with a space, a quote, an ``@``, a ``?`` or a ``#`` is blotted out of a refusal, of the command
line's error line and of any message; and a ``pipe:`` command's secret must come from an
environment variable the shell expands at run time (``pipe:curl -u "$USER:$PASS" ...``), so
``config.yaml``, ``run_info.json`` and ``state.json`` keep ``$PASS``: a literal one (``-u
user:pass``, ``--user``, ``--password``, a header, a URL's user part) is refused in one line."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

import tests.data.shard_servers as servers
from tests.data.shard_servers import http_server
from tests.data.test_img2dataset_shards import write_img2dataset
from tests.helpers import ROOT, SHAPES_TINY, TINY_ALBEF_32, pretrain
from vlp.cli import main
from vlp.config import PretrainConfig, load_config
from vlp.errors import ConfigError, DataError
from vlp.remote.shard_urls import shard_urls
from vlp.remote.url_credentials import SECRET_PARAMS, redacted, refusal, secret_in_url

#: passwords that the old text match cut short: each piece of one must never be printed
PASSWORDS = [
    "Sp4ce Pw0rd",
    "it's m1ne",
    's4y "ch33se"',
    "b0th ' xnd \" qQq",
    "p@ssw0rd w1th",
    "p?ssw0rd",
    "p#ssw0rd",
    "t4b\th3re",
]


def pieces(secret: str) -> list[str]:
    """The words of ``secret`` (of three characters or more) that must not appear."""
    return [w for w in secret.replace("'", " ").replace('"', " ").replace("\t", " ").split() if len(w) >= 3]


def free_of(secret: str, text: str) -> bool:
    return all(p not in text for p in pieces(secret))


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_password_with_a_space_or_a_quote_is_refused_without_being_printed(
    password: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://bob:{password}@h.example/{{00000..00003}}.tar"
    assert secret_in_url(url) is not None
    with pytest.raises(DataError) as e:
        shard_urls(url)
    assert "holds credentials" in str(e.value) and free_of(password, str(e.value)), str(e.value)
    with pytest.raises(ConfigError) as c:
        load_config(PretrainConfig, ROOT / SHAPES_TINY, ["data.format=webdataset", f"data.train=[{url!r}]"])
    assert free_of(password, str(c.value)), str(c.value)
    assert main(["data", "check", url]) == 2
    err = capsys.readouterr().err
    assert "holds credentials" in err and err.count("\n") == 1 and free_of(password, err), err


MESSAGES = [  # how vlp's messages put a URL: bare, with !r, in a list's repr, in a quoted command
    "cannot read {url}: connection reset",
    "cannot read {url}",
    "data.train entry {url!r}: not a .tar URL",
    "shards {urls!r} hold no readable samples",
    "command 'pipe:curl -s {url} | cat' failed",
]


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("message", MESSAGES)
def test_redacted_blots_out_a_password_in_any_message(password: str, message: str) -> None:
    url = f"https://bob:{password}@h.example/cc/00000.tar"
    text = message.format(url=url, urls=[url, "https://h.example/cc/00001.tar"])
    out = redacted(text)
    assert free_of(password, out) and "***@h.example/cc/00000.tar" in out, out
    assert redacted(out) == out  # the error line redacts a refusal again: nothing more is cut


@pytest.mark.parametrize("name", ["api_key", "apikey", "key", "password", "passwd", "secret", "token", "sig"])
def test_secret_query_keys_are_refused_and_never_printed_by_the_not_a_tar_message(name: str) -> None:
    """``?api_key=`` / ``?password=`` were printed in the "not a .tar URL" message: a URL holding
    one is refused first, naming the parameter, with its value as ***."""
    assert name in SECRET_PARAMS
    for url in (f"https://h.example/x?{name}=vlpTOPsecret", f"https://h.example/x.tar?a=1&{name.upper()}=vlpTOPsecret"):
        with pytest.raises(DataError) as e:
            shard_urls(url)
        text = str(e.value)
        assert f"query parameter {name!r}" in text and "vlpTOPsecret" not in text and "=***" in text, text
        assert "vlpTOPsecret" not in redacted(f"cannot read {url}: 403") and "vlpTOPsecret" not in redacted(repr(url))


def test_a_query_secret_with_a_space_or_quote_in_a_quoted_url_is_blotted_out() -> None:
    for value in ("Aa1 Bb2 Cc3", "it'sXyz", 'x"yZZ'):
        text = f"data.train entry {'https://h.example/x.tar?password=' + value!r} is wrong"
        assert free_of(value, redacted(text)), redacted(text)


# ----------------------------------------------------------------------------- pipe: commands

LITERAL = "vlpPIPEsecret"
PIPE_REFUSED = [
    f"pipe:curl -s -u bob:{LITERAL} https://h.example/{{00000..00003}}.tar",
    f"pipe:curl -s -u 'bob:{LITERAL} x' https://h.example/00000.tar",
    f"pipe:curl -s --user bob:{LITERAL} https://h.example/00000.tar",
    f"pipe:curl -s --user=bob:{LITERAL} https://h.example/00000.tar",
    f"pipe:curl -s -ubob:{LITERAL} https://h.example/00000.tar",
    f"pipe:curl -fsu bob:{LITERAL} https://h.example/00000.tar",
    f"pipe:curl -s -u {LITERAL}: https://h.example/00000.tar",  # a token as the user name
    f"pipe:curl -s -u 'bob:$NOT_EXPANDED{LITERAL}' https://h.example/00000.tar",  # single quotes: literal
    f"pipe:curl -s -u bob:\\$ESCAPED{LITERAL} https://h.example/00000.tar",
    f"pipe:wget -qO- --password={LITERAL} https://h.example/00000.tar",
    f"pipe:wget -qO- --http-password {LITERAL} https://h.example/00000.tar",
    f"pipe:curl -s -H 'Authorization: Bearer {LITERAL}' https://h.example/00000.tar",
    f"pipe:curl -s -H 'X-Api-Key: {LITERAL}' https://h.example/00000.tar",
    f"pipe:curl -s 'https://bob:{LITERAL} x@h.example/00000.tar'",
]
PIPE_ACCEPTED = [
    'pipe:curl -s -u "$VLP_USER:$VLP_PASS" https://h.example/{00000..00003}.tar',
    "pipe:curl -s --user=alice:$VLP_PASS https://h.example/00000.tar",
    'pipe:curl -s -u "$(cat /run/secrets/vlp_user)" https://h.example/00000.tar',  # the file holds user:password
    'pipe:curl -s -H "Authorization: Bearer $VLP_TOKEN" https://h.example/00000.tar',
    'pipe:wget -qO- --password="$VLP_PASS" https://h.example/00000.tar',
    "pipe:gsutil -u my-billing-project cat gs://bucket/00000.tar",  # -u without a colon: not a password
    "pipe:cat /data/cc/00000.tar | sort -u",
]


@pytest.mark.parametrize("entry", PIPE_REFUSED)
def test_a_literal_secret_in_a_pipe_command_is_refused_saying_to_use_an_environment_variable(entry: str) -> None:
    found = secret_in_url(entry)
    assert found is not None and "in the command" in found
    with pytest.raises(ConfigError) as e:
        load_config(PretrainConfig, ROOT / SHAPES_TINY, ["data.format=webdataset", f"data.train=[{entry!r}]"])
    text = str(e.value)
    assert text.startswith("config key 'data.train': entry ") and "\n" not in text, text
    assert LITERAL not in text and "environment variable" in text and '-u "$USER:$PASS"' in text, text
    assert redacted(text) == text  # the error line redacts it again: nothing of the advice is cut
    with pytest.raises(DataError) as d:
        shard_urls(entry)
    assert LITERAL not in str(d.value)
    assert LITERAL not in redacted(entry) and LITERAL not in redacted(f"command {entry!r} failed"), redacted(entry)


@pytest.mark.parametrize("entry", PIPE_ACCEPTED)
def test_a_pipe_commands_secret_from_an_environment_variable_is_accepted_as_written(entry: str) -> None:
    assert secret_in_url(entry) is None and refusal(entry) is None
    cfg = load_config(PretrainConfig, ROOT / SHAPES_TINY, ["data.format=webdataset", f"data.train=[{entry!r}]"])
    assert cfg.data.train == [entry]  # kept as written: the shell expands it when the command runs
    assert shard_urls(entry)


def test_a_secret_the_config_resolves_from_the_environment_is_refused_without_printing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``${oc.env:NAME}`` is the config's own interpolation: resolved when the config loads, so the
    password would be written to config.yaml; it is refused as a literal, and not printed."""
    monkeypatch.setenv("VLP_TEST_PASS", LITERAL)
    entry = "pipe:curl -s -u bob:${oc.env:VLP_TEST_PASS} https://h.example/00000.tar"
    with pytest.raises(ConfigError) as e:
        load_config(PretrainConfig, ROOT / SHAPES_TINY, ["data.format=webdataset", f"data.train=[{entry!r}]"])
    assert "environment variable" in str(e.value) and LITERAL not in str(e.value), str(e.value)


def basic_auth(user: str, password: str) -> object:
    """shard_servers' request handler, answering 401 to a request without HTTP basic authentication."""
    plain = servers._handler
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def handler(state: servers.ShardServer) -> type:
        class Handler(plain(state)):  # type: ignore[misc]
            def _serve(self, body: bool) -> None:
                if self.headers.get("Authorization") != expected:
                    self.send_error(401)
                    return
                super()._serve(body)

        return Handler

    return handler


def test_the_documented_pipe_with_an_environment_secret_trains_and_writes_no_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/data.md's way: ``pipe:curl -fsS -u "$USER:$PASS" URL``, the password in the environment.
    Two steps from a server that wants basic authentication; config.yaml keeps ``$VLP_TEST_PASS``,
    and no file of the run, nor anything printed, holds the password."""
    password = "vlp pass'word\"42"
    monkeypatch.setenv("VLP_TEST_USER", "bob")
    monkeypatch.setenv("VLP_TEST_PASS", password)
    monkeypatch.setattr(servers, "_handler", basic_auth("bob", password))
    folder = write_img2dataset(tmp_path / "cc")
    run = tmp_path / "run"
    common = ["data.format=webdataset", "data.batch_size=4", "data.num_workers=0", "train.progress=false"]
    common += ["train.steps=2", "train.ckpt_every=2", "train.log_every=1", "train.warmup_steps=0"]
    common += [*TINY_ALBEF_32, "data.shuffle_buffer=4", "data.train_num_samples=20"]
    with http_server(folder) as server:
        entry = f'pipe:curl -fsS -u "$VLP_TEST_USER:$VLP_TEST_PASS" {server.url}/{{00000..00003}}.tar'
        assert pretrain(run, repr(entry), *common) == 0
    printed = capsys.readouterr()
    written = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert b"$VLP_TEST_USER:$VLP_TEST_PASS" in (run / "config.yaml").read_bytes()
    assert {"config.yaml", "run_info.json", "state.json"} <= {p.name for p in written}
    assert not [p for p, data in written.items() if password.encode() in data]
    assert password not in printed.out + printed.err


def test_a_backends_exception_text_is_redacted_where_vlp_prints_it(capsys):
    """A server can hand back a URL vlp never saw (a redirect to a presigned URL): the text of a
    backend's exception goes through ``redacted`` where vlp names what went wrong (``reason_of``), and the
    data warnings printed straight to stderr (a skipped shard or sample) are redacted too."""
    from vlp.data.shards import warn_skipped
    from vlp.remote.shard_urls import reason_of

    signed = "https://bucket.s3.amazonaws.com/a.tar?X-Amz-Credential=AKIAXX&X-Amz-Signature=deadbeef1234"
    reason = reason_of(OSError(f"redirected to {signed}"))
    assert "deadbeef1234" not in reason and "AKIAXX" not in reason and "bucket.s3.amazonaws.com" in reason
    warn_skipped("a bad shard (3 bad samples)", OSError("cannot read https://bob:hunter2@host/x.tar: reset"))
    err = capsys.readouterr().err
    assert "hunter2" not in err and err.startswith("vlp data: skipped a bad shard (3 bad samples): ")


def test_a_zoo_mirror_with_a_token_is_not_printed_by_vlp_zoo_list(monkeypatch):
    """``VLP_ZOO_MIRROR`` (or ``VLP_ZOO_URL_*``) may carry a token; ``vlp zoo list`` prints every
    download URL, redacted."""
    from vlp.interop.zoo import format_pretrained

    monkeypatch.setenv("VLP_ZOO_MIRROR", "https://mirror.example/albef?token=s3cr3tvalue")
    table = format_pretrained()
    assert "mirror.example" in table and "s3cr3tvalue" not in table
