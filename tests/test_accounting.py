"""ndcost.accounting: training bytes from shapes and byte widths, and exact counts (packed W4, Kronecker
factors, the Ouro layout, a tensor inventory).

Expected figures are worked examples or hand derivations written out below,
never the code's own output.
"""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ndcost
from ndcost import accounting
from ndcost.errors import InvalidValue

KEYS = {"parameters", "gradients", "activations", "optimizer_state", "total"}


# ---------------------------------------------------------------------------
# training bytes: three worked examples, exactly (parameters and gradients of the parameters' shapes;
# optimizer states: none for SGD, one a parameter for AdaGrad, two for Adam)
# ---------------------------------------------------------------------------
def test_training_bytes_example_adam():
    out = ndcost.accounting.training_bytes(
        param_shapes=[[4, 3], [3]], param_bytes_per_element=2, grad_bytes_per_element=4,
        activation_shapes=[[2, 4]], activation_bytes_per_element=2, optimizer="adam", optimizer_bytes_per_element=4)
    assert out == {"parameters": 30, "gradients": 60, "activations": 16, "optimizer_state": 120, "total": 226}
    assert all(type(v) is int for v in out.values())


def test_training_bytes_example_sgd():
    out = accounting.training_bytes([[2, 2]], 4, 4, [], 4, "sgd", 4)
    assert out == {"parameters": 16, "gradients": 16, "activations": 0, "optimizer_state": 0, "total": 32}


def test_training_bytes_example_adagrad():
    out = accounting.training_bytes([[128, 64], [64]], 2, 2, [[32, 128]], 2, "adagrad", 4)
    assert out == {"parameters": 16512, "gradients": 16512, "activations": 8192, "optimizer_state": 33024,
                   "total": 74240}


@pytest.mark.parametrize("name,states", [("sgd", 0), ("adagrad", 1), ("adam", 2), ("adamw", 2),
                                         ("AdamW", 2), ("  SGD ", 0), ("ADAGRAD", 1)])
def test_optimizer_state_counts_case_insensitive(name, states):
    # 10 parameters at 4 bytes a state element
    out = accounting.training_bytes([[10]], 2, 2, [], 2, name, 4)
    assert out["optimizer_state"] == states * 10 * 4
    assert accounting.optimizer_states(name) == states


def test_scalar_zero_dimension_and_empty_collection():
    # [] is a scalar (one element), a zero dimension gives zero elements, [] of shapes holds no tensors
    out = accounting.training_bytes([[], [0, 7], [3]], 2, 2, [], 2, "adam", 4)
    assert out["parameters"] == (1 + 0 + 3) * 2
    assert out["optimizer_state"] == 2 * 4 * 4
    assert out["activations"] == 0
    assert accounting.training_bytes([], 2, 2, [], 2, "adam", 4)["total"] == 0


def test_exact_python_ints_for_huge_shapes():
    # 2**40 * 2**40 elements overflow any fixed-width integer
    out = accounting.training_bytes([[2 ** 40, 2 ** 40]], 2, 2, [[2 ** 50]], 2, "adamw", 4)
    assert out["parameters"] == 2 ** 81
    assert out["optimizer_state"] == 2 * 4 * 2 ** 80
    assert out["total"] == 2 ** 81 + 2 ** 81 + 2 ** 51 + 2 ** 83


def test_unknown_optimizer_lists_known():
    with pytest.raises(InvalidValue) as err:
        accounting.training_bytes([[2]], 2, 2, [], 2, "adafactorx", 4)
    message = str(err.value)
    assert "adafactorx" in message
    for known in ("sgd", "adagrad", "adam", "adamw"):
        assert known in message


@pytest.mark.parametrize("kwargs,field", [
    (dict(param_shapes=[[2, -1]]), "param_shapes"),
    (dict(param_shapes=[3]), "param_shapes"),
    (dict(activation_shapes=[[1.5]]), "activation_shapes"),
    (dict(param_bytes_per_element=-2), "param_bytes_per_element"),
    (dict(grad_bytes_per_element=0.5), "grad_bytes_per_element"),
    (dict(optimizer_bytes_per_element=True), "optimizer_bytes_per_element"),
])
def test_invalid_inputs_name_the_argument(kwargs, field):
    args = dict(param_shapes=[[2, 2]], param_bytes_per_element=2, grad_bytes_per_element=2, activation_shapes=[],
                activation_bytes_per_element=2, optimizer="adam", optimizer_bytes_per_element=4)
    args.update(kwargs)
    with pytest.raises(InvalidValue, match=field):
        accounting.training_bytes(**args)


shape = st.lists(st.integers(0, 64), max_size=4)
shapes = st.lists(shape, max_size=5)
width = st.integers(0, 8)
optimizer = st.sampled_from(["sgd", "adagrad", "adam", "adamw", "Adam"])


@settings(max_examples=60, deadline=None)
@given(shapes, width, width, shapes, width, optimizer, width)
def test_total_is_sum_of_parts_and_parts_follow_the_formula(ps, pw, gw, acts, aw, opt, ow):
    out = accounting.training_bytes(ps, pw, gw, acts, aw, opt, ow)
    assert set(out) == KEYS
    assert out["total"] == out["parameters"] + out["gradients"] + out["activations"] + out["optimizer_state"]
    n = sum(math.prod(s) for s in ps)
    states = {"sgd": 0, "adagrad": 1, "adam": 2, "adamw": 2}[opt.lower()]
    assert out["parameters"] == n * pw and out["gradients"] == n * gw
    assert out["activations"] == sum(math.prod(s) for s in acts) * aw
    assert out["optimizer_state"] == states * n * ow


@settings(max_examples=40, deadline=None)
@given(shapes, shapes, optimizer, st.integers(1, 4), st.integers(1, 5))
def test_bytes_linear_in_byte_width(ps, acts, opt, w, k):
    base = accounting.training_bytes(ps, w, w, acts, w, opt, w)
    scaled = accounting.training_bytes(ps, k * w, k * w, acts, k * w, opt, k * w)
    assert scaled == {key: k * value for key, value in base.items()}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(1, 16), min_size=1, max_size=3), min_size=1, max_size=4), st.data())
def test_a_zero_dimension_gives_zero(ps, data):
    zeroed = [s[:i] + [0] + s[i + 1:] for s in ps for i in [data.draw(st.integers(0, len(s) - 1))]]
    out = accounting.training_bytes(zeroed, 2, 4, zeroed, 2, "adam", 4)
    assert out == dict.fromkeys(KEYS, 0)


# ---------------------------------------------------------------------------
# packed W4, Kronecker counts, the Ouro layout
# ---------------------------------------------------------------------------
def test_packed_w4_bytes_by_hand():
    # a 4096-wide row: 4096 / 2 = 2048 bytes of codes + 4096 / 32 = 128 fp32 scales of 4 bytes = 2560
    assert accounting.packed_w4_bytes(4096, 4096) == 4096 * (2048 + 128 * 4) == 10_485_760
    # a 33-wide row: 17 bytes of codes (the last half-filled) + two started groups of 32 -> 8 bytes
    assert accounting.packed_w4_bytes(3, 33) == 3 * 25
    assert accounting.packed_w4_bytes(1, 1) == 1 + 4


@pytest.mark.parametrize("rows,width", [(0, 8), (8, 0), (-1, 4), (2.5, 4)])
def test_packed_w4_bytes_refuses_non_positive(rows, width):
    with pytest.raises(InvalidValue):
        accounting.packed_w4_bytes(rows, width)


def test_kronecker_counts_by_hand():
    # factors 32x32 and 64x64: 1024 + 4096; SVD form U, V (n x n each) and a diagonal (n): 2n^2 + n each
    assert accounting.kronecker_counts(32, 64) == {"effective_factors": 1024 + 4096,
                                                   "svd_trainable": 2048 + 32 + 8192 + 64}
    assert accounting.kronecker_counts(64, 88) == {"effective_factors": 4096 + 7744,
                                                   "svd_trainable": 8192 + 64 + 15488 + 88}
    with pytest.raises(InvalidValue):
        accounting.kronecker_counts(0, 4)


def test_ouro_defaults_by_hand():
    out = accounting.ouro_analytic_accounting()
    hidden, vocab, layers = 2048, 49152, 24
    # per layer: q, k, v, o are hidden x hidden (kv heads = heads); gate, up, down are hidden x inter
    per_layer_projection = 4 * 2048 * 2048 + 3 * 2048 * 5632
    assert per_layer_projection == 16_777_216 + 34_603_008
    assert out["projection_elements"] == 24 * 51_380_224 == 1_233_125_376
    # one fp32 scale per 32 inputs: q,k,v,o 2048 rows x 64 groups, gate/up 5632 x 64, down 2048 x 176
    assert out["group32_weight_scales"] == 24 * (4 * 2048 * 64 + 2 * 5632 * 64 + 2048 * 176)
    # untied embedding and head, 4 norms a layer + the final norm, and the exit gate (hidden weights + bias)
    embedding_and_head = 2 * vocab * hidden
    norms = (4 * layers + 1) * hidden
    exit_gate = hidden + 1
    non_projection = embedding_and_head + norms + exit_gate
    assert non_projection == 201_326_592 + 198_656 + 2_049
    backbone = 1_233_125_376 + non_projection
    assert out["backbone_stored_elements"] == backbone == 1_434_652_673
    assert out["bf16_payload_bytes"] == 2 * backbone == 2_869_305_346
    assert out["bf16_payload_GiB"] == pytest.approx(2_869_305_346 / 1024 ** 3)
    assert out["non_projection_bf16_payload_bytes"] == 2 * non_projection
    # packed rows: 2048 wide -> 1024 + 64 * 4 = 1280 bytes; 5632 wide -> 2816 + 176 * 4 = 3520 bytes
    assert out["packed_projection_payload_bytes"] == 24 * (4 * 2048 * 1280 + 2 * 5632 * 1280 + 2048 * 3520)
    # hidden factors (32, 64) -> 5120 / 10336, intermediate (64, 88) -> 11840 / 23832; 3 hidden-side + 1
    assert out["shared_transform_counts"] == {"effective_factors": 24 * (3 * 5120 + 11840),
                                              "svd_trainable": 24 * (3 * 10336 + 23832)}
    assert out["shared_cta_uv"] == 2 * 2048 * 8
    assert out["loop_dependent_las"] == 24 * 4 * 4
    assert out["loop_dependent_cta"] == 3 * (2 * 2048 + 8)
    extra = 384 + 12312
    assert out["loop_dependent_bounds"] == {"effective_factors": [16 * 5120 + extra, 16 * 11840 + extra],
                                            "svd_trainable": [16 * 10336 + extra, 16 * 23832 + extra]}
    assert out["assumptions"] == ("fixed local Kronecker layout, all loop copies, no optional diagonals; "
                                  "not measured loaded memory")
    assert set(out) == {
        "projection_elements", "group32_weight_scales", "backbone_stored_elements", "bf16_payload_bytes",
        "bf16_payload_GiB", "packed_projection_payload_bytes", "non_projection_bf16_payload_bytes",
        "shared_transform_counts", "shared_cta_uv", "loop_dependent_las", "loop_dependent_cta",
        "loop_dependent_bounds", "assumptions"}


def test_ouro_grouped_query_attention_shrinks_k_and_v():
    # 4 kv heads of 128 -> k and v are 512 x 2048 each
    gqa = accounting.ouro_analytic_accounting(layers=1, kv_heads=4)
    assert gqa["projection_elements"] == 2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 2048 * 5632


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(hidden=2000), "hidden"),  # 2000 % 16 != 0 and 32 * 64 != 2000
    (dict(heads=3), "heads"),
    (dict(hidden_factors=(32, 32)), "hidden_factors"),
    (dict(intermediate_factors=(64, 64)), "intermediate_factors"),
    (dict(layers=0), "layers"),
    (dict(loops=0), "loops"),
    (dict(hidden_factors=(32,)), "hidden_factors"),
])
def test_ouro_validation(kwargs, fragment):
    with pytest.raises(InvalidValue, match=fragment):
        accounting.ouro_analytic_accounting(**kwargs)


def test_ouro_is_keyword_only():
    with pytest.raises(TypeError):
        accounting.ouro_analytic_accounting(24)


# ---------------------------------------------------------------------------
# the tensor inventory
# ---------------------------------------------------------------------------
def test_tensor_tree_inventory_dedups_aliases():
    torch = pytest.importorskip("torch")
    weight = torch.zeros(4, 8, dtype=torch.float32)            # 128 bytes of storage
    view = weight[1:3]                                        # a view: its own object, same storage
    other = torch.zeros(10, dtype=torch.bfloat16)             # 20 bytes
    tree = {"w": weight, "tied": weight, "nested": [view, (other, {"again": other})], "x": 3, "s": "text"}
    out = accounting.tensor_tree_inventory(tree)
    assert out["tensor_objects"] == 3                          # weight, view, other; repeats count once
    assert out["tensor_elements"] == 32 + 16 + 10
    assert out["logical_tensor_bytes"] == 32 * 4 + 16 * 4 + 10 * 2
    assert out["unique_storage_bytes"] == 128 + 20
    assert out["excludes"] == "allocator overhead, runtime workspaces, KV cache, Python containers"


def test_tensor_tree_inventory_meta_storages_are_not_merged():
    torch = pytest.importorskip("torch")
    a = torch.empty(16, device="meta")
    b = torch.empty(16, device="meta")                        # same size, no address: still two storages
    out = accounting.tensor_tree_inventory([a, b, a[:4]])
    assert out["tensor_objects"] == 3
    assert out["unique_storage_bytes"] == 2 * 64


@pytest.mark.slow
def test_tensor_tree_inventory_of_fake_tensors(recwarn):
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(8, 4)                                  # 128 bytes each, no real address
        b = torch.empty(8, 4)
        view = a[2:]
    out = accounting.tensor_tree_inventory({"a": a, "b": b, "view": view})
    assert out["tensor_objects"] == 3
    assert out["logical_tensor_bytes"] == (32 + 32 + 24) * 4
    assert out["unique_storage_bytes"] == 2 * 128
    assert not [w for w in recwarn if "data pointer" in str(w.message)]


def test_tensor_tree_inventory_of_a_module_with_tied_weights():
    torch = pytest.importorskip("torch")
    embed = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    model = torch.nn.ModuleDict({"embed": embed, "head": head, "norm": torch.nn.LayerNorm(4)})
    out = accounting.tensor_tree_inventory(model)
    assert out["tensor_objects"] == 3                          # tied weight once, LayerNorm weight and bias
    assert out["unique_storage_bytes"] == (40 + 4 + 4) * 4


def test_tensor_tree_inventory_survives_cycles():
    torch = pytest.importorskip("torch")
    tree = {"t": torch.ones(2)}
    tree["self"] = tree
    assert accounting.tensor_tree_inventory(tree)["tensor_objects"] == 1


def test_public_functions_forward_to_the_registry(monkeypatch):
    """ndcost.accounting looks each function up as accounting/<name>, so a plugin can override one."""
    import types

    from ndcost import manager

    override = types.ModuleType("override_training_bytes")

    @ndcost.hookimpl
    def ndcost_register(register):
        register("accounting/training_bytes", lambda **kw: {"overridden": True, **kw}, override=True)

    override.ndcost_register = ndcost_register
    loaded = manager.load(extra_modules={"override": override})
    monkeypatch.setattr(manager, "_current", loaded)
    out = accounting.training_bytes([[1]], 1, 1, [], 1, "sgd", 1)
    assert out["overridden"] is True and out["optimizer"] == "sgd"
    assert accounting.packed_w4_bytes(1, 32) == 16 + 4        # the others are untouched
