"""Estimators are plugins the resolver chooses per kind: a family's preference, availability, override."""
from __future__ import annotations

import types

import attrs
import pytest

import ndcost
from ndcost import manager
from ndcost.records import KindRecord
from ndcost.work import KindWork

SEQ = 1024
SAVED_PER_TOKEN = 1000.0  # what the toy estimator says a layer keeps, bytes a token


@attrs.frozen
class ToyActivations:
    """Every layer keeps SAVED_PER_TOKEN bytes a token (none split by TP); the output layer a tenth of it."""

    name: str = "census"
    needs_census: bool = False
    description: str = "toy: a constant a token"

    def available(self, spec, runtime):
        return None

    def records(self, spec, kinds, seq, runtime):
        def record(kind, per_token):
            return KindRecord(kind=kind, seq=seq, source="toy", saved_per_token=per_token, saved_tp_per_token=0.0,
                              working_per_token=per_token, working_tp_per_token=0.0)
        return {k: record(k, SAVED_PER_TOKEN) for k in kinds}, record("output", SAVED_PER_TOKEN / 10)


@attrs.frozen
class ToyFlops:
    """Every layer does 1e9 matmul FLOPs a token, whatever it is."""

    name: str = "census"
    description: str = "toy: 1e9 FLOPs a token"

    def available(self, spec, runtime):
        return None

    def measures(self, record):
        return True

    def kind_work(self, spec, kind, seq, record, parameters):
        return KindWork(kind=kind, source="toy flops", attention_mm_flops_per_token=0.0,
                        other_mm_flops_per_token=1e9)


@pytest.fixture
def toy(fresh, monkeypatch):
    module = types.ModuleType("toy_estimators")

    @ndcost.hookimpl
    def ndcost_register(register):
        register("estimator/activations/census", ToyActivations(), override=True)
        register("estimator/flops/census", ToyFlops(), override=True)

    module.ndcost_register = ndcost_register
    monkeypatch.setattr(manager, "_current", manager.load(extra_modules={"toy": module}))


def test_a_third_party_estimator_wins_by_override_and_the_provenance_names_it(toy):
    model = ndcost.resolve("llama-3.1-8b", census="off")
    batch = model.evaluate_many([ndcost.Strategy(seq=SEQ)])
    # one layer, one micro-batch of SEQ tokens at TP 1: the toy's bytes a token times the tokens
    assert batch.layer_activation_bytes[0].tolist() == [SEQ * 1000]
    records = batch.provenance["records"][SEQ]
    assert "toy" in records["activations"]["dense"] and "toy_estimators" in records["activations"]["dense"]
    assert "toy" in records["output"]
    work = model.model_work(SEQ)
    assert work.work["dense"].source == "toy flops"
    assert work.work["dense"].forward_flops(SEQ) == pytest.approx(SEQ * 1e9)
    assert ndcost.manager.registry().overrides()  # the override is reported


def test_without_the_override_the_formulas_price_a_census_off_model():
    model = ndcost.resolve("llama-3.1-8b", census="off")
    batch = model.evaluate_many([ndcost.Strategy(seq=SEQ)])
    source = batch.provenance["records"][SEQ]["activations"]["dense"]
    assert source.startswith("formulas") and "estimator/activations/op_records" in source


def test_families_state_their_preference():
    from ndcost.models import family_for, load_model
    v4 = load_model("deepseek-v4-flash")
    assert family_for("deepseek_v4").activation_estimators(v4, v4.kinds[0])[0] == "stack_census"
    llama = load_model("llama-3.1-8b")
    assert family_for("llama").activation_estimators(llama, "dense") == ("census", "op_records")
    assert family_for("llama").flops_estimators(llama, "dense") == ("census", "analytic")


def test_an_estimator_that_cannot_run_is_passed_over_with_its_reason(fresh, monkeypatch):
    @attrs.frozen
    class Unavailable(ToyActivations):
        def available(self, spec, runtime):
            return "the toy needs a quantum computer"

    module = types.ModuleType("toy_unavailable")
    module.ndcost_register = ndcost.hookimpl(
        lambda register: register("estimator/activations/census", Unavailable(), override=True))
    monkeypatch.setattr(manager, "_current", manager.load(extra_modules={"toy": module}))
    batch = ndcost.resolve("llama-3.1-8b", census="off").evaluate_many([ndcost.Strategy(seq=SEQ)])
    source = batch.provenance["records"][SEQ]["activations"]["dense"]
    assert source.startswith("formulas") and "census unavailable: the toy needs a quantum computer" in source


def test_without_the_census_extra_the_formulas_price_and_say_so_once(monkeypatch, capsys):
    """torch and transformers absent (as after a plain `pip install ndcost`): a census that misses its cache
    cannot run, the formulas price, stderr says so once, the provenance says why."""
    import importlib.util

    from ndcost import manager, resolver
    from ndcost.plugins import census

    manager.registry()  # built before the patches: a registry first built under them would keep no_torch for good

    def no_torch(*args, **kwargs):
        raise ImportError("No module named 'torch'")

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("torch", "transformers") else real_find_spec(name, *a))
    monkeypatch.setattr(census, "kind_records", no_torch)
    monkeypatch.setattr(resolver, "_NOTED", [])
    model = ndcost.resolve("llama-3.1-8b", census="auto")
    for seq in (1024, 2048):
        cost = model.evaluate(ndcost.Strategy(seq=seq))
        source = cost.provenance["records"][seq]["activations"]["dense"]
        assert source.startswith("formulas") and "pip install 'ndcost[census]'" in source
    err = capsys.readouterr().err
    assert err.count("pip install 'ndcost[census]'") == 1 and "op records' formulas" in err
