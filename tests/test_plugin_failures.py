"""Plugins that misbehave, installed as real entry points: each is left out naming its distribution, or refused.

Every misbehaving plugin is a fake installed distribution (a ``dist-info``
folder with an ``entry_points.txt`` next to its module, tests/_helpers.py
``make_dist``) on ``sys.path`` or, for the CLI, on ``PYTHONPATH`` of a
subprocess. A figure priced with a broken plugin installed is compared with
the same figure priced without it in the same test: a broken plugin changes
nothing, it is reported.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

import ndcost
from ndcost import manager
from ndcost.errors import PluginLoadError
from ndcost.manager import PluginLoadWarning
from ndcost.models import load_model, parameters
from ndcost.resolver import CostModel

from _helpers import make_dist

DIST, MODULE = "ndcost-misbehaving", "ndcost_misbehaving"
# Priced from a census (or given records), Mixtral's routed experts and Llama under core-attention recompute
# still read the op records (the routed share; what the attention core keeps): where that read failed
# quietly, the figure moved (Llama's below from 64.6 to 101.7 GB, Mixtral's at 1024 tokens from 102.4 to 95.8).
MIXTRAL = ("mixtral-8x7b", "tp=8,pp=4,dp=2,seq=1024,num_micro_batches=16")
LLAMA_CORE = ("llama-3.1-8b", "tp=1,pp=1,dp=8,seq=8192,recompute=core_attention")


def install(tmp_path, monkeypatch, source: str) -> None:
    """*source* as the module of the distribution ndcost-misbehaving on sys.path, the plugins reloaded to see it."""
    make_dist(tmp_path / "site", DIST, {MODULE: source}, {"misbehaving": MODULE}, version="0.1")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    real = manager._entry_points  # ndcost's and this one only: another third party must not decide the test
    monkeypatch.setattr(manager, "_entry_points", lambda: [ep for ep in real() if ep.dist.name in ("ndcost", DIST)])
    sys.modules.pop(MODULE, None)
    manager.reset()


@pytest.fixture
def misbehaving(tmp_path, monkeypatch, fresh):
    yield lambda source: install(tmp_path, monkeypatch, source)
    sys.modules.pop(MODULE, None)


def peak_bytes(model: str, strategy: str) -> int:
    return ndcost.resolve(model, census="off").evaluate(ndcost.Strategy.parse(strategy)).peak_bytes


def given_records(model: str, strategy: str) -> dict:
    """Activation records for *strategy*'s length, standing in for a census: the op records' of the plugins now."""
    spec, seq = load_model(model), ndcost.Strategy.parse(strategy).seq
    estimator = manager.registry().get("estimator/activations/op_records")
    return {seq: estimator.records(spec, list(spec.kinds), seq, "hf-cuda")}


def peak_bytes_from(records: dict, model: str, strategy: str) -> int:
    """The peak of *strategy* priced from given *records* (the resolver's reads beside them come from the plugins)."""
    spec = load_model(model)
    model = CostModel.from_records(spec, parameters(spec), records)
    return model.evaluate(ndcost.Strategy.parse(strategy)).peak_bytes


def load_warning_messages() -> list:
    """The PluginLoadWarnings of loading the process-wide plugin set."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager.plugins()
    return [str(w.message) for w in caught if issubclass(w.category, PluginLoadWarning)]


def only_warning_names_us(messages: list) -> str:
    assert len(messages) == 1, messages
    assert f"distribution {DIST!r}" in messages[0] and "NDCOST_STRICT_PLUGINS" in messages[0], messages[0]
    return messages[0]


# ---------------------------------------------------------------------------
# registration: a value is what its namespace's contract declares, or the plugin is refused
# ---------------------------------------------------------------------------
REGISTERS = """
    import types

    import ndcost
    from ndcost.plugins.optimizers import Optimizer

    @ndcost.hookimpl
    def ndcost_register(register):
        register("optimizer/fine", Optimizer(name="fine", states_per_parameter=1))
        register({key!r}, {value})
"""


@pytest.mark.parametrize("key,value,expected", [
    ("schedule/zero_bubble", '"zb-h1"', "a pipeline schedule must have name (str)"),
    ("runtime/fast", "1.5", "a runtime profile must have name (str)"),
    ("optimizer/lion", '{"name": "lion", "states_per_parameter": 1}', "an optimizer must have states_per_parameter"),
    ("optimizer/nan", 'Optimizer(name="nan", states_per_parameter=float("nan"))',
     "states_per_parameter (float) >= 0 (it is float nan)"),
    ("optimizer/negative", 'Optimizer(name="negative", states_per_parameter=-2)',
     "states_per_parameter (float) >= 0 (it is int -2)"),
    ("optimizer/huge", 'Optimizer(name="huge", states_per_parameter=10 ** 400)', "states_per_parameter (float) >= 0"),
    ("storage/int3", 'types.SimpleNamespace(name="int3", bytes_per_element=0.375, aliases=(3,), row_bytes=abs, '
                     'matrix_bytes=max, tensor_bytes=abs)', "aliases (tuple of str) (it is tuple (3,))"),
], ids=lambda v: v if isinstance(v, str) and "/" in v else None)
def test_a_value_breaking_its_namespaces_contract_is_refused_at_registration(misbehaving, monkeypatch, key, value,
                                                                            expected):
    misbehaving(REGISTERS.format(key=key, value=value))
    message = only_warning_names_us(load_warning_messages())
    for fragment in (key, f"from {DIST} ({MODULE})", expected, f"every '{key.split('/')[0]}/' value must meet"):
        assert fragment in message, (fragment, message)
    registry = manager.registry()
    assert key not in registry and "optimizer/fine" not in registry  # the plugin is left out whole
    assert "optimizer/adamw" in registry and "schedule/1f1b" in registry
    monkeypatch.setenv("NDCOST_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match=f"{key}.*{DIST}"):
        manager.load()


def test_a_garbage_optimizer_under_a_new_key_leaves_every_estimate_as_it_was(misbehaving):
    clean = peak_bytes(*LLAMA_CORE)
    misbehaving(REGISTERS.format(key="optimizer/broken", value='Optimizer(name="broken", states_per_parameter=-1)'))
    only_warning_names_us(load_warning_messages())
    assert peak_bytes(*LLAMA_CORE) == clean  # priced with the default optimizer, adamw
    assert "broken" not in ndcost.resolve(LLAMA_CORE[0], census="off").names()["optimizer"]


def test_a_register_hook_returning_something_is_broken(misbehaving):
    misbehaving("""
        import ndcost
        from ndcost.plugins.optimizers import Optimizer

        @ndcost.hookimpl
        def ndcost_register(register):
            return [("optimizer/returned", Optimizer(name="returned", states_per_parameter=1))]
    """)
    message = only_warning_names_us(load_warning_messages())
    assert "ndcost_register hook returned list" in message and "must return None" in message


# ---------------------------------------------------------------------------
# the op records hook: raising or returning garbage leaves the figures as they were
# ---------------------------------------------------------------------------
OP_RECORDS = """
    import ndcost

    @ndcost.hookimpl
    def ndcost_op_records():
        {body}
"""
BROKEN_OP_RECORDS = {
    "raises": ('raise RuntimeError("op records broken on purpose")', "hook raised RuntimeError: op records broken"),
    "exits": ("raise SystemExit(3)", "hook raised SystemExit: 3"),
    "returns a number": ("return 42", "contribution must be a mapping"),
    "returns a bad slot": ('return [{"slots": {"extra": {"part": "ffn", "terms": [{"op": "nope", "split": "tp", '
                           '"bytes": "1"}]}}}]', "unknown op 'nope'"),
    "redefines a built-in op": ('return [{"ops": {"softmax": {"switch": "softmax"}}}]',
                                "op 'softmax' is defined by both ndcost:op_records"),
}


@pytest.mark.parametrize("case", list(BROKEN_OP_RECORDS))
def test_a_broken_op_records_hook_changes_no_figure_and_names_its_distribution(misbehaving, case):
    records = given_records(*LLAMA_CORE)
    clean = (peak_bytes(*MIXTRAL), peak_bytes_from(records, *LLAMA_CORE))
    body, said = BROKEN_OP_RECORDS[case]
    misbehaving(OP_RECORDS.format(body=body))
    message = only_warning_names_us(load_warning_messages())
    assert said in message and "ndcost_op_records" in message, message
    assert (peak_bytes(*MIXTRAL), peak_bytes_from(records, *LLAMA_CORE)) == clean
    assert [p.error for p in manager.plugins().plugins if p.distribution == DIST][0]


def test_a_plugin_with_broken_op_records_is_left_out_with_what_it_registered(misbehaving):
    """Withdrawing its registrations while the op records merge is no late registration of the merging plugin."""
    misbehaving("""
        import ndcost
        from ndcost.plugins.optimizers import Optimizer

        @ndcost.hookimpl
        def ndcost_register(register):
            register("optimizer/with_bad_ops", Optimizer(name="with_bad_ops", states_per_parameter=1))

        @ndcost.hookimpl
        def ndcost_op_records():
            return 42
    """)
    message = only_warning_names_us(load_warning_messages())
    assert "ndcost_op_records contribution is refused" in message
    assert "optimizer/with_bad_ops" not in manager.registry() and "optimizer/adamw" in manager.registry()
    assert all(p.error is None for p in manager.plugins().plugins if p.distribution == "ndcost")


@pytest.mark.parametrize("case", ["raises", "returns a bad slot"])
def test_under_strict_plugins_a_broken_op_records_hook_fails_naming_its_distribution(misbehaving, monkeypatch, case):
    misbehaving(OP_RECORDS.format(body=BROKEN_OP_RECORDS[case][0]))
    monkeypatch.setenv("NDCOST_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError) as err:
        manager.load()
    assert f"distribution {DIST!r}" in str(err.value) and "ndcost_op_records" in str(err.value)


def test_a_well_formed_op_records_contribution_still_counts(misbehaving):
    """The control: the same hook returning a valid slot is merged (it is the broken ones that are left out)."""
    misbehaving(OP_RECORDS.format(body='return [{"slots": {"extra": {"part": "ffn", "terms": '
                                       '[{"op": "attMM", "split": "sequence", "bytes": "tokens"}]}}}]'))
    assert load_warning_messages() == []
    from ndcost.plugins import op_records
    assert "extra" in op_records.load_op_records().slots


# ---------------------------------------------------------------------------
# plugins that would take every command down
# ---------------------------------------------------------------------------
def test_systemexit_at_import_is_a_broken_plugin(misbehaving):
    misbehaving("raise SystemExit('this plugin exits at import')")
    message = only_warning_names_us(load_warning_messages())
    assert "SystemExit: this plugin exits at import" in message
    assert "optimizer/adamw" in manager.registry()


def test_a_keyboard_interrupt_at_import_still_interrupts(misbehaving):
    misbehaving("raise KeyboardInterrupt")
    with pytest.raises(KeyboardInterrupt):
        manager.load()


LOADED_RAISES = """
    import ndcost
    from ndcost.plugins.optimizers import Optimizer

    @ndcost.hookimpl
    def ndcost_register(register):
        register("optimizer/loaded_fails", Optimizer(name="loaded_fails", states_per_parameter=1))

    @ndcost.hookimpl
    def ndcost_loaded(registry):
        raise LookupError("a check that fails")
"""


def test_a_raising_loaded_hook_leaves_that_plugin_out_not_every_command(misbehaving, monkeypatch):
    clean = peak_bytes(*LLAMA_CORE)
    misbehaving(LOADED_RAISES)
    message = only_warning_names_us(load_warning_messages())
    assert "ndcost_loaded hook failed: LookupError: a check that fails" in message
    assert "optimizer/loaded_fails" not in manager.registry()  # what it registered is withdrawn
    assert peak_bytes(*LLAMA_CORE) == clean
    monkeypatch.setenv("NDCOST_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="a check that fails"):
        manager.load()


def test_a_plugin_left_out_after_loading_gives_back_a_key_it_overrode(misbehaving):
    """Withdrawing a broken plugin's registrations restores the entry its override replaced."""
    misbehaving("""
        import ndcost
        from ndcost.plugins.optimizers import Optimizer

        @ndcost.hookimpl
        def ndcost_register(register):
            register("optimizer/adamw", Optimizer(name="adamw", states_per_parameter=5), override=True)

        @ndcost.hookimpl
        def ndcost_loaded(registry):
            raise RuntimeError("broken after registering")
    """)
    only_warning_names_us(load_warning_messages())
    entry = manager.registry().entry("optimizer/adamw")
    assert entry.source.distribution == "ndcost" and entry.value.states_per_parameter == 2


# ---------------------------------------------------------------------------
# through the CLI: a warning line and the clean figure, or under strict plugins exit 1 and one line
# ---------------------------------------------------------------------------
def cli(site, *argv, strict=False):
    env = {k: v for k, v in os.environ.items() if k != "NDCOST_STRICT_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    if strict:
        env["NDCOST_STRICT_PLUGINS"] = "1"
    return subprocess.run([sys.executable, "-m", "ndcost", *argv], capture_output=True, text=True, env=env,
                          cwd=site, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("source,said", [
    (OP_RECORDS.format(body=BROKEN_OP_RECORDS["raises"][0]), "op records broken on purpose"),
    ("raise SystemExit('exits at import')", "SystemExit: exits at import"),
    (LOADED_RAISES, "a check that fails"),
], ids=["op-records-raise", "systemexit-at-import", "loaded-hook-raises"])
def test_cli_warns_and_prices_as_without_the_plugin_or_under_strict_fails_in_one_line(tmp_path, source, said):
    """Mixtral priced from its census (measured once, then cached in the tests' cache directory)."""
    model, strategy = MIXTRAL
    argv = ("estimate", model, "--strategy", strategy, "--json")
    clean = cli(tmp_path, *argv)
    assert clean.returncode == 0, clean.stderr
    site = make_dist(tmp_path / "site", DIST, {MODULE: source}, {"misbehaving": MODULE})
    broken = cli(site, *argv)
    assert broken.returncode == 0, broken.stderr
    assert json.loads(broken.stdout)["peak_bytes"] == json.loads(clean.stdout)["peak_bytes"]
    lines = broken.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ndcost plugin") and DIST in lines[0] and said in lines[0]
    strict = cli(site, *argv, strict=True)
    assert strict.returncode == 1 and json.loads(strict.stdout)["error"]["kind"] == "PluginLoadError"
    lines = strict.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ndcost estimate: ") and DIST in lines[0] and said in lines[0]
    assert "Traceback" not in strict.stderr
