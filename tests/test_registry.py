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
    """A frozen registry from (source, key, value, override) in the order given.

    Keys, duplicates and overrides are the registry's mechanics, whatever the
    values: these registries declare no contracts, so placeholders stand for
    values (the contracts are tested below, with real registrations).
    """
    registry = Registry(contracts={})
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
def _opt(description, name="lion"):
    from ndcost.plugins.optimizers import Optimizer
    return Optimizer(name=name, states_per_parameter=1, description=description)


def _plugin(name, key, value, override=False):
    module = types.ModuleType(name)

    @ndcost.hookimpl
    def ndcost_register(register):
        register(key, value, override=override)

    module.ndcost_register = ndcost_register
    return module


@pytest.mark.parametrize("order", [("base", "over"), ("over", "base")])
def test_manager_override_wins_in_either_load_order(order):
    plugins = {"base": _plugin("plug_base", "optimizer/lion", _opt("base")),
               "over": _plugin("plug_over", "optimizer/lion", _opt("over"), override=True)}
    loaded = manager.load(extra_modules={name: plugins[name] for name in order})
    assert loaded.registry.get("optimizer/lion").description == "over"
    entry = loaded.registry.entry("optimizer/lion")
    assert entry.source.module == "plug_over" and entry.overrides.module == "plug_base"


def test_manager_override_of_a_builtin():
    mine = _opt("mine", name="adamw")
    loaded = manager.load(extra_modules={"mine": _plugin("my_adamw", "optimizer/adamw", mine, override=True)})
    entry = loaded.registry.entry("optimizer/adamw")
    assert entry.value is mine and entry.overrides.distribution == "ndcost"


def test_manager_duplicate_of_a_builtin_names_both():
    with pytest.raises(RegistrationError) as err:
        manager.load(extra_modules={"mine": _plugin("my_adamw", "optimizer/adamw", _opt("mine", name="adamw"))})
    assert "ndcost.plugins.optimizers" in str(err.value) and "my_adamw" in str(err.value)


# ---------------------------------------------------------------------------
# contracts: a value must offer what the core reads from its namespace (ndcost.protocols)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("key,value,missing", [
    ("optimizer/x", 42, "states_per_parameter (float)"),
    ("optimizer/x", {"states_per_parameter": 2}, "states_per_parameter (float)"),
    ("schedule/zb", "1f1b", "in_flight()"),
    ("runtime/fast", 1.5, "attention (str)"),
    ("hardware/h300", "h200", "ndcost.values.Hardware"),
    ("family/toy", object(), "layer_parameters()"),
    ("storage/nf4", 4, "tensor_bytes()"),
    ("collective/all_gather", "ring", "seconds()"),
    ("checkpoint_policy/mine", ("mm",), "op_policy()"),
    ("contract/mine", "flash", "implementation (str)"),
    ("attention_kernel/paged", 0, "materializes_scores (bool)"),
    ("formula/attention.params.x", 3, "callable"),
    ("accounting/x", "f", "callable"),
    ("estimator/activations/mine", object(), "records()"),
    ("estimator/flops/mine", object(), "kind_work()"),
])
def test_a_value_not_meeting_its_namespaces_contract_is_refused_naming_everything(key, value, missing):
    register = Registry().callback(A)
    with pytest.raises(RegistrationError) as err:
        register(key, value)
    message = str(err.value)
    namespace = key.rsplit("/", 1)[0]
    for fragment in (key, "dist-a", "pkg_a.plugin", f"'{namespace}/'", missing, type(value).__name__):
        assert fragment in message, (fragment, message)


def test_the_optimizer_message_reads_as_documented():
    with pytest.raises(RegistrationError) as err:
        Registry().callback(A)("optimizer/x", 42)
    assert str(err.value).startswith("optimizer/x from dist-a (pkg_a.plugin): an optimizer must have "
                                     "states_per_parameter (float)")
    assert str(err.value).count("got int 42") == 1


def test_a_refused_value_leaves_no_trace_and_the_registry_goes_on():
    from ndcost.plugins.optimizers import Optimizer

    registry = Registry()
    register = registry.callback(A)
    with pytest.raises(RegistrationError):
        register("optimizer/lion", "lion")
    register("optimizer/lion", Optimizer(name="lion", states_per_parameter=1))
    registry.freeze()
    assert registry.get("optimizer/lion").states_per_parameter == 1
    with pytest.raises(RegistrationError, match="optimizer/muon from dist-b"):  # a late one is checked too
        registry.add("optimizer/muon", 2.0, source=B)
    assert "optimizer/muon" not in registry


def test_a_partial_value_is_told_only_what_it_lacks():
    class HalfOptimizer:  # a third party's own class that forgot the step's temporaries
        name = "half"
        states_per_parameter = 1

    with pytest.raises(RegistrationError) as err:
        Registry().callback(A)("optimizer/half", HalfOptimizer())
    message = str(err.value)
    assert "step_temporaries_per_parameter (float)" in message
    assert "states_per_parameter (float)," not in message and "name (str)" not in message


def test_a_wrong_kind_is_refused_even_when_the_attribute_is_there():
    class Flagged:
        name, materializes_scores, description = "paged", 1, "1 is not a bool: say True or False"

    with pytest.raises(RegistrationError, match="materializes_scores \\(bool\\)"):
        Registry().callback(A)("attention_kernel/paged", Flagged())


def test_a_third_party_value_of_its_own_class_meeting_the_contract_is_accepted():
    class Lion:  # no ndcost base class: the contract is what the core reads, not a type
        name, states_per_parameter, step_temporaries_per_parameter = "lion", 1, 0.0

    registry = Registry()
    registry.callback(A)("optimizer/lion", Lion())
    registry.freeze()
    assert registry.get("optimizer/lion").states_per_parameter == 1


def test_namespaces_without_a_contract_keep_the_plain_rules():
    registry = Registry()
    registry.callback(A)("widget/anything", 42)
    registry.freeze()
    assert registry.get("widget/anything") == 42


def test_every_builtin_value_meets_its_contract(registry):
    from ndcost import protocols

    checked = 0
    for key, value in registry.items():
        contract = protocols.contract_for(key)
        assert contract is not None, f"{key}: every built-in namespace declares a contract"
        assert contract.refusal(value) is None, key
        if contract.protocol is not None and not contract.callable_value:
            assert isinstance(value, contract.protocol), key  # the typing Protocol says the same
        checked += 1
    assert checked == len(registry.keys())


def test_the_longest_declared_namespace_decides():
    from ndcost import protocols

    assert protocols.contract_for("estimator/flops/census").namespace == "estimator/flops"
    assert protocols.contract_for("estimator/activations/op_records").namespace == "estimator/activations"
    assert protocols.contract_for("estimator/other/x") is None
    assert protocols.contract_for("formula/attention.params.mla").namespace == "formula"


@pytest.mark.parametrize("key,value,what", [
    ("schedule/zb", "zero-bubble", "a pipeline schedule"),
    ("runtime/fast", 0.5, "a runtime profile"),
    ("optimizer/lion", {"states_per_parameter": 1}, "an optimizer"),
])
def test_manager_refuses_a_plugin_registering_a_wrong_value_naming_it(key, value, what, monkeypatch):
    from ndcost.errors import PluginLoadError

    monkeypatch.setenv("NDCOST_STRICT_PLUGINS", "1")
    # ndcost's own entry points only: a broken third party elsewhere in the environment would fail first
    real = manager._entry_points
    monkeypatch.setattr(manager, "_entry_points", lambda: [ep for ep in real() if ep.dist.name == "ndcost"])
    with pytest.raises(PluginLoadError) as err:
        manager.load(extra_modules={"bad": _plugin("bad_plugin", key, value)})
    message = str(err.value)
    for fragment in (key, "<local> (bad_plugin)", what, type(value).__name__):
        assert fragment in message, (fragment, message)
    assert isinstance(err.value.__cause__, RegistrationError)


def test_manager_drops_a_plugin_registering_a_wrong_value_and_loads_the_rest(monkeypatch):
    from ndcost.manager import PluginLoadWarning

    monkeypatch.delenv("NDCOST_STRICT_PLUGINS", raising=False)
    with pytest.warns(PluginLoadWarning, match="schedule/zb from <local> \\(bad_plugin\\)"):
        loaded = manager.load(extra_modules={"bad": _plugin("bad_plugin", "schedule/zb", "zero-bubble")})
    assert "schedule/zb" not in loaded.registry and "schedule/1f1b" in loaded.registry
    assert [p.error for p in loaded.plugins if p.name == "bad"][0].startswith("RegistrationError")
