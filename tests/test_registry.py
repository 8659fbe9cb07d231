"""The one registry type (vlp/registry.py): register / get / names, one error naming the key."""

from __future__ import annotations

import pytest

from vlp.errors import ConfigError
from vlp.registry import Registry, UnknownName


def test_entries_register_by_decorator_or_call_and_list_in_order() -> None:
    reg: Registry[object] = Registry("widget", key="model.widget")

    @reg.register("b")
    def b() -> int:
        return 2

    assert b() == 2 and reg.get("b") is b  # the decorator returns what it decorates
    a = reg.register("a", "the a entry")
    assert a == "the a entry" and reg.names() == ("b", "a") and "a" in reg and "c" not in reg and len(reg) == 2
    assert reg.items() == (("b", b), ("a", "the a entry"))


def test_an_unknown_name_is_one_error_naming_the_key_the_name_and_the_known_names() -> None:
    reg: Registry[int] = Registry("widget", key="model.widget")
    reg.register("one", 1)
    with pytest.raises(UnknownName, match=r"^config key 'model.widget': unknown widget 'two'; known: \['one'\]$") as e:
        reg.get("two")
    assert isinstance(e.value, ConfigError) and isinstance(e.value, KeyError)
    with pytest.raises(UnknownName, match=r"^unknown kind 'x'; known: \[\]$"):
        Registry[int]("kind").get("x")


def test_a_name_registers_once_unless_replaced_and_unregisters() -> None:
    reg: Registry[int] = Registry("widget")
    reg.register("one", 1)
    with pytest.raises(ValueError, match="widget 'one' is registered already"):
        reg.register("one", 2)
    reg.register("one", 3, replace=True)
    assert reg.get("one") == 3 and reg.unregister("one") == 3 and reg.names() == ()
    with pytest.raises(UnknownName):
        reg.unregister("one")
    with reg.registered("tmp", 5):
        assert reg.get("tmp") == 5
    assert "tmp" not in reg
