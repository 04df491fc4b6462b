"""The registry: validated keys, duplicates naming both sources, explicit overrides, helpful lookups."""
from __future__ import annotations

import types

import pytest

import ndcost
from ndcost import manager
from ndcost.errors import RegistrationError, UnknownKey
from ndcost.registry import Registry, Source, validate_key

A = Source(distribution="dist-a", module="pkg_a.plugin", version="1.0")
B = Source(distribution="dist-b", module="pkg_b.plugin", version="2.0")
C = Source(distribution="dist-c", module="pkg_c.plugin", version="3.0")


def _registry(*registrations):
    """A frozen registry from (source, key, value, override) in the order given."""
    registry = Registry()
    for source, key, value, override in registrations:
        registry.callback(source)(key, value, override=override)
    registry.freeze()
    return registry


def test_duplicate_names_both_sources():
    with pytest.raises(RegistrationError) as err:
        _registry((A, "optimizer/lion", 1, False), (B, "optimizer/lion", 2, False))
    message = str(err.value)
    for fragment in ("optimizer/lion", "dist-a", "pkg_a.plugin", "dist-b", "pkg_b.plugin", "override=True"):
        assert fragment in message


@pytest.mark.parametrize("order", ["base first", "override first"])
def test_override_wins_regardless_of_order(order):
    base, over = (A, "optimizer/lion", "base", False), (B, "optimizer/lion", "over", True)
    registry = _registry(*((base, over) if order == "base first" else (over, base)))
    assert registry.get("optimizer/lion") == "over"
    entry = registry.entry("optimizer/lion")
    assert entry.override and entry.source == B and entry.overrides == A
    assert [e.key for e in registry.overrides()] == ["optimizer/lion"]


def test_two_overrides_conflict():
    with pytest.raises(RegistrationError) as err:
        _registry((A, "storage/nf4", 1, False), (B, "storage/nf4", 2, True), (C, "storage/nf4", 3, True))
    message = str(err.value)
    assert "overridden by both" in message and "dist-b" in message and "dist-c" in message


def test_override_of_nothing_is_allowed_and_reported():
    registry = _registry((A, "optimizer/muon", 1, True))
    assert registry.get("optimizer/muon") == 1
    assert registry.entry("optimizer/muon").overrides is None


@pytest.mark.parametrize("key", ["lion", "Optimizer/lion", "optimizer/Lion", "optimizer/", "/lion",
                                 "optimizer/li on", "9opt/lion", "", None, 3, "optimizer//lion"])
def test_invalid_keys_refused(key):
    with pytest.raises(RegistrationError, match="namespace/name"):
        validate_key(key)
    with pytest.raises(RegistrationError):
        Registry().add(key, 1, source=A)


@pytest.mark.parametrize("key", ["optimizer/lion", "formula/attention.params.mla", "hardware/h200-sxm",
                                 "contract/cuda_sdpa", "a/b/c"])
def test_valid_keys(key):
    assert validate_key(key) == key


def test_none_value_refused():
    with pytest.raises(RegistrationError, match="no value"):
        Registry().add("optimizer/x", None, source=A)


def test_unknown_key_lists_close_keys():
    registry = _registry((A, "optimizer/adamw", 1, False), (A, "optimizer/adam", 2, False),
                         (A, "storage/bf16", 3, False))
    with pytest.raises(UnknownKey) as err:
        registry.get("optimizer/adamw8bit")
    assert "optimizer/adamw8bit" in str(err.value) and "optimizer/adamw" in str(err.value)
    assert isinstance(err.value, KeyError)
    assert registry.find("optimizer/nope") is None
    assert registry.names("optimizer") == ["adam", "adamw"]
    assert registry.keys("storage") == ["storage/bf16"]


def test_late_conflicting_registration_leaves_no_trace():
    registry = _registry((A, "optimizer/lion", 1, False))
    with pytest.raises(RegistrationError):
        registry.add("optimizer/lion", 2, source=B)
    assert registry.get("optimizer/lion") == 1
    registry.add("optimizer/muon", 3, source=B)          # a later, non-conflicting one still works
    assert registry.get("optimizer/muon") == 3


def test_real_registry_has_the_foundation_keys(registry):
    for key in ("optimizer/adamw", "optimizer/adam", "optimizer/sgd", "optimizer/adagrad", "storage/bf16",
                "storage/int4", "storage/uint6", "accounting/training_bytes", "accounting/pack_6bit",
                "hardware/h200"):
        assert key in registry, key
    entry = registry.entry("optimizer/adamw")
    assert entry.source.distribution == "ndcost" and entry.source.module == "ndcost.plugins.optimizers"


# ---------------------------------------------------------------------------
# through the plugin manager: the same rules with whole plugins
# ---------------------------------------------------------------------------
def _plugin(name, key, value, override=False):
    module = types.ModuleType(name)

    @ndcost.hookimpl
    def ndcost_register(register):
        register(key, value, override=override)

    module.ndcost_register = ndcost_register
    return module


@pytest.mark.parametrize("order", [("base", "over"), ("over", "base")])
def test_manager_override_wins_in_either_load_order(order):
    plugins = {"base": _plugin("plug_base", "optimizer/lion", "base"),
               "over": _plugin("plug_over", "optimizer/lion", "over", override=True)}
    loaded = manager.load(extra_modules={name: plugins[name] for name in order})
    assert loaded.registry.get("optimizer/lion") == "over"
    entry = loaded.registry.entry("optimizer/lion")
    assert entry.source.module == "plug_over" and entry.overrides.module == "plug_base"


def test_manager_override_of_a_builtin():
    loaded = manager.load(extra_modules={"mine": _plugin("my_adamw", "optimizer/adamw", "mine", override=True)})
    entry = loaded.registry.entry("optimizer/adamw")
    assert entry.value == "mine" and entry.overrides.distribution == "ndcost"


def test_manager_duplicate_of_a_builtin_names_both():
    with pytest.raises(RegistrationError) as err:
        manager.load(extra_modules={"mine": _plugin("my_adamw", "optimizer/adamw", "mine")})
    assert "ndcost.plugins.optimizers" in str(err.value) and "my_adamw" in str(err.value)
