"""The plugin manager: entry points of any distribution, broken plugins, the essential set, a third party.

Fake distributions are a ``<name>-<version>.dist-info`` folder (METADATA and
entry_points.txt) next to their module on a temporary ``sys.path`` entry,
which is all ``importlib.metadata`` needs to find an entry point.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ndcost import manager
from ndcost.errors import PluginLoadError, StalePluginSet
from ndcost.manager import PluginLoadWarning

REPO = Path(__file__).resolve().parents[1]


def make_dist(root: Path, dist: str, modules: dict, entry_points: dict, version: str = "1.0") -> Path:
    """Write a minimal installed distribution under *root*: modules (name -> source) and entry points."""
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = ["[ndcost.plugins]"] + [f"{name} = {module}" for name, module in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for name, source in modules.items():
        (root / f"{name}.py").write_text(textwrap.dedent(source))
    return root


GOOD = """
    import ndcost

    @ndcost.hookimpl
    def ndcost_register(register):
        register("optimizer/good_opt", 1)
"""
BROKEN_IMPORT = """
    raise RuntimeError("this plugin is broken on purpose")
"""
BROKEN_HOOK = """
    import ndcost

    @ndcost.hookimpl
    def ndcost_register(register):
        register("optimizer/half_done", 1)
        raise ZeroDivisionError("failed halfway through registering")
"""


@pytest.fixture
def fresh(monkeypatch):
    """A process-wide plugin set reloaded for this test and forgotten after it."""
    monkeypatch.delenv("NDCOST_STRICT_PLUGINS", raising=False)
    manager.reset()
    yield
    manager.reset()


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
    assert loaded.registry.get("optimizer/good_opt") == 1
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

    module = types.ModuleType("twice")
    module.ndcost_register = ndcost.hookimpl(lambda register: register("optimizer/twice", 1))
    loaded = manager.load(extra_modules={"one": module, "two": module})
    assert loaded.registry.get("optimizer/twice") == 1


# ---------------------------------------------------------------------------
# a real third-party distribution, installed with pip for the test
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lion_site(tmp_path_factory):
    """docs/examples/ndcost-lion installed with pip into a temporary target folder."""
    work = tmp_path_factory.mktemp("lion")
    source = work / "src"
    shutil.copytree(REPO / "docs" / "examples" / "ndcost-lion", source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = work / "site"
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                             "--no-index", "--target", str(target), str(source)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return target


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
    finally:
        sys.modules.pop("ndcost_lion", None)
    manager.reset()


def test_without_the_third_party_lion_is_unknown(fresh):
    import ndcost
    from ndcost.errors import InvalidValue

    with pytest.raises(InvalidValue, match="lion"):
        ndcost.accounting.training_bytes([[1]], 2, 2, [], 2, "lion", 4)
