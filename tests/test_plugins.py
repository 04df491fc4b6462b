"""The plugin manager: entry points of any distribution, broken plugins, the essential set, a third party.

Fake distributions are a ``<name>-<version>.dist-info`` folder (METADATA and
entry_points.txt) next to their module on a temporary ``sys.path`` entry,
which is all ``importlib.metadata`` needs to find an entry point.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ndcost import manager
from ndcost.errors import PluginLoadError, StalePluginSet
from ndcost.manager import PluginLoadWarning

from _helpers import make_dist, pip_install

REPO = Path(__file__).resolve().parents[1]


GOOD = """
    import ndcost
    from ndcost.plugins.optimizers import Optimizer

    @ndcost.hookimpl
    def ndcost_register(register):
        register("optimizer/good_opt", Optimizer(name="good_opt", states_per_parameter=1))
"""
BROKEN_IMPORT = """
    raise RuntimeError("this plugin is broken on purpose")
"""
BROKEN_HOOK = """
    import ndcost
    from ndcost.plugins.optimizers import Optimizer

    @ndcost.hookimpl
    def ndcost_register(register):
        register("optimizer/half_done", Optimizer(name="half_done", states_per_parameter=1))
        raise ZeroDivisionError("failed halfway through registering")
"""


@pytest.fixture
def fake_dists(tmp_path, monkeypatch, fresh):
    make_dist(tmp_path / "site", "ndcost-broken-example", {"ndcost_broken_example": BROKEN_IMPORT},
              {"broken": "ndcost_broken_example"})
    make_dist(tmp_path / "site", "ndcost-halfway", {"ndcost_halfway": BROKEN_HOOK}, {"halfway": "ndcost_halfway"})
    make_dist(tmp_path / "site", "ndcost-good-example", {"ndcost_good_example": GOOD},
              {"good": "ndcost_good_example"}, version="2.5")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield
    for name in ("ndcost_broken_example", "ndcost_halfway", "ndcost_good_example"):
        sys.modules.pop(name, None)


def test_builtins_load_as_entry_points(fresh):
    loaded = manager.plugins()
    builtins = {p.name: p for p in loaded.plugins if p.distribution == "ndcost"}
    assert manager.ESSENTIAL <= set(builtins)
    assert builtins["optimizers"].module == "ndcost.plugins.optimizers"
    assert "optimizer/adamw" in builtins["optimizers"].registered
    assert all(p.error is None for p in builtins.values())


def test_broken_plugin_warns_naming_distribution_and_error_while_the_rest_load(fake_dists):
    with pytest.warns(PluginLoadWarning) as record:
        loaded = manager.plugins()
    messages = [str(w.message) for w in record]
    broken = [m for m in messages if "ndcost-broken-example" in m]
    assert broken and "this plugin is broken on purpose" in broken[0] and "RuntimeError" in broken[0]
    assert "NDCOST_STRICT_PLUGINS" in broken[0]
    # a plugin whose hook raises halfway is dropped whole: nothing it registered stays
    halfway = [m for m in messages if "ndcost-halfway" in m]
    assert halfway and "ZeroDivisionError" in halfway[0]
    assert "optimizer/half_done" not in loaded.registry
    # the rest loaded, third party and built-ins alike
    assert loaded.registry.get("optimizer/good_opt").states_per_parameter == 1
    assert "optimizer/adamw" in loaded.registry
    by_name = {p.name: p for p in loaded.plugins}
    assert by_name["broken"].error.startswith("RuntimeError")
    assert by_name["good"].distribution == "ndcost-good-example" and by_name["good"].version == "2.5"


def test_strict_plugins_makes_it_an_error(fake_dists, monkeypatch):
    monkeypatch.setenv("NDCOST_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError) as err:
        manager.load()
    message = str(err.value)
    assert "ndcost-broken-example" in message or "ndcost-halfway" in message
    assert "NDCOST_STRICT_PLUGINS" in message


def test_missing_essential_plugin_is_a_stale_install(fresh, monkeypatch):
    real = manager._entry_points
    monkeypatch.setattr(manager, "_entry_points",
                        lambda: [ep for ep in real() if not (ep.name == "storage" and ep.dist.name == "ndcost")])
    with pytest.raises(StalePluginSet) as err:
        manager.load()
    message = str(err.value)
    assert "storage" in message and "pip install -e ." in message


def test_unknown_hook_is_refused_naming_the_fix(fresh):
    import types

    import pluggy

    module = types.ModuleType("typo_plugin")
    module.ndcost_registr = pluggy.HookimplMarker("ndcost")(lambda register: None)
    with pytest.raises(PluginLoadError, match="ndcost_register"):
        manager.load(extra_modules={"typo": module})


def test_one_module_under_two_entry_points_runs_once(fresh):
    import types

    import ndcost

    from ndcost.plugins.optimizers import Optimizer

    module = types.ModuleType("twice")
    module.ndcost_register = ndcost.hookimpl(
        lambda register: register("optimizer/twice", Optimizer(name="twice", states_per_parameter=1)))
    loaded = manager.load(extra_modules={"one": module, "two": module})
    assert loaded.registry.get("optimizer/twice").states_per_parameter == 1


# ---------------------------------------------------------------------------
# a real third-party distribution, installed with pip for the test
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lion_site(tmp_path_factory):
    """docs/examples/ndcost-lion installed with pip into a temporary target folder."""
    return pip_install(REPO / "docs" / "examples" / "ndcost-lion", tmp_path_factory.mktemp("lion"))


@pytest.mark.slow
def test_third_party_distribution_is_found_and_used(lion_site, monkeypatch, fresh):
    import ndcost

    monkeypatch.syspath_prepend(str(lion_site))
    manager.reset()
    try:
        loaded = manager.plugins()
        lion = [p for p in loaded.plugins if p.distribution == "ndcost-lion"]
        assert lion and lion[0].name == "lion" and lion[0].version == "0.1.0"
        assert set(lion[0].registered) == {"optimizer/lion", "storage/nf4"}
        assert loaded.registry.entry("optimizer/lion").source.distribution == "ndcost-lion"

        # usable in a strategy and in the accounting, by name and case-insensitively
        assert ndcost.Strategy(optimizer="lion").optimizer == "lion"
        assert ndcost.Strategy.parse("optimizer=Lion,tp=2").optimizer == "lion"
        out = ndcost.accounting.training_bytes([[4, 3], [3]], 2, 4, [[2, 4]], 2, "lion", 4)
        # 15 parameters, Lion keeps one state: 15 * 4 bytes
        assert out == {"parameters": 30, "gradients": 60, "activations": 16, "optimizer_state": 60, "total": 166}
        # its storage format: 4096 elements = 2048 code bytes + 64 blocks x 4-byte absmax
        assert ndcost.accounting.storage_bytes("nf4", 4096) == 2048 + 64 * 4

        # and by the resolver: Lion keeps one state a parameter where AdamW keeps two, and the cost
        # names the third-party plugin as the source of its optimizer states
        model = ndcost.resolve("llama-3.1-8b", census="off")
        lion_cost = model.evaluate(ndcost.Strategy.parse("optimizer=lion,fsdp=8,seq=1024"))
        adamw_cost = model.evaluate(ndcost.Strategy.parse("optimizer=adamw,fsdp=8,seq=1024"))
        lion_states = lion_cost.stages[0].bytes_by_category["optimizer_states"]
        assert 2 * lion_states == adamw_cost.stages[0].bytes_by_category["optimizer_states"] > 0
        assert "optimizer/lion" in lion_cost.source("optimizer_states")
        assert "ndcost-lion" in lion_cost.source("optimizer_states")
        assert "distribution ndcost)" in adamw_cost.source("optimizer_states")
    finally:
        sys.modules.pop("ndcost_lion", None)
    manager.reset()


def test_without_the_third_party_lion_is_unknown(fresh):
    import ndcost
    from ndcost.errors import InvalidValue

    with pytest.raises(InvalidValue, match="lion"):
        ndcost.accounting.training_bytes([[1]], 2, 2, [], 2, "lion", 4)


# ---------------------------------------------------------------------------
# results name the plugin behind each figure
# ---------------------------------------------------------------------------
def test_every_figure_of_a_cost_names_its_plugin_and_an_override_shows(fresh, monkeypatch):
    import types

    import attrs

    import ndcost
    from ndcost.plugins.optimizers import Optimizer
    from ndcost.values import MEMORY_CATEGORIES, TimeBreakdown

    module = types.ModuleType("my_adamw")
    module.ndcost_register = ndcost.hookimpl(
        lambda register: register("optimizer/adamw", Optimizer(name="adamw", states_per_parameter=2), override=True))
    monkeypatch.setattr(manager, "_current", manager.load(extra_modules={"mine": module}))
    cost = ndcost.resolve("llama-3.1-8b", census="off").evaluate(ndcost.Strategy.parse("fsdp=8,seq=1024"))
    sources = cost.sources()
    time_fields = {f.name for f in attrs.fields(TimeBreakdown)} - {"provenance"}
    assert set(MEMORY_CATEGORIES) | {"peak_bytes"} | time_fields <= set(sources)
    assert all(isinstance(v, str) and v for v in sources.values())
    assert "my_adamw" in cost.source("optimizer_states") and "<local>" in cost.source("optimizer_states")
    assert "family/llama" in cost.source("parameters")
    assert "schedule/1f1b" in cost.source("bubble_seconds")
    assert cost.to_dict()["sources"] == sources
    with pytest.raises(ndcost.UnknownKey, match="figures: parameters"):
        cost.source("params")


def test_a_cost_without_time_says_time_is_unpriced():
    from ndcost.values import Strategy, StrategyCost

    cost = StrategyCost(strategy=Strategy(seq=8), stages=(), peak_bytes=0,
                        provenance={"time": {"unpriced": "hardware x states no bf16 peak"}})
    assert cost.source("step_seconds") == "unpriced: hardware x states no bf16 peak"
    assert cost.source("bubble_seconds").startswith("unpriced")


def test_loaded_hook_sees_the_resolved_registry_and_may_not_register(fresh):
    import types

    import ndcost

    seen = []
    watcher = types.ModuleType("watcher")
    watcher.ndcost_loaded = ndcost.hookimpl(lambda registry: seen.append(registry.get("optimizer/adamw")))
    loaded = manager.load(extra_modules={"watcher": watcher})
    assert len(seen) == 1 and seen[0] is loaded.registry.get("optimizer/adamw")

    late = types.ModuleType("late")
    late.ndcost_loaded = ndcost.hookimpl(lambda registry: registry.add(
        "optimizer/late", registry.get("optimizer/adamw"), source=registry.entry("optimizer/adamw").source))
    with pytest.warns(PluginLoadWarning, match="optimizer/late.*ndcost_register"):  # left out, the rest load
        loaded = manager.load(extra_modules={"late": late})
    assert "optimizer/late" not in loaded.registry and "optimizer/adamw" in loaded.registry
    assert [p.error for p in loaded.plugins if p.name == "late"][0].startswith("its ndcost_loaded hook failed")


# ---------------------------------------------------------------------------
# the hardware loader: a bad spec YAML is a refusal naming the file, never an internal error
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("text,fragment", [
    ("name: x\nmemory_bytes: [\n", "not valid YAML"),
    ("name: x\nmemory_byte: 5\n", "missing 'memory_bytes'"),
    ("- 1\n", "expected a mapping"),
    (None, "cannot read it"),
])
def test_bad_hardware_yaml_is_refused_naming_the_file(tmp_path, text, fragment):
    from ndcost.errors import InvalidValue
    from ndcost.specio import load_hardware_yaml

    path = tmp_path / "mine.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(InvalidValue, match=fragment) as err:
        load_hardware_yaml(path)
    assert str(path) in str(err.value)


def test_hookspecs_are_named_typed_and_say_when_they_run():
    import inspect

    from ndcost import hookspecs

    specs = {name: f for name, f in vars(hookspecs).items() if hasattr(f, "ndcost_spec")}
    assert set(specs) == {"ndcost_register", "ndcost_op_records", "ndcost_loaded"}
    for name, function in specs.items():
        signature = inspect.signature(function)
        assert signature.return_annotation is not inspect.Signature.empty, name
        assert all(p.annotation is not inspect.Parameter.empty for p in signature.parameters.values()), name
        doc = inspect.getdoc(function)
        assert "Runs" in doc and "first-result" in doc, name


# ---------------------------------------------------------------------------
# a distribution registering a value that does not meet its namespace's contract
# ---------------------------------------------------------------------------
WRONG_VALUES = """
    import ndcost

    @ndcost.hookimpl
    def ndcost_register(register):
        register("schedule/zero_bubble", "zb-h1")
"""


def test_a_distribution_registering_a_wrong_value_is_refused_at_load_naming_it(tmp_path, monkeypatch, fresh):
    make_dist(tmp_path / "site", "ndcost-wrong-values", {"ndcost_wrong_values": WRONG_VALUES},
              {"wrong": "ndcost_wrong_values"}, version="0.3")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("NDCOST_STRICT_PLUGINS", "1")
    real = manager._entry_points  # ndcost's and this one only: another broken third party would fail first
    monkeypatch.setattr(manager, "_entry_points",
                        lambda: [ep for ep in real() if ep.dist.name in ("ndcost", "ndcost-wrong-values")])
    try:
        with pytest.raises(PluginLoadError) as err:
            manager.load()
        message = str(err.value)
        for fragment in ("schedule/zero_bubble from ndcost-wrong-values (ndcost_wrong_values)",
                         "a pipeline schedule must have", "in_flight()", "got str 'zb-h1'", "'schedule/'"):
            assert fragment in message, (fragment, message)
    finally:
        sys.modules.pop("ndcost_wrong_values", None)
