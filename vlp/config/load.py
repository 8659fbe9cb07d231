"""Loading configs: YAML files, dotted command-line overrides, dict/YAML round trips, presets.

A config is built as ``defaults <- YAML file <- overrides`` where overrides look like
``train.steps=50 model.vision.depth=2``. Unknown keys and wrong types raise
:class:`ConfigError` naming the offending key and where it came from. This module knows no
schema (the dataclasses of the sibling modules); they import their checks (:func:`check_choice`,
:func:`reject_broken_rules`) from here. A message that echoes a value (an override, a YAML error)
has any URL credential in it replaced by ``***`` (:func:`vlp.remote.url_credentials.redacted`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vlp.errors import ConfigError
from vlp.remote.url_credentials import redacted

T = TypeVar("T")


def check_choice(key: str, value: Any, allowed: Collection[Any]) -> None:
    """Return nothing when ``value`` (of config key ``key``, dotted) is one of ``allowed``; otherwise
    raise :class:`ConfigError` naming the key, the value (URL credentials redacted) and the choices."""
    if value not in allowed:
        raise ConfigError(f"config key '{key}': got {redacted(repr(value))}, expected one of {list(allowed)}")


def reject_broken_rules(wrong: Sequence[str]) -> None:
    """Raise one :class:`ConfigError` listing every broken cross-section rule in ``wrong`` (each
    naming the keys to change); return nothing when ``wrong`` is empty."""
    if wrong:
        raise ConfigError("config keys: " + "; ".join(wrong))


def _merge(base: Any, other: Any, source: str) -> Any:
    try:
        return OmegaConf.merge(base, other)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        reason = redacted(str(e).splitlines()[0])
        raise ConfigError(f"{source}: config key '{key}': {reason}") from None


def _parse_overrides(overrides: Sequence[str]) -> Any:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"command-line override {redacted(repr(item))}: expected key=value, e.g. train.steps=50")
    try:
        return OmegaConf.from_dotlist([quote_brace_items(item) for item in overrides])
    except (OmegaConfBaseException, yaml.YAMLError) as e:
        raise ConfigError(f"command-line overrides: {redacted(str(e).splitlines()[0])}") from None


def refuse_repeated_keys(overrides: Sequence[str]) -> None:
    """Return nothing when every override of the command line (``key=value``; ``vlp demo --full``'s
    ``STAGE:key=value``) sets its own key; else raise one :class:`ConfigError` naming the first key
    given more than once, how often, and two of its values: the last one would win silently. When its
    values differ only in one run of digits, it looks like an unquoted brace pattern the shell expanded
    (``data.train=[s3://b/{00000..01242}.tar]`` is 1,243 arguments to bash): the error shows that
    pattern, quoted. Overrides layered in code (a command's defaults, then the user's) are not checked."""
    values: dict[str, list[str]] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep:
            values.setdefault(key.strip(), []).append(value)
    repeated = next(((k, v) for k, v in values.items() if len(v) > 1), None)
    if repeated is None:
        return
    key, given = repeated
    shown = ", ".join(redacted(f"{key}={v}") for v in (given[0], given[-1]))
    pattern = _brace_pattern(given)
    hint = (
        f": it looks like an unquoted brace pattern the shell expanded; quote it, '{redacted(f'{key}={pattern}')}'"
        if pattern
        else ""
    )
    flag = " (--resume X is train.resume=X)" if key == "train.resume" else ""
    more = ", ..." if len(given) > 2 else ""
    raise ConfigError(
        f"command-line override: config key '{key}' given {len(given)} times ({shown}{more}); give each key "
        f"once{hint}{flag}"
    )


def _brace_pattern(values: Sequence[str]) -> str | None:
    """``values`` as the brace pattern the shell expanded into them (``[s3://b/{00000..01242}.tar]``):
    when they differ only in one run of digits and those count up (or down) by one in the order
    given, as bash writes ``{a..b}`` out; else None (``train.steps=4 train.steps=2`` is no pattern)."""
    parts = [re.split(r"(\d+)", v) for v in values]
    if len(set(map(len, parts))) != 1:
        return None
    differ = [i for i in range(len(parts[0])) if len({p[i] for p in parts}) > 1]
    if len(differ) != 1 or differ[0] % 2 == 0:  # odd indices are the runs of digits
        return None
    at = differ[0]
    digits = [p[at] for p in parts]
    numbers = [int(d) for d in digits]
    step = 1 if numbers[1] > numbers[0] else -1
    if any(b - a != step for a, b in zip(numbers, numbers[1:])):
        return None
    widths = {len(d) for d in digits}
    pad = widths.pop() if len(widths) == 1 and any(d.startswith("0") for d in digits) else 0
    lo, hi = (f"{n:0{pad}d}" for n in (numbers[0], numbers[-1]))
    return "".join(parts[0][:at]) + f"{{{lo}..{hi}}}" + "".join(parts[0][at + 1 :])


def quote_brace_items(item: str) -> str:
    """``key=[a/{0..7}.tar, b]`` with each unquoted list item that holds a brace pattern quoted, so
    that YAML reads it as a string, not a flow mapping (``data.train=[s3://b/{00000..00041}.tar]``);
    commas inside braces stay in their item; unbalanced braces raise one :class:`ConfigError`.
    Anything else is returned as it is."""
    key, _, value = item.partition("=")
    if not (value.startswith("[") and value.endswith("]") and "{" in value) or "'" in value or '"' in value:
        return item
    items, depth, start = [], 0, 1
    for i, ch in enumerate(value[1:-1], 1):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(value[start:i])
            start = i + 1
    items.append(value[start:-1])
    if depth != 0:
        raise ConfigError(
            f"command-line override {redacted(repr(item))}: unbalanced braces in the list; a brace pattern is "
            "{00000..00041} or {a,b}, e.g. 'data.train=[s3://bucket/{00000..00041}.tar]' (quoted for the shell)"
        )
    return f"{key}=[" + ", ".join(f"'{x.strip()}'" if "{" in x else x for x in items) + "]"


#: what a saved config's tree (a checkpoint's ``state.json``, a run's ``config.yaml``) goes through before
#: it is rebuilt or compared: a config module that moved a key registers its migration here
#: (:func:`vlp.config.loss.migrate_saved_contrastive`)
SAVED_MIGRATIONS: list[Callable[[Mapping[str, Any]], dict[str, Any]]] = []
#: what a user's tree (a YAML file's, the overrides') is checked by before it is merged: a moved key
#: is one ConfigError naming its new place (:func:`vlp.config.loss.refuse_moved_contrastive`)
USER_CHECKS: list[Callable[[Mapping[str, Any], str], None]] = []


def migrated(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data``, a saved config's tree, through every :data:`SAVED_MIGRATIONS` (a copy)."""
    out = dict(data)
    for migrate in SAVED_MIGRATIONS:
        out = migrate(out)
    return out


def _check_user_tree(tree: Any, source: str) -> None:
    """Every :data:`USER_CHECKS` on ``tree`` (a DictConfig of a user's keys) from ``source``."""
    plain = OmegaConf.to_container(tree) if isinstance(tree, DictConfig) else tree
    if not isinstance(plain, Mapping):
        return  # not a mapping of keys: the merge names that error
    for check in USER_CHECKS:
        check({str(k): v for k, v in plain.items()}, source)


def load_config(schema: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Build a ``schema`` instance from defaults, an optional YAML file and dotted overrides. A
    schema with a ``check_given(given)`` method is then handed the keys the file and the overrides
    set (``{dotted key: "PATH" or "command line"}``), for rules about what was set."""
    cfg = OmegaConf.structured(schema)
    given: dict[str, str] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = OmegaConf.load(path)
        except Exception as e:  # yaml.YAMLError and friends
            raise ConfigError(f"{path}: not valid YAML: {redacted(str(e))}") from None
        if not isinstance(data, DictConfig):
            raise ConfigError(f"{path}: expected a mapping of config keys at the top level, got a list")
        _check_user_tree(data, str(path))
        cfg = _merge(cfg, data, str(path))
        given.update(dict.fromkeys(_keys(data), str(path)))
    if overrides:
        parsed = _parse_overrides(overrides)
        _check_user_tree(parsed, "command-line override")
        cfg = _merge(cfg, parsed, "command-line override")
        given.update(dict.fromkeys(_keys(parsed), "command line"))
    try:
        obj = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise ConfigError(f"config key '{key}': {redacted(str(e).splitlines()[0])}") from None
    check = getattr(obj, "check_given", None)
    if check is not None:  # rules about which keys were set, not only their values
        check(given)
    return obj  # type: ignore[return-value]


def _keys(tree: DictConfig, prefix: str = "") -> list[str]:
    """The dotted leaf keys set in ``tree`` (a YAML file's or the overrides' own keys)."""
    out: list[str] = []
    for k, v in tree.items():
        key = prefix + str(k)
        if isinstance(v, DictConfig) and len(v):
            out += _keys(v, key + ".")
        else:
            out.append(key)
    return out


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML (what is written to ``run_dir/config.yaml``)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_dict(schema: type[T], data: dict[str, Any]) -> T:
    """Rebuild a config object from a plain dict (e.g. read back from a checkpoint; its moved keys
    migrated, :func:`migrated`)."""
    merged = _merge(OmegaConf.structured(schema), OmegaConf.create(migrated(data)), "saved config")
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


def apply_overrides(cfg: T, overrides: Sequence[str]) -> T:
    """A copy of the config object ``cfg`` with dotted overrides applied (same checks as loading)."""
    if not overrides:
        return cfg
    parsed = _parse_overrides(overrides)
    _check_user_tree(parsed, "command-line override")
    merged = _merge(OmegaConf.structured(cfg), parsed, "command-line override")
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config object ``cfg`` as a plain nested dict (the inverse of :func:`from_dict`)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg))  # type: ignore[return-value]


def resolved(cfg: Any, presets: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Fill the ``None`` fields of a vision/text config from its preset."""
    out = dict(presets[cfg.preset])
    for k, v in vars(cfg).items():
        if v is not None or k not in out:
            out[k] = v
    return out
