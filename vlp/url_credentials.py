"""Credentials written into shard URLs: found (:func:`secret_in_url`), refused with a message that
names the entry with the secret replaced by ``***`` (:func:`refusal`), and blotted out of any text
(:func:`redacted`). One rule for the config check, the shard readers and the command line's error
line; this module imports nothing of vlp (callers raise their own error type).

What counts as a credential in a URL (``scheme://...``):

- a **user part**: anything before an ``@`` in the authority (``user:password@host``, ``token@host``,
  ``user@host`` alone: a user name is often a token, and S3/GCS bucket names cannot hold an ``@``),
  or an authority with a ``:`` that is not a port (``s3://AKIA...:se/cret@bucket``: a secret holding
  ``/``) when an ``@`` follows before the query;
- a **query parameter** of a signed or presigned URL, by name, case-insensitively: see
  :data:`SECRET_PARAMS`.

In a ``pipe:COMMAND`` entry, each URL of the command is judged by the same rule, and an
``Authorization:`` header (``curl -H 'Authorization: Bearer ...'``) is one too. Nothing else in a
command line is recognised: a command's secrets belong in its environment (a profile, ``~/.netrc``).
"""

from __future__ import annotations

import re
from typing import Optional
from urllib.parse import unquote

PIPE = "pipe:"

#: Query parameters that carry a credential or a signature (compared lower-case).
SECRET_PARAMS = frozenset(
    {
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "x-goog-signature",
        "x-goog-credential",
        "token",
        "access_token",
        "sig",
        "signature",
    }
)

#: Where credentials go instead of a URL (the end of every refusal).
WHERE_INSTEAD = (
    "give credentials through the environment instead: S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
    "AWS_PROFILE; GCS: GOOGLE_APPLICATION_CREDENTIALS; HTTP(S): headers in fsspec's config, e.g. "
    'FSSPEC_HTTP=\'{"headers": {"Authorization": "..."}}\'; pipe: the command\'s own environment or profile'
)

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]*")
_AUTH_HEADER = re.compile(r"(authorization\s*:\s*)[^'\"\n]*", re.IGNORECASE)
_PORT = re.compile(r":\d*$")


def _user_part_end(url: str) -> int:
    """The index of the ``@`` that ends ``url``'s user part (the last one before the query, so that
    a secret holding ``@`` or ``/`` is covered whole); -1 when it has none (module doc)."""
    start = url.index("://") + 3
    rest = re.split(r"[?#]", url[start:], maxsplit=1)[0]
    at = rest.rfind("@")
    if at < 0:
        return -1
    authority = re.split(r"/", rest, maxsplit=1)[0]
    host_port = authority if not authority.startswith("[") else authority.partition("]")[2]
    if "@" in authority or (":" in host_port and not _PORT.search(host_port)):
        return start + at
    return -1


def _query_params(url: str) -> list[tuple[int, int, str]]:
    """``(start, end, name)`` of each query parameter's value in ``url`` (positions in ``url``)."""
    q = url.find("?")
    if q < 0:
        return []
    end = url.find("#", q)
    end = len(url) if end < 0 else end
    out, pos = [], q + 1
    for part in url[q + 1 : end].split("&"):
        name, eq, _ = part.partition("=")
        if eq:
            out.append((pos + len(name) + 1, pos + len(part), unquote(name).strip().lower()))
        pos += len(part) + 1
    return out


def _url_secret(url: str) -> Optional[str]:
    if _user_part_end(url) >= 0:
        return "a user part before the host: user:password@ or token@"
    for _, _, name in _query_params(url):
        if name in SECRET_PARAMS:
            return f"the query parameter {name!r} of a signed URL"
    return None


def secret_in_url(entry: str) -> Optional[str]:
    """What credential the URL (or ``pipe:COMMAND``) ``entry`` holds, in words; None when it holds
    none that vlp recognises (module doc). Text that is no URL holds none."""
    if entry.startswith(PIPE):
        if _AUTH_HEADER.search(entry):
            return "an Authorization header in the command"
        found = [_url_secret(m.group()) for m in _URL.finditer(entry)]
        return next((f"{f}, in the command" for f in found if f), None)
    return _url_secret(entry) if "://" in entry else None


def _redacted_url(url: str) -> str:
    cuts = [(s, e) for s, e, name in _query_params(url) if name in SECRET_PARAMS]
    at = _user_part_end(url)
    if at >= 0:
        cuts.insert(0, (url.index("://") + 3, at))
    for s, e in reversed(cuts):
        url = url[:s] + "***" + url[e:]
    return url


def redacted(text: str) -> str:
    """``text`` (a URL, a command line, an error message) with every credential of every URL in it
    and every ``Authorization:`` header value replaced by ``***``."""
    text = _URL.sub(lambda m: _redacted_url(m.group()), text)
    return _AUTH_HEADER.sub(lambda m: m.group(1) + "***", text)


def refusal(entry: str, where: str = "data.train entry") -> Optional[str]:
    """The one-line message refusing ``entry`` when it holds a credential (it names the entry
    redacted, never the secret, and where credentials go instead); None when it holds none."""
    found = secret_in_url(entry)
    if found is None:
        return None
    return (
        f"{where} {redacted(entry)!r} holds credentials ({found}); vlp refuses them in URLs, which it "
        f"writes to config.yaml and its messages: {WHERE_INSTEAD}"
    )
