"""One strategy at a time: ``CostModel.evaluate(s)`` is the batched path's figures for ``s``, exactly.

Over generated strategies (valid and not) on a dense, an MoE with MLA and MTP, a hybrid linear-attention
and a sliding-window model, ``evaluate(s)`` must equal ``evaluate_many([s]).cost(0, s)`` and the row of
``s`` in a bigger batch of other strategies (other sequence lengths and pipeline layouts): bytes
exactly, seconds to rtol 1e-12 (a bigger batch may sum in another order), the provenance of its
sequence length the same; a strategy the batch refuses raises with the batch's reason.
"""
from __future__ import annotations

import math
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ndcost
from ndcost import columns
from ndcost.errors import InvalidStrategy, NdcostError
from ndcost.values import DDP_ENGINES, DTYPES, FSDP_ENGINES, GRADIENT_SYNC, LOSS_ENGINES, PP_ENGINES, SHARD_MESHES

MODELS = ("llama-3.1-8b", "deepseek-v3", "qwen3.5-9b", "gpt-oss-20b")
_RESOLVED = {}


def _model(name):
    if name not in _RESOLVED:
        _RESOLVED[name] = ndcost.resolve(name, census="off")
    return _RESOLVED[name]


DTYPE_NAMES = tuple(DTYPES)

# ways to make a strategy that is otherwise valid one the model (or Strategy) refuses
BREAKERS = ({"tp": 3}, {"tp": 5}, {"pp_layers": "1/1"}, {"ep": 3}, {"etp": 2, "ep": 1, "dp": 1}, {"vpp": 3},
            {"schedule": "dualpipev", "vpp": 1}, {"schedule": "interleaved", "vpp": 1}, {"zero": 2, "fsdp": 2},
            {"cp": 2, "seq": 3001}, {"compute_dtype": "int8"}, {"seq": 0}, {"num_micro_batches": 0},
            {"recompute_layers": -1}, {"schedule": "zigzag"}, {"optimizer": "lion"})


def _split(layers, stages):
    base, extra = divmod(layers, stages)
    return "/".join(str(base + (1 if i < extra else 0)) for i in range(stages))


@st.composite
def strategy_fields(draw, model):
    """Strategy fields mostly valid on *model* (its layers, experts and the schedules' rules), a quarter of
    them broken one way or another (each refusal of the batch is exercised)."""
    layers, moe = model.tables.num_layers, bool(model.tables.num_experts)
    schedule = draw(st.sampled_from(["1f1b", "gpipe", "interleaved", "dualpipev"]))
    vpp = 2 if schedule in ("interleaved", "dualpipev") else 1
    pp = draw(st.sampled_from([2, 4] if schedule == "interleaved" else [1, 2, 4]))
    num_micro_batches = draw(st.sampled_from([1, 2, 4, 8]))
    if schedule == "dualpipev":
        num_micro_batches = max(num_micro_batches, 2 * pp)
    tp, cp = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 1, 2]))
    dp, fsdp = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 1, 2, 4]))
    ranks = dp * fsdp * cp * tp
    ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if ranks % e == 0])) if moe else 1
    etp = draw(st.sampled_from([e for e in (1, 2) if ranks % (ep * e) == 0])) if moe else 1
    fields = {
        "dp": dp, "fsdp": fsdp, "tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "ep": ep, "etp": etp,
        "zero": 0 if fsdp > 1 else draw(st.integers(0, 3)), "sp": draw(st.booleans()),
        "cp_algo": draw(st.sampled_from(["ring", "ulysses", "colossal", "hybrid"])), "schedule": schedule,
        "micro_batch": draw(st.sampled_from([1, 2])), "num_micro_batches": num_micro_batches,
        "seq": draw(st.sampled_from([1024, 2048, 4096])),
        "recompute": draw(st.sampled_from(["none", "full", "selective", "core_attention"])),
        "vocab_parallel": draw(st.booleans()),
        "optimizer": draw(st.sampled_from(["adamw", "adam", "sgd", "adagrad"])),
        "param_dtype": draw(st.sampled_from(["bf16", "bf16", "fp32", "fp8"])),
        "master_dtype": draw(st.sampled_from(["none", "fp32"])),
        "moe_imbalance": draw(st.sampled_from([1.0, 1.25])),
        "allocator_overhead": draw(st.sampled_from([0.0, 0.0, 0.05])),
    }
    if draw(st.booleans()) and fields["recompute"] != "none":  # (a count of recomputed layers needs a mode)
        fields["recompute_layers"] = draw(st.integers(0, 4))
    if draw(st.booleans()):
        fields["compute_dtype"] = draw(st.sampled_from(["bf16", "fp16", "fp8", "fp32"]))
    if layers % (pp * vpp) or draw(st.integers(0, 3)) == 0:  # an explicit split where an even one is refused
        fields["pp_layers"] = _split(layers, pp * vpp)
    if draw(st.integers(0, 3)) == 0:  # the sharding vocabulary: one strategy's sharding is kept by these fields
        fields.update(shard_mesh=draw(st.sampled_from(SHARD_MESHES)), reshard_after_forward=draw(st.booleans()),
                      gradient_sync=draw(st.sampled_from(GRADIENT_SYNC)), offload_activations=draw(st.booleans()),
                      pp_engine=draw(st.sampled_from(PP_ENGINES)), pp_return_outputs=draw(st.booleans()),
                      fsdp_engine=draw(st.sampled_from(FSDP_ENGINES)),
                      ddp_engine=draw(st.sampled_from(DDP_ENGINES)),
                      loss_engine=draw(st.sampled_from(LOSS_ENGINES)))
    if draw(st.integers(0, 3)) == 0:
        fields.update(float8=draw(st.sampled_from(["none", "tensorwise", "rowwise", "rowwise_with_gw_hp"])),
                      compile=draw(st.booleans()))
        fields["float8_experts"] = fields["float8"] not in ("none", "rowwise_with_gw_hp") and draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        fields["ep_dispatcher"] = "deepep"
    if draw(st.integers(0, 3)) == 0:
        fields.update(draw(st.sampled_from(BREAKERS)))
    return fields


# other rows of the bigger batch: other sequence lengths, pipeline layouts and schedules, one invalid
OTHERS = ("tp=2,seq=2048", "pp=2,dp=2,seq=4096,num_micro_batches=4",
          "pp=4,vpp=2,schedule=interleaved,seq=1024,num_micro_batches=8,recompute=full", "tp=5,seq=1024",
          "dp=2,fsdp=2,seq=8192,recompute=selective", "pp=2,seq=2048,num_micro_batches=2,sp=true,tp=2")


def _priced(model, run):
    """``run()``'s result, or the refusal it raised (type and message), to compare two paths' outcomes."""
    try:
        return run(), None
    except NdcostError as exc:
        return None, (type(exc), str(exc))


def assert_same_cost(single, batched, *, exact_provenance: bool):
    assert single.strategy == batched.strategy
    assert (single.valid, single.reason, single.peak_bytes) == (batched.valid, batched.reason, batched.peak_bytes)
    assert type(single.peak_bytes) is int
    assert len(single.stages) == len(batched.stages)
    for a, b in zip(single.stages, batched.stages, strict=True):
        assert (a.stage, a.layers, a.peak_bytes) == (b.stage, b.layers, b.peak_bytes)
        assert dict(a.bytes_by_category) == dict(b.bytes_by_category)  # bytes: exact integers
        assert all(type(v) is int for v in a.bytes_by_category.values())
        assert dict(a.provenance) == dict(b.provenance)
    assert (single.time is None) == (batched.time is None)
    if single.time is not None:
        for field in ("step_seconds", "tokens_per_second", "mfu", "compute_seconds", "communication_seconds",
                      "exposed_communication_seconds", "bubble_seconds", "optimizer_seconds"):
            x, y = getattr(single.time, field), getattr(batched.time, field)
            assert math.isclose(x, y, rel_tol=1e-12, abs_tol=0.0), (field, x, y)
    seq = single.strategy.seq
    if exact_provenance:
        assert dict(single.provenance) == dict(batched.provenance)
        if single.time is not None:
            assert dict(single.time.provenance) == dict(batched.time.provenance)
    else:  # a bigger batch's provenance also names its other sequence lengths' records
        assert single.provenance["records"][seq] == batched.provenance["records"][seq]
        assert {k: v for k, v in single.provenance.items() if k not in ("records", "time")} == \
            {k: v for k, v in batched.provenance.items() if k not in ("records", "time")}
    assert single.sources() == batched.sources()


@pytest.mark.parametrize("name", MODELS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), position=st.integers(0, len(OTHERS)))
def test_evaluate_is_the_batch_row(name, data, position):
    _assert_evaluate_is_the_batch_row(name, data, position)


def _assert_evaluate_is_the_batch_row(name, data, position):
    model = _model(name)
    fields = data.draw(strategy_fields(model))
    try:
        strategy = ndcost.Strategy.from_mapping(fields)
    except NdcostError as exc:  # refused by Strategy itself: evaluate and the batch give the same reason
        with pytest.raises(type(exc)) as raised:
            model.evaluate(fields)
        assert str(raised.value) == str(exc)
        batch = model.evaluate_many([fields])
        assert not batch.valid[0] and batch.reason[0] == str(exc)
        return
    one, one_error = _priced(model, lambda: model.evaluate_many([strategy]))
    single, single_error = _priced(model, lambda: model.evaluate(strategy))
    if one_error is not None:  # the batch of one raised (a dtype the hardware states no peak for): so must evaluate
        assert single_error == one_error
        return
    rows = [ndcost.Strategy.parse(text) for text in OTHERS]
    rows.insert(position, strategy)
    big = model.evaluate_many(rows)
    assert bool(big.valid[position]) == bool(one.valid[0])
    assert big.reason[position] == one.reason[0]
    if not one.valid[0]:
        assert single_error == (InvalidStrategy, f"strategy {strategy} cannot run on {model.spec.name}: "
                                                 f"{one.reason[0]}")
        return
    assert single_error is None
    assert_same_cost(single, one.cost(0, strategy), exact_provenance=True)
    assert_same_cost(single, big.cost(position, strategy), exact_provenance=False)


SHIPPED = tuple(sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "specs" / "models").glob("*.yaml")))


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(SHIPPED), position=st.integers(0, len(OTHERS)))
def test_evaluate_is_the_batch_row_on_every_shipped_model(data, name, position):
    """The same property, the model drawn too: every model in specs/models/ (its one-row shortcuts included)."""
    _assert_evaluate_is_the_batch_row(name, data, position)


def test_every_shipped_model_is_drawn():
    assert len(SHIPPED) >= 20 and {"deepseek-v3", "qwen3-next-80b-a3b", "gpt-oss-120b"} <= set(SHIPPED)


def _drawn(generator, count):
    seen = []

    @settings(max_examples=count, deadline=None, database=None, derandomize=True,  # one fixed draw: repeatable
              suppress_health_check=[HealthCheck.too_slow])
    @given(value=generator)
    def collect(value):
        seen.append(value)

    collect()
    return seen


def test_the_generator_reaches_valid_and_invalid_strategies():
    """The property above is not vacuous: on every model many of its strategies price, and some are refused."""
    for name in MODELS:
        model = _model(name)
        seen = _drawn(strategy_fields(model), 80)
        # a compute dtype the hardware states no peak for fails a whole batch (the property checks that
        # evaluate fails alike): counted without those rows; recompute=selective, hf-cuda's op-level policy,
        # has a figure with the census off only where the formulas list every kind's calls (of these models, all
        # but Qwen3.5's: its linear attention and output gate are refused, as the property checks too)
        batch = model.evaluate_many([f for f in seen if f.get("compute_dtype") != "int8"])
        selective = np.array([f.get("recompute") == "selective" for f in seen if f.get("compute_dtype") != "int8"])
        assert selective.any() and batch.valid[selective].any() == (name != "qwen3.5-9b"), name
        assert batch.valid.sum() > (~selective).sum() / 3, (name, int(batch.valid.sum()), len(batch))
        assert (~batch.valid[~selective]).sum() > 0, name


def test_evaluate_takes_strings_and_mappings_as_the_batch_does():
    model = _model("llama-3.1-8b")
    text = "tp=2,pp=2,dp=2,seq=4096,num_micro_batches=4,recompute=core_attention"
    strategy = ndcost.Strategy.parse(text)
    expected = model.evaluate_many([strategy]).cost(0, strategy)
    assert_same_cost(model.evaluate(text), expected, exact_provenance=True)
    assert_same_cost(model.evaluate(strategy.to_dict()), expected, exact_provenance=True)


def test_a_plugin_registered_after_a_first_evaluation_is_priced(fresh):
    """The names and plugins behind the codes are kept between calls, but a late registration is seen."""
    from ndcost import manager
    from ndcost.plugins.optimizers import Optimizer
    from ndcost.registry import Source

    model = ndcost.resolve("llama-3.1-8b", census="off")
    base = model.evaluate("dp=2,seq=1024,zero=1")
    with pytest.raises(InvalidStrategy, match="four_states"):
        model.evaluate("dp=2,seq=1024,zero=1,optimizer=four_states")
    manager.registry().add("optimizer/four_states", Optimizer(name="four_states", states_per_parameter=4),
                           source=Source(distribution="test", module="test_evaluate_single"))
    assert "four_states" in model.names()["optimizer"]
    late = model.evaluate("dp=2,seq=1024,zero=1,optimizer=four_states")
    # bf16 states sharded over dp=2 by ZeRO-1: twice AdamW's two states a parameter, to the byte per stage
    for a, b in zip(base.stages, late.stages, strict=True):
        assert b.bytes_by_category["optimizer_states"] == 2 * a.bytes_by_category["optimizer_states"]
    assert "test_evaluate_single" in late.source("optimizer_states")


LAYOUTS = ("pp=1,seq=1024", "pp=4,seq=1024,num_micro_batches=8", "pp=2,vpp=2,schedule=interleaved,seq=1024,"
           "num_micro_batches=4,recompute=full,recompute_layers=1", "pp=2,vpp=2,schedule=dualpipev,seq=1024,"
           "num_micro_batches=4", "pp=2,pp_layers=20/12,seq=1024,recompute=selective", "pp=4,schedule=gpipe,seq=1024,"
           "num_micro_batches=4,recompute=core_attention,recompute_layers=3")


def test_a_single_strategy_placement_is_the_batch_row():
    """A one-row placement (kept per pipeline layout) equals its row of a batch's placement, is kept read-only,
    and is made again for another stack."""
    from ndcost.compose import placement

    model = _model("llama-3.1-8b")
    schedules = model._codebook().plugins.schedules
    strategies = [ndcost.Strategy.parse(text) for text in LAYOUTS]

    def placed(rows):
        cols = columns.encode(rows, model.names()).cols
        bounds = placement.split_bounds([s.pp_layers for s in rows])
        return placement.place(model.tables.stack, cols, schedules, pp_bounds=bounds)

    batch = placed(strategies)
    for i, strategy in enumerate(strategies):
        one = placed([strategy])
        assert placed([strategy]) is one  # kept
        ranks, chunks = strategy.pp, strategy.vpp
        for field in attrs.fields(placement.Placement):
            got = getattr(one, field.name)
            want = getattr(batch, field.name)[..., i:i + 1, :ranks, :chunks]
            assert not got.flags.writeable
            assert np.array_equal(got, want), (strategy, field.name)
    other = placement.LayerStack.from_runs(model.tables.kinds, [(model.tables.kinds[0], 8)])
    cols = columns.encode([strategies[1]], model.names()).cols
    assert placement.place(other, cols, schedules).layers.sum() == 8  # another stack: not the cached placement


@pytest.mark.parametrize("name", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"])
def test_a_collective_of_lone_groups_is_zero_of_the_batch_shape(name):
    """A group of one device exchanges nothing: 0 s, in the shape the arithmetic would broadcast to; a batch with
    groups of one and of several prices each row as that row alone."""
    from ndcost import manager

    seconds = manager.registry().get(f"collective/{name}").seconds
    message = np.array([[1e6, 2e6, 4e6]])
    lone = seconds(message, np.ones((2, 1)), np.full((2, 1), 1e11), 5e-6)
    assert lone.shape == (2, 3) and lone.dtype == np.float64 and not lone.any()
    sizes = np.array([1.0, 8.0, 1.0, 2.0])
    mixed = seconds(np.full(4, 1e8), sizes, 1e11, 5e-6)
    assert mixed[0] == mixed[2] == 0.0 and (mixed[[1, 3]] > 0).all()
    for i, size in enumerate(sizes):
        assert seconds(np.full(1, 1e8), np.array([size]), 1e11, 5e-6)[0] == mixed[i]


# every field a different value from BASE (with what it needs beside it; valid or refused alike): what evaluate keeps of one strategy (by the
# fields a figure depends on) must never answer for a strategy differing in another field
BASE = ("dp=2,fsdp=2,tp=2,pp=2,ep=2,sp=true,seq=2048,micro_batch=1,num_micro_batches=4,param_dtype=fp32,"
        "compute_dtype=bf16")
OTHER_VALUE = {"dp": 1, "fsdp": 4, "tp": 4, "pp": 4, "vpp": 2, "cp": 2, "ep": 4, "etp": 2, "zero": 1, "sp": False,
               "cp_algo": "ulysses", "schedule": "gpipe", "micro_batch": 2, "num_micro_batches": 8, "seq": 4096,
               "recompute": "full", "recompute_layers": 1, "vocab_parallel": True, "optimizer": "sgd",
               "param_dtype": "bf16", "compute_dtype": "fp16", "grad_dtype": "fp32", "optimizer_dtype": "bf16",
               "master_dtype": "fp32", "pp_layers": (20, 28), "moe_imbalance": 1.5, "allocator_overhead": 0.1,
               "shard_mesh": "fsdp_cp", "reshard_after_forward": False, "offload_optimizer": True,
               "offload_params": True, "offload_activations": True, "float8": "tensorwise",
               "float8_all_gather": {"float8": "tensorwise", "float8_all_gather": True},
               "float8_experts": {"float8": "tensorwise", "float8_experts": True}, "compile": True,
               "async_tp": {"async_tp": True, "compile": True}, "gradient_sync": "last_micro_batch",
               "pp_engine": "torch", "pp_return_outputs": {"pp_engine": "torch", "pp_return_outputs": True},
               "fsdp_engine": "megatron", "ddp_engine": {"ddp_engine": "torch", "fsdp": 1}, "loss_engine": "megatron",
               "cp_rotate": {"cp_rotate": "p2p", "cp": 2},
               "ep_dispatcher": {"ep_dispatcher": "deepep", "ep": 4},
               "reduce_bucket_elements": {"reduce_bucket_elements": 1000, "zero": 3, "fsdp": 1, "pp": 1},
               "reduce_buckets": {"reduce_buckets": 2, "reduce_bucket_elements": 1000, "zero": 1, "fsdp": 1, "pp": 1},
               "reuse_distance_elements": {"reuse_distance_elements": 10 ** 9, "zero": 3, "fsdp": 1, "pp": 1},
               "live_parameters_elements": {"live_parameters_elements": 10 ** 9, "zero": 3, "fsdp": 1, "pp": 1},
               "sub_group_elements": {"sub_group_elements": 10 ** 6, "zero": 3, "fsdp": 1, "pp": 1,
                                      "ddp_engine": "deepspeed"}}


def test_every_field_reaches_one_strategys_figures():
    assert set(OTHER_VALUE) == {f.name for f in attrs.fields(ndcost.Strategy)}, "give the new field a value"
    model = _model("qwen3-30b-a3b")
    base = ndcost.Strategy.parse(BASE)
    for name, value in OTHER_VALUE.items():
        other = attrs.evolve(base, **(value if isinstance(value, dict) else {name: value}))
        model.evaluate(base)  # what it keeps of the base comes first
        single, refused = _priced(model, lambda s=other: model.evaluate(s))
        batch = model.evaluate_many([other, base])  # two rows: the batched path, which keeps nothing by row
        if refused:
            assert not batch.valid[0] and refused[1].endswith(batch.reason[0]), (name, refused, batch.reason[0])
            continue
        assert batch.valid[0], (name, batch.reason[0])
        assert_same_cost(single, batch.cost(0, other), exact_provenance=other.seq == base.seq)
