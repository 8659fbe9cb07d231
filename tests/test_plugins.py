"""Plugins (vlp/plugins.py): modules named by the ``vlp.plugins`` entry points and ``VLP_PLUGINS``
imported once before the ``vlp`` parser is built; a missing or failing one is one error naming it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

import vlp.plugins as plugins
from vlp.cli import main
from vlp.plugins import PluginError, load_plugins


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A clean plugin state and ``tmp_path`` on sys.path (modules written there are importable)."""
    monkeypatch.setattr(plugins, "_loaded", [])
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("zz_plugin")]:
        del sys.modules[name]


def _module(root: Path, name: str, body: str) -> None:
    (root / f"{name}.py").write_text(body)


def test_modules_of_vlp_plugins_are_imported_in_order_and_once(fresh: Path) -> None:
    _module(fresh, "zz_plugin_a", "import builtins\nbuiltins.zz_seen = getattr(builtins, 'zz_seen', []) + ['a']\n")
    _module(fresh, "zz_plugin_b", "import builtins\nbuiltins.zz_seen = getattr(builtins, 'zz_seen', []) + ['b']\n")
    import builtins

    try:
        assert load_plugins({"VLP_PLUGINS": "zz_plugin_b, zz_plugin_a"}) == ("zz_plugin_b", "zz_plugin_a")
        assert load_plugins({"VLP_PLUGINS": "zz_plugin_a,zz_plugin_b"}) == ("zz_plugin_b", "zz_plugin_a")
        assert builtins.zz_seen == ["b", "a"]  # type: ignore[attr-defined]
    finally:
        del builtins.zz_seen  # type: ignore[attr-defined]


def test_an_entry_point_of_the_group_is_imported_and_its_callable_called(fresh: Path) -> None:
    _module(fresh, "zz_plugin_ep", "calls = []\ndef register():\n    calls.append(1)\n")
    info = fresh / "zz_plugin_ep-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zz-plugin-ep\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[vlp.plugins]\ntoy = zz_plugin_ep:register\n")
    assert load_plugins({}) == ("vlp.plugins:toy",)
    assert load_plugins({}) == ("vlp.plugins:toy",)
    assert sys.modules["zz_plugin_ep"].calls == [1]


def test_a_missing_plugin_is_one_error_naming_it_and_the_variable(fresh: Path) -> None:
    with pytest.raises(
        PluginError, match=r"plugin 'zz_plugin_gone' \(named in VLP_PLUGINS='zz_plugin_gone'\): not found"
    ):
        load_plugins({"VLP_PLUGINS": "zz_plugin_gone"})
    _module(fresh, "zz_plugin_needs", "import zz_plugin_absent_dependency\n")
    with pytest.raises(PluginError, match=r"plugin 'zz_plugin_needs' .*: no module 'zz_plugin_absent_dependency'"):
        load_plugins({"VLP_PLUGINS": "zz_plugin_needs"})


def test_a_plugin_that_fails_on_import_stops_the_command_with_one_line(
    fresh: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _module(fresh, "zz_plugin_bad", "raise RuntimeError('the plugin is broken')\n")
    monkeypatch.setenv("VLP_PLUGINS", "zz_plugin_bad")
    assert main(["zoo", "list"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "vlp: error: plugin 'zz_plugin_bad' (named in VLP_PLUGINS='zz_plugin_bad') failed on import: "
        "RuntimeError: the plugin is broken"
    ]
