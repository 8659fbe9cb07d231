"""Credentials written into shard URLs and ``pipe:`` commands: found (:func:`secret_in_url`), refused
with a message that names the entry with the secret replaced by ``***`` (:func:`refusal`), and blotted
out of any text (:func:`redacted`). One rule for the config check, the shard readers and the command
line's error line; this module imports nothing of vlp (callers raise their own error type).

A URL is parsed, not matched up to a space or a quote: a password may hold spaces, quotes, ``@``,
``/``, ``?`` or ``#``, and all of it is blotted out. What counts as a credential in a URL
(``scheme://...``):

- a **user part**: anything before an ``@`` in the authority (``user:password@host``, ``token@host``,
  ``user@host`` alone: a user name is often a token, and S3/GCS bucket names cannot hold an ``@``),
  or an authority with a ``:`` that is not a port (``s3://AKIA...:se/cret@bucket``: a secret holding
  ``/``, ``?`` or ``#``) when an ``@`` follows; it ends at the last such ``@``;
- a **query parameter** that carries a secret, by name, case-insensitively: see
  :data:`SECRET_PARAMS`.

A ``pipe:COMMAND`` entry is split into shell words (quotes and escapes as the shell reads them). Its
secrets must come from environment variables that the shell expands when the command runs
(``pipe:curl -u "$USER:$PASS" ...``): the config, ``run_info.json`` and ``state.json`` then keep
``$PASS``. A literal secret is a credential: in a URL of the command (by the rules above), in a
user option's password (:data:`USER_OPTIONS`, ``-u user:pass``; with no password, the user name, a
token), in a password option (:data:`PASSWORD_OPTIONS`) and in a header that carries one
(:data:`SECRET_HEADERS`, ``-H 'Authorization: Bearer ...'``). Anything else in a command line is
not recognised (a command's own profile, ``~/.netrc``, ``AWS_PROFILE`` hold no secret in the line).
"""

from __future__ import annotations

import re
import shlex
from typing import Optional
from urllib.parse import unquote

PIPE = "pipe:"

#: Query parameters that carry a credential or a signature (compared lower-case).
SECRET_PARAMS = frozenset(
    {
        "api_key",
        "apikey",
        "api-key",
        "key",
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "auth",
        "password",
        "passwd",
        "pwd",
        "secret",
        "client_secret",
        "signature",
        "sig",
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "x-goog-signature",
        "x-goog-credential",
    }
)
#: Options (curl, wget) whose value is ``USER:PASSWORD``: the password is the secret (the user name
#: when there is no password); a value without ``:`` is not judged (``gsutil -u PROJECT``).
USER_OPTIONS = frozenset({"-u", "--user", "-U", "--proxy-user"})
#: Options whose whole value is a secret.
PASSWORD_OPTIONS = frozenset({"--password", "--http-password", "--ftp-password", "--proxy-password", "--oauth2-bearer"})
#: HTTP headers that carry a secret (compared lower-case): its value, after an optional scheme word
#: (``Bearer``, ``Basic``, ``token``), is the secret.
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "x-auth-token", "private-token"}
)

#: Where credentials go instead of a URL (the end of every refusal).
WHERE_INSTEAD = (
    "give credentials through the environment instead: S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
    "AWS_PROFILE; GCS: GOOGLE_APPLICATION_CREDENTIALS; HTTP(S): headers in fsspec's config, e.g. "
    'FSSPEC_HTTP=\'{"headers": {"Authorization": "..."}}\'; pipe: an environment variable the shell expands '
    'when the command runs, e.g. pipe:curl -u "$USER:$PASS" ... (the config keeps $PASS)'
)

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_PORT = re.compile(r":\d*$")
#: a value the shell expands whole: ``$NAME``, ``${...}``, ``$(...)``, one or more of them
_EXPANDED = re.compile(r"(?:\$\w+|\$\{[^{}]*\}|\$\([^()]*\))+")
_LITERAL_DOLLAR = "\0"  # a ``$`` the shell does not expand (quoted or escaped), in a word's value
_HEADER = re.compile(r"(?:^|=)\s*([A-Za-z0-9_-]+)\s*:\s*(.*)$", re.DOTALL)
_AFTER_QUOTE = frozenset(" \t\n\r,;:.!?)]}'\"")


# ----------------------------------------------------------------------------- one URL


def _user_part_end(url: str) -> int:
    """The index of the ``@`` that ends ``url``'s user part (module doc); -1 when it has none."""
    start = url.index("://") + 3
    rest = re.split(r"[?#]", url[start:], maxsplit=1)[0]
    authority = rest.split("/", 1)[0]
    if "@" in authority:
        return start + authority.rfind("@")
    host_port = authority if not authority.startswith("[") else authority.partition("]")[2]
    at = url.rfind("@", start)
    if ":" in host_port and not _PORT.search(host_port) and at >= 0:
        return at  # a password holding "/", "?" or "#": to the last "@"
    return -1


def _query_params(url: str) -> list[tuple[int, int, str]]:
    """``(start, end, name)`` of each query parameter's value in ``url`` (positions in ``url``; the
    query starts after the user part, so a ``?`` in a password is no query)."""
    q = url.find("?", max(_user_part_end(url), 0))
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


def _is_expanded(value: str) -> bool:
    """Whether ``value`` is only what the shell expands (``$PASS``, ``$(cat FILE)``): no literal."""
    return bool(_EXPANDED.fullmatch(value))


def _user_secret(userinfo: str) -> str:
    """The secret of ``user:password`` (or of ``token``): the password, else the user part."""
    user, _, password = userinfo.partition(":")
    return password or user


def _url_secret(url: str, shell: bool = False) -> Optional[str]:
    """What credential the one URL ``url`` holds, in words; None when none. ``shell``: a URL of a
    ``pipe:`` command, whose secrets may be variables the shell expands."""
    at = _user_part_end(url)
    if at >= 0 and not (shell and _is_expanded(_user_secret(url[url.index("://") + 3 : at]))):
        return "a user name, password or token before the host"
    for s, e, name in _query_params(url):
        if name in SECRET_PARAMS and not (shell and _is_expanded(url[s:e])):
            return f"the query parameter {name!r}, which carries a secret"
    return None


def redact_url(url: str) -> str:
    """The one URL ``url`` (the whole string, spaces and quotes included) with its user part and
    the values of its :data:`SECRET_PARAMS` replaced by ``***``."""
    if "://" not in url:
        return url
    cuts = [(s, e) for s, e, name in _query_params(url) if name in SECRET_PARAMS]
    at = _user_part_end(url)
    if at >= 0:
        cuts.insert(0, (url.index("://") + 3, at))
    for s, e in reversed(cuts):
        url = url[:s] + "***" + url[e:]
    return url


# ----------------------------------------------------------------------------- pipe: commands


def _dollar_group(command: str, i: int) -> int:
    """The end of the ``$(...)`` starting at ``i`` (nested parentheses counted)."""
    depth, j = 0, i + 1
    while j < len(command):
        depth += {"(": 1, ")": -1}.get(command[j], 0)
        j += 1
        if depth == 0:
            break
    return j


def _double_quoted(command: str, i: int, value: list[str]) -> int:
    """Read the ``"..."`` starting at ``i`` into ``value``; the index after it."""
    j = i + 1
    while j < len(command) and command[j] != '"':
        if command[j] == "\\" and j + 1 < len(command) and command[j + 1] in '$`"\\':
            value.append(_LITERAL_DOLLAR if command[j + 1] == "$" else command[j + 1])
            j += 2
        else:
            value.append(command[j])
            j += 1
    return j + 1


def shell_words(command: str) -> list[tuple[int, int, str]]:
    """``(start, end, value)`` of each word of the shell command ``command``: the value as the
    command receives it before expansion (quotes removed, escapes applied; a ``$`` that the shell
    does not expand, single-quoted or escaped, is ``\\0``). ``|&;<>()`` separate words; unbalanced
    quotes end at the end of the command."""
    words, i, n = [], 0, len(command)
    while i < n:
        if command[i].isspace() or command[i] in "|&;<>()":
            i += 1
            continue
        start, value = i, []
        while i < n and not command[i].isspace() and command[i] not in "|&;<>()":
            c = command[i]
            if c == "'":
                end = command.find("'", i + 1)
                end = n if end < 0 else end
                value.append(command[i + 1 : end].replace("$", _LITERAL_DOLLAR))
                i = end + 1
            elif c == '"':
                i = _double_quoted(command, i, value)
            elif c == "\\" and i + 1 < n:
                value.append(_LITERAL_DOLLAR if command[i + 1] == "$" else command[i + 1])
                i += 2
            elif command.startswith("$(", i):
                j = _dollar_group(command, i)
                value.append(command[i:j])
                i = j
            else:
                value.append(c)
                i += 1
        words.append((start, min(i, n), "".join(value)))
    return words


def _option_value(words: list[tuple[int, int, str]], k: int, names: frozenset[str]) -> Optional[tuple[int, str, str]]:
    """``(index of the word holding it, value, option)`` when word ``k`` is one of the options
    ``names``: ``--opt VALUE``, ``--opt=VALUE``, ``-u VALUE``, ``-uVALUE``, ``-fsu VALUE`` (flags
    before it); else None. An attached value is the end of word ``k``."""
    w = words[k][2]
    if w.startswith("--"):
        name, eq, value = w.partition("=")
        if name not in names:
            return None
        return (k, value, name) if eq else (k + 1, words[k + 1][2], name) if k + 1 < len(words) else None
    if not w.startswith("-"):
        return None
    for i, letter in enumerate(w[1:], 1):
        if not letter.isalpha():
            return None
        if f"-{letter}" in names:
            if w[i + 1 :]:
                return k, w[i + 1 :], f"-{letter}"
            return (k + 1, words[k + 1][2], f"-{letter}") if k + 1 < len(words) else None
    return None


def _redacted_user(value: str, user_option: bool) -> str:
    """``user:***`` (``***:`` for a token as the user name), or ``***`` for a password option."""
    user, colon, password = value.partition(":")
    if not user_option or not colon:
        return "***"
    return f"{user}:***" if password else f"***{colon}"


def _option_secret(words: list[tuple[int, int, str]], k: int) -> Optional[tuple[int, str, str]]:
    """``(index, what, redacted value)`` of the word holding a literal secret given to the option at
    word ``k`` (:data:`USER_OPTIONS`, :data:`PASSWORD_OPTIONS`); None when there is none."""
    for names, user_option in ((USER_OPTIONS, True), (PASSWORD_OPTIONS, False)):
        found = _option_value(words, k, names)
        if found is None or (user_option and ":" not in found[1]):
            continue
        j, value, opt = found
        if not _is_expanded(_user_secret(value) if user_option else value):
            word = words[j][2]
            what = f"a literal password or token given to {opt}" if user_option else f"a literal value given to {opt}"
            return j, what, word[: len(word) - len(value)] + _redacted_user(value, user_option)
    return None


def _header_expanded(value: str) -> bool:
    """Whether a secret header's value is an expanded variable, after an optional scheme word."""
    parts = value.split()
    return bool(parts) and len(parts) <= 2 and _is_expanded(parts[-1])


def _word_secrets(words: list[tuple[int, int, str]]) -> list[tuple[int, str, str]]:
    """``(index of the word, what it holds, the word's value redacted)`` for each literal secret of a
    command's words (module doc)."""
    found = []
    for k, (_, _, w) in enumerate(words):
        option = _option_secret(words, k)
        if option:
            found.append(option)
        header = _HEADER.search(w)
        if header and header.group(1).lower() in SECRET_HEADERS and not _header_expanded(header.group(2)):
            found.append((k, f"a literal {header.group(1)} header", w[: header.start(2)] + "***"))
        m = _SCHEME.search(w)
        reason = _url_secret(w[m.start() :], shell=True) if m else None
        if m and reason:
            found.append((k, reason, w[: m.start()] + redact_url(w[m.start() :])))
    return found


def _redacted_command(command: str) -> str:
    """``command`` (a shell command line) with each word that holds a literal secret rewritten with
    the secret as ``***`` (:func:`shell_words`; the word re-quoted)."""
    words = shell_words(command)
    redacted_words = {k: value for k, _, value in _word_secrets(words)}
    for k in sorted(redacted_words, reverse=True):
        s, e, _ = words[k]
        command = command[:s] + shlex.quote(redacted_words[k].replace(_LITERAL_DOLLAR, "$")) + command[e:]
    return command


# ----------------------------------------------------------------------------- entries and text


def secret_in_url(entry: str) -> Optional[str]:
    """What credential the URL (or ``pipe:COMMAND``) ``entry`` holds, in words; None when it holds
    none that vlp recognises (module doc). Text that is no URL holds none."""
    if entry.startswith(PIPE):
        found = _word_secrets(shell_words(entry[len(PIPE) :]))
        return f"{found[0][1]}, in the command" if found else None
    return _url_secret(entry) if "://" in entry else None


def redact_entry(entry: str) -> str:
    """A ``data.train`` entry (a URL, a ``pipe:`` command, a path) with its secrets as ``***``,
    parsed as a whole: no part of a secret is left, whatever it holds."""
    if entry.startswith(PIPE):
        return PIPE + _redacted_command(entry[len(PIPE) :])
    return redact_url(entry)


def _url_end(line: str, start: int, quote: str) -> int:
    """Where a URL whose authority starts at ``start`` of ``line`` ends. Quoted (``quote``, as
    ``repr`` or a shell writes it): at the closing quote, one that ends a word. Bare: after its
    user part (to the last ``@`` of what can be its authority, spaces and quotes included), at the
    first space or quote."""
    if quote:
        i = start
        while i < len(line):
            if line[i] == "\\":
                i += 2
                continue
            if line[i] == quote and (i + 1 == len(line) or line[i + 1] in _AFTER_QUOTE):
                return i
            i += 1
        return len(line)
    anchor, authority = start, re.split(r"[/?#]", line[start:], maxsplit=1)[0]
    if "@" in authority:
        anchor = start + authority.rfind("@")
    else:
        first = re.split(r"[\s'\"]", authority, maxsplit=1)[0]
        host_port = first if not first.startswith("[") else first.partition("]")[2]
        if ":" in host_port and not _PORT.search(host_port) and "@" in line[start:]:
            anchor = line.rfind("@")
    end = re.compile(r"[\s'\"]").search(line, anchor)
    return end.start() if end else len(line)


def _redacted_urls(line: str) -> str:
    """``line`` with each URL in it redacted (:func:`redact_url`, bounded by :func:`_url_end`)."""
    out, pos = [], 0
    while (m := _SCHEME.search(line, pos)) is not None:
        before = line[m.start() - 1] if m.start() > 0 else ""
        end = _url_end(line, m.end(), before if before in "'\"" else "")
        out += [line[pos : m.start()], redact_url(line[m.start() : end])]
        pos = max(end, m.end())
    return "".join(out) + line[pos:]


_VALUE = r"('[^']*'?|\"[^\"]*\"?|[^\s'\"]+)"
_USER_TEXT = re.compile(r"(?<![\w-])(-[A-Za-z]*[uU](?:\s+|(?=[^\s=]))|--(?:proxy-)?user(?:=|\s+))" + _VALUE)
_PASSWORD_TEXT = re.compile(r"(?<![\w-])(--(?:http-|ftp-|proxy-)?password(?:=|\s+)|--oauth2-bearer(?:=|\s+))" + _VALUE)
_HEADER_TEXT = re.compile(r"\b(" + "|".join(sorted(SECRET_HEADERS)) + r")(\s*:\s*)([^'\"\n]*)", re.IGNORECASE)


def _redacted_option(m: re.Match[str], user_option: bool) -> str:
    """An option and its value in text, the value's literal secret as ``***``."""
    value = m.group(2)
    q = value[0] if value[0] in "'\"" else ""
    inner = value[len(q) :].rstrip(q) if q else value
    secret = _user_secret(inner) if user_option else inner
    if (user_option and ":" not in inner) or (q != "'" and _is_expanded(secret)):
        return m.group(0)
    return m.group(1) + q + _redacted_user(inner, user_option) + (q if value.endswith(q) and len(value) > 1 else "")


def redacted(text: str) -> str:
    """``text`` (a URL, a command line, an error message) with every credential in it as ``***``:
    each URL's user part and secret query values (the URL bounded by its quotes, or, bare, by the
    end of its user part and then a space), a literal ``-u``/``--user`` password or password option,
    and a secret header's value (:data:`SECRET_HEADERS`). A backstop for text vlp did not build
    itself: a message naming an entry uses :func:`redact_entry`, which parses the entry whole."""
    lines = [_redacted_urls(line) for line in text.splitlines(keepends=True)]
    text = "".join(lines)
    text = _USER_TEXT.sub(lambda m: _redacted_option(m, True), text)
    text = _PASSWORD_TEXT.sub(lambda m: _redacted_option(m, False), text)
    return _HEADER_TEXT.sub(
        lambda m: m.group(0) if _header_expanded(m.group(3)) else m.group(1) + m.group(2) + "***", text
    )


def refusal(entry: str, where: str = "data.train entry") -> Optional[str]:
    """The one-line message refusing ``entry`` when it holds a credential (it names the entry
    redacted, never the secret, and where credentials go instead); None when it holds none."""
    found = secret_in_url(entry)
    if found is None:
        return None
    return (
        f"{where} {redact_entry(entry)!r} holds credentials ({found}); vlp refuses them in URLs and commands, "
        f"which it writes to config.yaml and its messages: {WHERE_INSTEAD}"
    )
