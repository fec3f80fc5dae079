"""The registry contract: names, reference first, availability with reasons, clear errors."""

import importlib

import pytest

from impl import registry
from impl._table import Entry


def test_families_in_hot_path_order():
    assert registry.families() == ("decode", "encode", "pool", "accesslog")
    assert registry.all_families() == (*registry.families(), "runtime")


@pytest.mark.parametrize("family", registry.all_families())
def test_reference_first_and_available_subset(family):
    names = registry.names(family)
    assert names[0] == registry.reference(family)
    assert len(set(names)) == len(names)
    assert set(registry.available(family)) <= set(names)


@pytest.mark.parametrize("family", registry.all_families())
def test_every_entry_points_at_a_module_file(family):
    for name in registry.names(family):
        entry = registry.entry(family, name)
        assert entry.module.startswith(f"impl.{family}."), entry
        assert importlib.util.find_spec(entry.module) is not None, f"{entry.module} is missing"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(LookupError, match="known: json, "):
        registry.create("decode", "no-such-decoder")


def test_unknown_family():
    with pytest.raises(LookupError, match="unknown family"):
        registry.names("nope")


def test_missing_dependency_is_reported_with_hint(monkeypatch):
    fake = Entry(
        "ghost", "impl.decode.json", "needs a package nobody has", ("no_such_pkg_xyz",), "fast"
    )
    package = importlib.import_module("impl.decode")
    monkeypatch.setattr(package, "IMPLEMENTATIONS", (*package.IMPLEMENTATIONS, fake))
    registry._entries.cache_clear()
    registry.unavailable_reason.cache_clear()
    try:
        assert "ghost" in registry.names("decode")
        assert "ghost" not in registry.available("decode")
        reason = registry.unavailable_reason("decode", "ghost")
        assert "no_such_pkg_xyz" in reason and "hotpath[fast]" in reason
        with pytest.raises(registry.UnavailableError, match="no_such_pkg_xyz"):
            registry.create("decode", "ghost")
    finally:
        registry._entries.cache_clear()
        registry.unavailable_reason.cache_clear()
