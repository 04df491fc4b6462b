"""The strategy language: parse, the string form, defaults and validation."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ndcost
from ndcost import Strategy
from ndcost.errors import InvalidValue


def test_parse_basic():
    s = ndcost.Strategy.parse("dp=2,tp=4,seq=4096")
    assert (s.dp, s.tp, s.seq) == (2, 4, 4096)
    assert s.devices == 8
    assert (s.fsdp, s.pp, s.vpp, s.cp, s.ep, s.etp, s.zero) == (1, 1, 1, 1, 1, 1, 0)


def test_defaults():
    s = Strategy()
    assert s.sp is False and s.cp_algo == "ring" and s.schedule == "1f1b"
    assert s.micro_batch == 1 and s.num_micro_batches == 1 and s.seq is None
    assert s.recompute == "none" and s.recompute_layers is None and s.vocab_parallel is False
    assert s.optimizer == "adamw" and s.param_dtype == "bf16" and s.master_dtype == "none"
    # compute, grad and optimizer dtypes default to the parameter dtype
    assert (s.compute, s.grad, s.optimizer_state_dtype) == ("bf16", "bf16", "bf16")
    assert Strategy(param_dtype="fp32").grad == "fp32"
    assert s.pp_layers is None and s.moe_imbalance == 1.0 and s.allocator_overhead == 0.0
    assert str(s) == "" and Strategy.parse("") == s


def test_field_names_are_the_strategy_fields():
    assert set(Strategy.field_names()) == {
        "dp", "fsdp", "tp", "pp", "vpp", "cp", "ep", "etp", "zero", "sp", "cp_algo", "schedule", "micro_batch",
        "num_micro_batches", "seq", "recompute", "recompute_layers", "vocab_parallel", "optimizer", "param_dtype",
        "compute_dtype", "grad_dtype", "optimizer_dtype", "master_dtype", "pp_layers", "moe_imbalance",
        "allocator_overhead", "shard_mesh", "reshard_after_forward", "offload_optimizer", "offload_params",
        "offload_activations", "float8", "float8_all_gather", "float8_experts", "compile", "async_tp",
        "gradient_sync", "pp_engine", "pp_return_outputs", "fsdp_engine", "ddp_engine", "loss_engine", "cp_rotate",
        "ep_dispatcher", "reduce_bucket_elements", "reduce_buckets", "reuse_distance_elements",
        "live_parameters_elements", "sub_group_elements"}


def test_parse_values_of_every_kind():
    s = Strategy.parse("dp=2, fsdp=4, tp=2, pp=4, vpp=2, sp=true, zero=3, cp=2, cp_algo=Ulysses, "
                       "schedule=interleaved, recompute=selective, recompute_layers=3, optimizer=AdamW, "
                       "param_dtype=bfloat16, master_dtype=fp32, pp_layers=4/4/4/4/4/4/4/4, moe_imbalance=1.25, "
                       "vocab_parallel=yes, allocator_overhead=0.05, micro_batch=2, num_micro_batches=16, seq=8192")
    assert s.devices == 2 * 4 * 2 * 2 * 4
    assert s.cp_algo == "ulysses" and s.optimizer == "adamw" and s.param_dtype == "bf16"
    assert s.pp_layers == (4,) * 8 and s.sp is True and s.vocab_parallel is True
    assert Strategy.parse(str(s)) == s


def test_experts_resplit_the_same_ranks():
    s = Strategy(dp=4, tp=2, ep=4, etp=2)
    assert s.expert_data_parallel == 1
    with pytest.raises(InvalidValue, match="ep \\* etp"):
        Strategy(dp=2, tp=2, ep=8)


def test_pp_layers_must_match_the_stages():
    with pytest.raises(InvalidValue, match="pp_layers"):
        Strategy.parse("pp=4,pp_layers=8/8/8")


@pytest.mark.parametrize("text,field,allowed", [
    ("tp=0", "tp", ">= 1"),
    ("seq=-1", "seq", ">= 1"),
    ("dp=two", "dp", "integer"),
    ("zero=4", "zero", "0 to 3"),
    ("optimizer=Adam W", "optimizer", "plugin name"),
    ("cp_algo=spiral", "cp_algo", "ulysses"),
    ("schedule=1f1b!", "schedule", "plugin name"),
    ("recompute=some", "recompute", "core_attention"),
    ("param_dtype=fp4", "param_dtype", "bf16"),
    ("sp=maybe", "sp", "true or false"),
    ("moe_imbalance=0.5", "moe_imbalance", ">= 1"),
    ("allocator_overhead=2", "allocator_overhead", "0.0 to 1.0"),
    ("tensor_parallel=2", "tensor_parallel", "tp"),
    ("dp", "dp", "field=value"),
    ("dp=2,dp=4", "dp", "twice"),
])
def test_invalid_values_name_field_and_allowed(text, field, allowed):
    with pytest.raises(InvalidValue) as err:
        Strategy.parse(text)
    message = str(err.value)
    assert field in message and allowed in message


def test_plugin_names_are_checked_against_the_registry_at_evaluation_not_at_construction():
    import sys

    import ndcost
    from ndcost.errors import InvalidStrategy

    # any plugin-style name builds (a value type never loads the plugins) ...
    assert Strategy(schedule="zb", optimizer="AdaFactorX").optimizer == "adafactorx"
    # ... and the evaluation refuses one nobody registered, listing those registered
    model = ndcost.resolve("llama-3.1-8b", census="off")
    for text, field, allowed in (("schedule=zb", "schedule", "dualpipev"),
                                 ("optimizer=adafactorx", "optimizer", "adamw")):
        with pytest.raises((InvalidStrategy, InvalidValue)) as err:
            model.evaluate(Strategy.parse(text + ",seq=1024"))
        message = str(err.value)
        assert f"Strategy.{field}: unknown {field}" in message and allowed in message
        assert f"'{field}/<name>'" in message
    assert "ndcost.plugins" in " ".join(sys.modules)  # the evaluation, not the strategy, loaded them


def test_building_a_strategy_loads_no_plugin():
    import subprocess
    import sys

    code = ("import sys, ndcost; ndcost.Strategy(seq=4096, schedule='interleaved', vpp=2, pp=2, optimizer='sgd'); "
            "print([m for m in sys.modules if m.startswith('ndcost.plugins')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_plugin_name_message_names_the_field_the_known_names_and_the_namespace():
    from ndcost.values import unknown_plugin_name_message

    assert unknown_plugin_name_message("schedule", "schedule", "zb", ["1f1b", "gpipe"]) == (
        "Strategy.schedule: unknown schedule 'zb'; allowed: 1f1b, gpipe "
        "(a plugin can register more as 'schedule/<name>')")


def test_unknown_field_lists_the_fields():
    with pytest.raises(InvalidValue) as err:
        Strategy.from_mapping({"tp": 2, "pipeline": 4})
    assert "pipeline" in str(err.value) and "num_micro_batches" in str(err.value)


@pytest.mark.parametrize("build", [lambda: Strategy(foo=1), lambda: Strategy(tp=2, pipeline=4)])
def test_direct_construction_refuses_unknown_fields_naming_them(build):
    # attrs alone would raise a bare TypeError; a strategy names the field and the allowed ones
    with pytest.raises(InvalidValue) as err:
        build()
    message = str(err.value)
    assert ("'foo'" in message or "'pipeline'" in message) and "num_micro_batches" in message
    assert "allocator_overhead" in message


def test_positional_fields_are_refused_naming_the_fields():
    with pytest.raises(InvalidValue, match="by name.*fields: dp, fsdp, tp"):
        Strategy(2)


def test_evolve_keeps_validation():
    import attrs

    assert attrs.evolve(Strategy(tp=2), seq=128) == Strategy(tp=2, seq=128)
    with pytest.raises(InvalidValue, match="Strategy.tp"):
        attrs.evolve(Strategy(tp=2), tp=0)


def test_optimizer_names_case_insensitive():
    assert Strategy(optimizer="SGD").optimizer == "sgd"
    assert Strategy.parse("optimizer=AdaGrad").optimizer == "adagrad"


def test_frozen_and_hashable():
    s = Strategy(tp=2)
    with pytest.raises(Exception):
        s.tp = 4
    assert len({s, Strategy(tp=2)}) == 1


# ---------------------------------------------------------------------------
# hypothesis: parse(str(s)) == s
# ---------------------------------------------------------------------------
DTYPES = ["fp32", "bf16", "fp16", "fp8", "int8"]


@st.composite
def strategies(draw):
    small = st.integers(1, 8)
    dp, fsdp, tp, cp = draw(small), draw(small), draw(small), draw(small)
    ranks = dp * fsdp * tp * cp
    divisors = [d for d in range(1, ranks + 1) if ranks % d == 0]
    ep = draw(st.sampled_from(divisors))
    etp = draw(st.sampled_from([d for d in divisors if (ranks // ep) % d == 0]))
    pp, vpp = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    pp_layers = draw(st.none() | st.lists(st.integers(1, 40), min_size=pp * vpp, max_size=pp * vpp).map(tuple))
    return Strategy(
        dp=dp, fsdp=fsdp, tp=tp, cp=cp, ep=ep, etp=etp, pp=pp, vpp=vpp, pp_layers=pp_layers,
        zero=draw(st.integers(0, 3)), sp=draw(st.booleans()),
        cp_algo=draw(st.sampled_from(["ring", "ulysses", "colossal", "hybrid"])),
        schedule=draw(st.sampled_from(["1f1b", "interleaved", "gpipe", "dualpipev"])),
        micro_batch=draw(st.integers(1, 64)), num_micro_batches=draw(st.integers(1, 512)),
        seq=draw(st.none() | st.integers(1, 2 ** 20)),
        recompute=draw(st.sampled_from(["none", "full", "selective", "core_attention"])),
        recompute_layers=draw(st.none() | st.integers(0, 100)),
        vocab_parallel=draw(st.booleans()),
        optimizer=draw(st.sampled_from(["adamw", "adam", "sgd", "adagrad", "ADAM"])),
        param_dtype=draw(st.sampled_from(DTYPES)),
        compute_dtype=draw(st.none() | st.sampled_from(DTYPES)),
        grad_dtype=draw(st.none() | st.sampled_from(DTYPES)),
        optimizer_dtype=draw(st.none() | st.sampled_from(DTYPES)),
        master_dtype=draw(st.sampled_from(DTYPES + ["none"])),
        moe_imbalance=draw(st.floats(1.0, 8.0, allow_nan=False)),
        allocator_overhead=draw(st.floats(0.0, 1.0, allow_nan=False)),
    )


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(strategies())
def test_parse_of_own_string_gives_it_back(s):
    text = str(s)
    assert Strategy.parse(text) == s
    assert Strategy.from_mapping(s.to_dict()) == s
    assert s.devices == s.dp * s.fsdp * s.cp * s.tp * s.pp


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["dp", "fsdp", "tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch", "num_micro_batches",
                        "seq"]), st.integers(-10 ** 6, 0))
def test_non_positive_degrees_refused(field, value):
    with pytest.raises(InvalidValue) as err:
        Strategy.parse(f"{field}={value}")
    assert f"Strategy.{field}" in str(err.value) and ">= 1" in str(err.value)


# ---------------------------------------------------------------------------
# the other value types are validated too
# ---------------------------------------------------------------------------
def _spec(**overrides):
    from ndcost import LayerGroup, LayerKind, ModelSpec

    fields = dict(name="toy", model_type="llama", family="llama", hidden_size=64, vocab_size=100,
                  num_attention_heads=4, layers=[LayerGroup(kind="dense", count=2)],
                  kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")})
    fields.update(overrides)
    return ModelSpec(**fields)


@pytest.mark.parametrize("field,value", [("hidden_size", 0), ("q_lora_rank", -1), ("num_experts", 2.5),
                                         ("moe_intermediate_size", "big"), ("head_dim", -8)])
def test_model_spec_refuses_bad_widths_naming_the_field(field, value):
    with pytest.raises(InvalidValue, match=f"ModelSpec.{field}"):
        _spec(**{field: value})


def test_model_spec_layer_stack():
    from ndcost import LayerGroup, LayerKind

    spec = _spec(layers=[LayerGroup(kind="dense", count=3), LayerGroup(kind="moe", count=5),
                         LayerGroup(kind="mtp_moe", count=1, mtp=True)],
                 kind_specs={"dense": LayerKind(attention="gqa", mlp="dense"),
                             "moe": LayerKind(attention="gqa", mlp="moe"),
                             "mtp_moe": LayerKind(attention="gqa", mlp="moe", mtp=True)})
    assert (spec.num_layers, spec.num_mtp_layers, spec.kinds) == (8, 1, ("dense", "moe", "mtp_moe"))
    with pytest.raises(InvalidValue, match="mtp"):
        LayerGroup(kind="moe", count=1, mtp=True)
    with pytest.raises(InvalidValue, match="no layers"):
        _spec(layers=[])
    with pytest.raises(InvalidValue, match="moe are not described"):
        _spec(layers=[LayerGroup(kind="moe", count=1)])


def test_named_fields_are_the_given_ones_converted_defaults_included():
    assert Strategy.named_fields("tp=2, sp=yes,zero=0") == {"tp": 2, "sp": True, "zero": 0}
    assert Strategy.named_fields({"pp": 2, "pp_layers": [3, 5], "seq": "4096"}) == {"pp": 2, "pp_layers": "3/5",
                                                                                  "seq": 4096}
    with pytest.raises(InvalidValue, match="tensor_paralel"):
        Strategy.named_fields("tensor_paralel=2")
