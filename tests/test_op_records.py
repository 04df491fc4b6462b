"""The op records: schema, merging through the hook, the evaluation API, values of a ModelSpec, CP.

Expected figures are hand derivations written next to each test (bytes of the
tensors a layer keeps for its backward, 2 bytes an element unless stated).
"""
import types

import pytest

from ndcost import hookimpl, manager
from ndcost.errors import InvalidValue, PluginLoadError, RegistrationError, StalePluginSet, UnknownKey
from ndcost.manager import PluginLoadWarning
from ndcost.plugins import op_records as R
from ndcost.plugins.expressions import ExpressionError
from ndcost.records import KindRecord
from ndcost.layer import LayerKind
from ndcost.values import OPS, PARTS, RECOMPUTE, LayerGroup, ModelSpec, Strategy

# GPT-2's layer: an ungated 4h MLP, learned positions, dropout 0.1 (GPT2Config's attn_pdrop, resid_pdrop)
GPT2_LAYER = LayerKind(attention="gqa", mlp="dense", mlp_matrices=2, rotary=False, activation="gelu_new",
                       attention_dropout=0.1, hidden_dropout=0.1)
GQA_DENSE = LayerKind(attention="gqa", mlp="dense")


# ---------------------------------------------------------------------------
# specs built directly (the families' loader is not needed here)
# ---------------------------------------------------------------------------
def gpt2():
    return ModelSpec(name="gpt2-medium", model_type="gpt2", family="gpt2", hidden_size=1024, vocab_size=50257,
                     num_attention_heads=16, intermediate_size=4096, layers=(LayerGroup(kind="dense", count=24),),
                     kind_specs={"dense": GPT2_LAYER})


def llama():
    # Llama-3.1-8B's widths: GQA 32/8 heads of 128, SwiGLU 14336
    return ModelSpec(name="llama-like", model_type="llama", family="llama", hidden_size=4096, vocab_size=128256,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                     layers=(LayerGroup(kind="dense", count=32),), kind_specs={"dense": GQA_DENSE})


def deepseek():
    # DeepSeek-V3's widths: MLA (q latent 1536, kv latent 512, 128 + 64 query/key, 128 values),
    # 256 routed experts of 2048, top 8, one shared expert
    return ModelSpec(name="deepseek-like", model_type="deepseek_v3", family="deepseek_v3", hidden_size=7168,
                     vocab_size=129280, num_attention_heads=128, num_key_value_heads=128, intermediate_size=18432,
                     q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                     num_experts=256, num_shared_experts=1, num_experts_per_tok=8, moe_intermediate_size=2048,
                     first_k_dense=3,
                     layers=(LayerGroup(kind="dense", count=3), LayerGroup(kind="moe", count=58),
                             LayerGroup(kind="mtp", count=1, mtp=True)),
                     kind_specs={"dense": LayerKind(attention="mla", mlp="dense"),
                                 "moe": LayerKind(attention="mla", mlp="moe"),
                                 "mtp": LayerKind(attention="mla", mlp="moe", mtp=True)})


def qwen3_next():
    # Qwen3-Next-80B-A3B's widths: gated delta net 16 key / 32 value heads of 128; gated full attention
    return ModelSpec(name="qwen3-next-like", model_type="qwen3_next", family="qwen3_next", hidden_size=2048,
                     vocab_size=151936, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                     intermediate_size=5120, num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
                     shared_expert_intermediate_size=512, linear_num_key_heads=16, linear_num_value_heads=32,
                     linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                     layers=(LayerGroup(kind="linear_attention", count=3), LayerGroup(kind="full_attention", count=1)),
                     kind_specs={"linear_attention": LayerKind(attention="gated_delta_net", mlp="moe", qk_norm=True,
                                                               output_gate=True),
                                 "full_attention": LayerKind(attention="gqa", mlp="moe", qk_norm=True,
                                                             output_gate=True)})


@pytest.fixture(scope="module")
def records():
    return R.load_op_records()


# ---------------------------------------------------------------------------
# the built-in records
# ---------------------------------------------------------------------------
def test_builtin_ops_are_the_op_vector_each_with_a_switch(records):
    assert tuple(records.ops) == OPS
    for name, op in records.ops.items():
        assert op.switch in records.switches and op.doc
        assert records.record(name) is op


def test_builtin_slots_parts_and_modes(records):
    expected = {"qkv": "attention", "score": "attention", "proj": "attention", "mla": "attention",
                "linear_proj": "attention", "linrec": "attention", "norm": "norm", "ffn": "ffn",
                "router": "router", "shared": "shared", "routed": "routed", "checkpoint": "other", "mtp": "mtp"}
    assert {name: slot.part for name, slot in records.slots.items()} == expected
    assert all(slot.part in PARTS for slot in records.slots.values())
    assert set(RECOMPUTE) <= set(records.modes)
    for name in ("micro_factor", "dropless_tok_factor", "kv_shards", "bytes_act", "tokens"):
        assert name in records.values
    assert records.defaults["micro_factor"] == 1 and records.defaults["dropless_tok_factor"] == 1
    assert "op_records" in records.sources[0] and records.keeps("linrec") == ("linrec",)


def test_records_come_through_the_hook():
    plugin_set = manager.plugins()
    assert R.load_op_records(plugin_set) is R.load_op_records(plugin_set)  # merged once a plugin set
    loaded = {p.name: p for p in plugin_set.plugins}
    assert loaded["op_records"].distribution == "ndcost" and loaded["op_records"].error is None


def test_unknown_lookups_name_the_closest(records):
    with pytest.raises(UnknownKey, match="closest: softmax"):
        records.record("softmx")
    with pytest.raises(UnknownKey, match="qkv"):
        records.slot("qvk")


# ---------------------------------------------------------------------------
# third parties, through the ndcost_op_records hook
# ---------------------------------------------------------------------------
def plugin(name, contribution):
    module = types.ModuleType(name)

    @hookimpl
    def ndcost_op_records():
        return [contribution]
    module.ndcost_op_records = ndcost_op_records
    return module


FP8 = {
    "values": {"fp8_cast": {"default": 1, "doc": "1 where the feed-forward keeps an fp8 copy of its input"}},
    "switches": {"fp8_copies": {"doc": "the fp8 copies"}},
    "ops": {"fp8cast": {"switch": "fp8cast", "doc": "a cast to fp8 keeping the scaled copy"}},
    "slots": {"fp8_copy": {"part": "ffn", "holds": "fp8_cast and not moe", "terms": [
        {"name": "copy", "op": "fp8cast", "split": "sequence", "switches": ["fp8cast", "fp8_copies"],
         "bytes": "tokens * h"},
        {"name": "scales", "op": "fp8cast", "split": "tp", "bytes": "tokens * hff / 128 * bytes_stat"}]}},
}


def test_a_third_party_adds_an_op_and_a_slot():
    plugin_set = manager.load(extra_modules={"fp8": plugin("fp8_plugin", FP8)})
    records = R.load_op_records(plugin_set)
    assert "fp8cast" in records.ops and "fp8_copy" in records.slots
    assert any(source.startswith("<local>:fp8") for source in records.sources)
    values = R.values_for(gpt2(), "dense", seq=1024, micro_batch=2, tp=2, records=records)
    assert R.layer_slots(values)["fp8_copy"] == "ffn"
    tokens = 1024 * 2
    # the copy, 1 byte an element, whole under TP; the fp32 scales of 128 columns of 4096, split
    assert R.slot_bytes(values, "fp8_copy") == tokens * 1024 + tokens * 4096 // 128 * 4 // 2
    assert R.slot_bytes(values, "fp8_copy", {"fp8_copies": 0}) == tokens * 4096 // 128 * 4 // 2
    assert R.op_bytes(values, "fp8cast") == {"fp8_copy": tokens * 1024 + tokens * 4096 // 128 * 4 // 2}
    assert R.slot_bytes(values, "fp8_copy", overrides={"fp8_cast": 0}) == 0
    # the built-in slots are unchanged
    assert R.slot_bytes(values, "ffn") == R.slot_bytes(R.values_for(gpt2(), "dense", seq=1024, micro_batch=2,
                                                                     tp=2), "ffn")


@pytest.mark.parametrize("section, name, entry", [
    ("slots", "qkv", {"part": "attention", "terms": [{"op": "attMM", "split": "tp", "bytes": "tokens"}]}),
    ("ops", "softmax", {"switch": "softmax"}),
    ("values", "tokens", {"default": 1}),
])
def test_a_second_definition_leaves_the_plugin_out_naming_both(section, name, entry, monkeypatch):
    monkeypatch.delenv("NDCOST_STRICT_PLUGINS", raising=False)
    with pytest.warns(PluginLoadWarning) as record:
        plugin_set = manager.load(extra_modules={"dup": plugin("dup_plugin", {section: {name: entry}})})
    message = " ".join(str(w.message) for w in record)
    assert repr(name) in message and "ndcost:op_records" in message and "<local>:dup" in message
    assert R.load_op_records(plugin_set).sources == R.load_op_records(manager.load()).sources  # ndcost's alone
    monkeypatch.setenv("NDCOST_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="<local>:dup"):
        manager.load(extra_modules={"dup": plugin("dup_plugin", {section: {name: entry}})})


def test_an_override_replaces_and_two_overrides_are_an_error():
    mine = {"part": "attention", "override": True, "holds": "attention",
            "terms": [{"name": "input", "op": "attMM", "split": "sequence", "bytes": "tokens * h * bytes_act"}]}
    records = R.merge([("ndcost", R.builtin_records()), ("mine", {"slots": {"qkv": mine}})])
    values = R.values_for(gpt2(), "dense", seq=512, records=records)
    assert R.slot_bytes(values, "qkv") == 512 * 1024 * 2
    with pytest.raises(RegistrationError, match="overridden by both"):
        R.merge([("ndcost", R.builtin_records()), ("a", {"slots": {"qkv": mine}}), ("b", {"slots": {"qkv": mine}})])


def test_a_third_partys_bad_expression_names_record_and_expression():
    bad = {"slots": {"extra": {"part": "other", "terms": [{"op": "other", "split": "tp", "bytes": "tokens * hiden"}]}}}
    with pytest.raises(ExpressionError) as info:
        R.merge([("ndcost", R.builtin_records()), ("thirdparty", bad)])
    message = str(info.value)
    assert "slot 'extra'" in message and "thirdparty" in message and "'tokens * hiden'" in message
    assert "'hiden'" in message
    broken = {"slots": {"extra": {"part": "other", "terms": [{"op": "other", "split": "tp", "bytes": "tokens *"}]}}}
    with pytest.raises(ExpressionError, match="does not parse"):
        R.merge([("ndcost", R.builtin_records()), ("thirdparty", broken)])


@pytest.mark.parametrize("contribution, words", [
    ({"slots": {"x": {"part": "nowhere", "terms": [{"op": "other", "split": "tp", "bytes": "1"}]}}}, "part"),
    ({"slots": {"x": {"part": "other", "terms": [{"op": "other", "split": "pp", "bytes": "1"}]}}}, "split"),
    ({"slots": {"x": {"part": "other", "terms": [{"op": "nop", "split": "tp", "bytes": "1"}]}}}, "unknown op"),
    ({"slots": {"x": {"part": "other", "terms": [{"op": "other", "split": "tp", "bytes": "1",
                                                  "switches": ["nope"]}]}}}, "unknown switch"),
    ({"slots": {"x": {"part": "other", "terms": []}}}, "no terms"),
    ({"slots": {"x": {"part": "other", "terms": [{"op": "other", "split": "tp"}]}}}, "no bytes"),
    ({"slots": {"x": {"part": "other", "sizes": 1, "terms": [{"op": "other", "split": "tp", "bytes": "1"}]}}},
     "unknown field"),
    ({"values": {"p": {"expr": "q + 1"}, "q": {"expr": "p * 2"}}}, "depend on themselves"),
    ({"values": {"p": {"default": "two"}}}, "must be a number"),
    ({"modes": {"m": {"recompute": ["nope"]}}}, "unknown switch"),
    ({"modes": {"m": {False: ["softmax"]}}}, "quote it"),
    ({"tables": {}}, "unknown section"),
    ({"schema": 2}, "schema"),
])
def test_malformed_contributions_are_refused(contribution, words):
    with pytest.raises((InvalidValue, RegistrationError)) as info:
        R.merge([("ndcost", R.builtin_records()), ("thirdparty", contribution)])
    assert words in str(info.value)
    assert "thirdparty" in str(info.value) or "depend on themselves" in words


def test_a_plugin_set_without_the_builtin_records_is_stale():
    fake = types.SimpleNamespace(pm=types.SimpleNamespace(hook=types.SimpleNamespace(
        ndcost_op_records=types.SimpleNamespace(get_hookimpls=lambda: []))))
    with pytest.raises(StalePluginSet, match="pip install -e"):
        R.load_op_records(fake)


# ---------------------------------------------------------------------------
# the evaluation API
# ---------------------------------------------------------------------------
def test_overrides_switches_and_only():
    s, b, h, a = 1024, 1, 1024, 16
    values = R.values_for(gpt2(), "dense", seq=s, micro_batch=b, dropout=True)
    sbh, as2b = s * b * h, a * s * s * b
    # overrides stand for the given values: 4-byte activations double every 2-byte term
    assert R.slot_bytes(values, "qkv", overrides={"bytes_act": 4}) == 2 * R.slot_bytes(values, "qkv")
    # one op's switch: the softmax output (2as^2b) goes, the mask and probabilities stay
    assert R.slot_bytes(values, "score", {"softmax": 0}) == as2b + 2 * as2b
    assert R.slot_bytes(values, "score", {"softmax": 0.5}) == as2b + as2b + 2 * as2b
    # only: an op, a term, a part, whatever the switches say
    assert R.slot_bytes(values, "score", "core_attention", only="softmax") == 2 * as2b
    assert R.slot_bytes(values, "qkv", only="attBMM") == 6 * sbh
    assert R.slot_bytes(values, "qkv", only="input") == 2 * sbh
    assert R.slot_bytes(values, "ffn", only="ffn") == 19 * sbh
    assert R.slot_bytes(values, "ffn", only="attention") == 0
    # micro-batch factor: two micro-batches in flight hold twice
    assert R.slot_bytes(values, "ffn", overrides={"micro_factor": 2}) == 2 * 19 * sbh
    # a slot the layer does not hold keeps nothing
    assert R.slot_bytes(values, "routed") == 0 and "routed" not in R.layer_slots(values)
    with pytest.raises(UnknownKey, match="neither an op"):
        R.slot_bytes(values, "qkv", only="nothing")
    with pytest.raises(UnknownKey, match="unknown recompute switch"):
        R.slot_bytes(values, "qkv", {"sofmax": 0})
    with pytest.raises(InvalidValue, match="from 0"):
        R.slot_bytes(values, "qkv", {"softmax": 2})
    with pytest.raises(UnknownKey, match="recompute mode"):
        R.slot_bytes(values, "qkv", "partial")
    with pytest.raises(UnknownKey, match="did you mean bytes_act"):
        R.slot_bytes(values, "qkv", overrides={"bytes_acts": 4})


def test_plain_mappings_and_missing_values():
    given = {"s": 8, "h": 4, "a": 2, "kv_heads": 2, "dk": 2, "dv": 2, "attention": 1, "linear_attention": 0,
             "moe": 0, "hff": 16}
    # qkv: input 8*4*2 + queries/keys/values 8*(4+4+4)*2
    assert R.slot_bytes(given, "qkv") == 64 + 192
    with pytest.raises(ExpressionError) as info:
        R.slot_bytes({k: v for k, v in given.items() if k != "hff"}, "ffn")
    assert "'hff'" in str(info.value) and "slot 'ffn'" in str(info.value)


def test_layer_bytes_and_op_bytes_agree(records):
    values = R.values_for(deepseek(), "moe", seq=4096, micro_batch=1, tp=4, sp=True, attention="sdpa")
    by_part = R.layer_bytes(values)
    by_op = R.ops_bytes(values)
    assert sum(by_part.values()) == sum(by_op.values()) == R.total_bytes(values)
    assert set(by_part) == {"attention", "norm", "router", "shared", "routed"}
    for op in records.ops:
        assert sum(R.op_bytes(values, op).values()) == by_op.get(op, 0)


# ---------------------------------------------------------------------------
# context parallelism: kv_shards and the keys and values a rank keeps
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("algo, shards", [("ring", 1), ("colossal", 1), ("hybrid", 1), ("ulysses", 4)])
def test_kv_shards_by_cp_algorithm(algo, shards):
    values = R.values_for(llama(), "dense", seq=8192, cp=4, cp_algo=algo)
    assert R.kv_shards(values) == shards
    assert R.kv_shards(R.values_for(llama(), "dense", seq=8192, cp=1, cp_algo=algo)) == 1


def test_linear_attention_splits_keys_and_values_under_any_cp():
    for algo in ("ring", "ulysses", "colossal", "hybrid"):
        values = R.values_for(qwen3_next(), "linear_attention", seq=8192, cp=4, cp_algo=algo)
        assert R.kv_shards(values) == 4


@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("algo", ["ring", "colossal", "hybrid", "ulysses"])
def test_no_cp_algorithm_keeps_the_other_ranks_keys_and_values(algo, tp):
    """A rank keeps its own share's queries, keys and values under every CP algorithm: torch's ring attention
    saves the SDPA op's local q, k, v and gathers again in its backward
    (torch/distributed/tensor/experimental/_context_parallel/_attention.py), Transformer Engine's p2p and
    a2a+p2p save one block the size of the rank's own (AttnFuncWithCPAndKVP2P), Colossal-AI's RingAttention
    the local q, k, v (colossalai/shardformer/layer/attn.py), Ulysses its heads of the whole sequence."""
    s, cp = 8192, 4
    values = R.values_for(llama(), "dense", seq=s, cp=cp, tp=tp, cp_algo=algo, attention="sdpa")
    tokens = s // cp
    # the rank's own share: input 4096 wide (whole under TP without SP), Q 32x128, K and V 8x128 each, over TP;
    # the rotary cos and sin (128 wide each, bf16), which q * cos and rotate_half(q) * sin keep, not split
    own = tokens * 4096 * 2 + tokens * (32 + 8 + 8) * 128 * 2 // tp + tokens * 2 * 128 * 2
    assert R.slot_bytes(values, "qkv") == own


def test_scores_under_cp_are_a_share_of_the_whole():
    # ring: the rank's s/cp queries score all s keys; Ulysses: a/cp heads, all s queries and keys
    s, cp, a = 4096, 4, 16
    for algo in ("ring", "ulysses"):
        values = R.values_for(gpt2(), "dense", seq=s, cp=cp, cp_algo=algo, dropout=False)
        assert R.slot_bytes(values, "score") == a * s * s * 2 // cp


# ---------------------------------------------------------------------------
# a ModelSpec's values: feed-forwards, experts, MLA, linear attention, kernels
# ---------------------------------------------------------------------------
def test_gated_and_ungated_feed_forwards():
    s, tp = 2048, 2
    llama_values = R.values_for(llama(), "dense", seq=s, tp=tp)
    gpt2_values = R.values_for(gpt2(), "dense", seq=s, tp=tp, dropout=False)
    assert llama_values["act_widths"] == 3 and gpt2_values["act_widths"] == 1
    # SwiGLU: input; gate, its SiLU and up (3 x 14336), over TP; the down projection's input, over TP
    assert R.slot_bytes(llama_values, "ffn") == s * 4096 * 2 + s * 3 * 14336 * 2 // tp + s * 14336 * 2 // tp
    # GeLU: input; the GeLU's input (4h); the down projection's input (4h)
    assert R.slot_bytes(gpt2_values, "ffn") == s * 1024 * 2 + s * 4096 * 2 // tp + s * 4096 * 2 // tp
    # RMS norms of GQA Llama, two hidden-wide LlamaRMSNorms: each its fp32 input (4 bytes) and 16-bit
    # normalized tensor (2) an element and its fp32 rsqrt (4) a token; no QK-norm
    assert R.slot_bytes(llama_values, "norm") == 2 * s * (4096 * (4 + 2) + 4)


def test_gpt2_without_n_inner_reads_four_h():
    # GPT2Config: "n_inner (int, optional): Dimensionality of the inner feed-forward layers. None will set
    # it to 4 times n_embd"
    from ndcost.models import load_model
    spec = load_model({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12})
    assert R.values_for(spec, "dense", seq=16)["hff"] == 3072


def test_gpt_oss_experts_keep_their_clamped_swiglu_and_its_rotary_tables_half_a_head():
    """GPT-OSS-20B, derived from transformers' modeling_gpt_oss.py: GptOssExperts._apply_gate splits the
    interleaved gate-up output, clamps both halves, and keeps for its backward that output (2 I wide, saved by
    the clamps), the clamped gate and its sigmoid (their product's operands), up + 1 and the product (the next
    product's), then the down projection keeps its input (I): 6 I + I expert-wide elements a token copy, where
    an unfused gated SiLU keeps 3 I + I. GptOssRotaryEmbedding's cos and sin are its frequencies (emb = freqs),
    half a 64-wide head each."""
    from ndcost.models import load_model
    s, k, width, h = 4096, 4, 2880, 2880
    values = R.values_for(load_model("gpt-oss-20b"), "full_attention", seq=s)
    routed = s * k
    assert R.slot_bytes(values, "routed") == routed * h * 2 + routed * 6 * width * 2 + routed * width * 2
    rotary = [t[-1] for t in R.term_bytes(values) if t[2] == "rotary"]
    assert rotary == [s * 2 * 32 * 2]


def test_a_masked_sdpa_call_keeps_its_bias_and_the_repeated_keys_and_values():
    """Transformers hands SDPA a [1, 1, s, s] mask where a sliding window reaches the sequence
    (masking_utils._ignore_causal_mask_sdpa: kv_length >= local_attention_size) and on DeepSeek-V3.2's every layer
    (its indexer's selection folded into the causal mask); the kernel keeps it as a 16-bit bias, and with a mask
    on CUDA the keys and values are repeated to every query head first (sdpa_attention.use_gqa_in_sdpa)."""
    from ndcost.models import load_model

    def score(spec, kind, seq, attention):
        return sum(t[-1] for t in R.term_bytes(R.values_for(spec, kind, seq=seq, attention=attention))
                   if t[0] == "score")

    v32, s = load_model("deepseek-v3.2"), 4096
    assert score(v32, "dense", s, "sdpa") - score(v32, "dense", s, "flash") == s * s * 2
    assert score(v32, "dense", s, "eager") == score(load_model("deepseek-v3"), "dense", s, "eager")  # an addition
    oss = load_model("gpt-oss-20b")  # sliding_attention: a 128-token window, 64 query and 8 key-value heads of 64
    below, reached = R.values_for(oss, "sliding_attention", seq=127, attention="sdpa"), \
        R.values_for(oss, "sliding_attention", seq=128, attention="sdpa")
    assert (below["mask_bias"], below["kv_repeated"]) == (0, 0)
    assert (reached["mask_bias"], reached["kv_repeated"]) == (1, 1)
    copies = [t[-1] for t in R.term_bytes(reached) if t[2] == "kv_copies"]
    assert copies == [128 * (64 - 8) * (64 + 64) * 2]
    assert R.values_for(oss, "full_attention", seq=4096, attention="sdpa")["mask_bias"] == 0


def test_moe_slots_read_experts_top_k_and_dropless_factor():
    s, etp = 4096, 2
    values = R.values_for(deepseek(), "moe", seq=s, etp=etp)
    k, width, h = 8, 2048, 7168
    assert R.layer_slots(values) == {"qkv": "attention", "mla": "attention", "score": "attention",
                                     "proj": "attention", "norm": "norm", "router": "router",
                                     "shared": "shared", "routed": "routed"}
    routed = s * k
    # each token copy: input (h), gate/SiLU/up (3 x width / etp), down input (width / etp)
    assert R.slot_bytes(values, "routed") == routed * h * 2 + routed * 3 * width // etp * 2 + \
        routed * width // etp * 2
    assert R.slot_bytes(values, "routed", overrides={"dropless_tok_factor": 1.25}) == \
        1.25 * R.slot_bytes(values, "routed")
    # router: its input cast to fp32 and kept by its linear (transformers' DeepseekV3TopkRouter.forward:
    # F.linear(hidden_states.type(torch.float32), ...)), fp32 probabilities over 256 experts, the combine
    # (each copy's output and weight)
    assert R.slot_bytes(values, "router") == s * h * 4 + s * 256 * 4 + routed * (h * 2 + 4)
    # a router that does not cast (Qwen3-MoE's, Mixtral's) keeps the layer's 16-bit input
    assert R.slot_bytes(values, "router", overrides={"router_logit_bytes": 2}) == \
        s * h * 2 + s * 256 * 4 + routed * (h * 2 + 4)
    # one shared expert of 2048
    assert R.slot_bytes(values, "shared") == s * h * 2 + s * 3 * 2048 * 2 + s * 2048 * 2
    dense = R.values_for(deepseek(), "dense", seq=s)
    assert dense["hff"] == 18432 and set(R.layer_slots(dense)) >= {"ffn"} and "routed" not in R.layer_slots(dense)
    mtp = R.values_for(deepseek(), "mtp", seq=s)
    assert mtp["moe"] == 1 and mtp["mtp"] == 1 and R.layer_slots(mtp)["mtp"] == "mtp"
    # the MTP glue: the embedding's and the hidden state's norms (LlamaRMSNorm-like: 6 bytes an element, 4 a
    # token each), and their concatenation
    assert R.slot_bytes(mtp, "mtp") == s * 2 * (h * 6 + 4) + s * 2 * h * 2


def test_mla_widths():
    s = 1024
    values = R.values_for(deepseek(), "moe", seq=s, attention="sdpa")
    assert (values["kv_heads"], values["dk"], values["dv"]) == (128, 192, 128)
    # queries and keys 128 heads of 128 + 64, the input 7168; the values a slice of kv_b_proj's output,
    # whose whole storage (128 heads of 128 non-rotary key + 128 value) SDPA's save keeps; the rotary cos
    # and sin of the 64-wide rotary part (bf16)
    assert R.slot_bytes(values, "qkv") == (s * 7168 * 2 + s * 128 * (192 + 192 + (128 + 128)) * 2
                                           + s * 2 * 64 * 2)
    # SDPA's output (128 heads of 128), laid out as the concatenated query, and the output projection's
    # contiguous copy of it; the core's recompute drops the first
    assert R.slot_bytes(values, "proj") == 2 * s * 128 * 128 * 2
    assert R.slot_bytes(values, "proj", "core_attention") == s * 128 * 128 * 2
    # latents: the query latent's norm (fp32 input and bf16 normalized, 6 bytes an element, and an fp32
    # rsqrt a token) and up-projection input (1536 wide), the kv latent's (512)
    assert R.slot_bytes(values, "mla") == s * (1536 * 6 + 4 + 1536 * 2 + 512 * 6 + 4 + 512 * 2)
    no_q_latent = R.values_for(deepseek(), "moe", seq=s, overrides={"q_lora": 0})
    assert R.slot_bytes(no_q_latent, "mla") == s * (512 * 6 + 4 + 512 * 2)


def test_linear_attention_layers():
    s, tp = 2048, 2
    values = R.values_for(qwen3_next(), "linear_attention", seq=s, tp=tp)
    assert R.layer_slots(values) == {"linear_proj": "attention", "linrec": "attention", "norm": "norm",
                                     "router": "router", "shared": "shared", "routed": "routed"}
    conv = 2 * 16 * 128 + 32 * 128
    # input; conv input and its SiLU's input; the gates (Qwen3NextGatedDeltaNet.forward: b.sigmoid() keeps its
    # 16-bit output, softplus(a.float() + dt_bias) its fp32 input and the product its fp32 output); out_proj input
    assert R.slot_bytes(values, "linear_proj") == s * 2048 * 2 + (s * 2 * conv * 2 + s * 32 * (2 + 4 + 4) +
                                                                  s * 32 * 128 * 2) // tp
    # Transformers' torch reference rule, as a plain install runs it (the measured closed form: 8 key-wide and
    # 3 value-wide fp32 vectors, 5 fp32 chunk rows and 6 fp32 scalars a value head a token, a chunk's fp32 state
    # and decay, and a call's [64, 64] boolean mask)
    assert R.slot_bytes(values, "linrec") == (s * (8 * 128 + 3 * 128 + 5 * 64 + 6) +
                                              s // 64 * (1 + 128 * 128)) * 32 * 4 // tp + 64 * 64
    # a fused kernel standing for it: q, k repeated to 32 heads, v; fp32 gates; an fp32 128x128 state a value
    # head every 64 tokens
    fused = R.values_for(qwen3_next(), "linear_attention", seq=s, tp=tp, overrides={"linrec_eager": 0})
    assert R.slot_bytes(fused, "linrec") == (s * 32 * (2 * 128 + 128) * 2 + s * 2 * 32 * 4 +
                                             s // 64 * 32 * 128 * 128 * 4) // tp
    assert R.ops_bytes(values)["linrec"] == R.slot_bytes(values, "linrec")
    # two hidden norms (Qwen3NextRMSNorm scales in fp32 by 1 + weight: its fp32 input and fp32 scaled tensor,
    # 8 bytes an element, and an fp32 rsqrt a token each), and the gated norm (Qwen3NextRMSNormGated: an
    # element's fp32 input, 16-bit normalized value, fp32 gate, 16-bit weighted value and fp32 SiLU output, 16
    # bytes, and an fp32 rsqrt a head)
    assert R.slot_bytes(values, "norm") == 2 * s * (2048 * 8 + 4) + s * 32 * (128 * 16 + 4) // tp
    full = R.values_for(qwen3_next(), "full_attention", seq=s, tp=tp, attention="sdpa")
    assert full["qk_norm"] == 1 and full["output_gate"] == 1
    # output gate: its sigmoid and the attention output it scales (16 heads of 256), over TP; the rotary turns a
    # quarter of a head (Qwen3NextConfig's partial_rotary_factor), so the query is concatenated, contiguous
    # [b, h, s, d], and cuDNN's output laid out so: the kernel's saved output and the output projection's
    # contiguous copy are two storages
    assert full["rotary_width"] == 64 and full["query_concatenated"] == 1
    assert R.slot_bytes(full, "proj") == (2 * s * 16 * 256 * 2 + 2 * s * 16 * 256 * 2) // tp
    # QK-norm per head: the queries' and keys' (16 + 2 heads of 256) 8 bytes an element and an rsqrt a head,
    # over TP
    assert R.slot_bytes(full, "norm") == 2 * s * (2048 * 8 + 4) + (s * 18 * 256 * 8 + s * 18 * 4) // tp


@pytest.mark.parametrize("seq,key_heads,value_heads,key_width,value_width,chunk",
                         [(256, 2, 4, 32, 64, 64), (512, 4, 4, 16, 32, 32), (384, 1, 2, 64, 16, 128)])
def test_the_reference_rule_keeps_what_torch_keeps(seq, key_heads, value_heads, key_width, value_width, chunk):
    """The reference rule's terms beside what Transformers' torch_chunk_gated_delta_rule keeps run alone on torch
    (saved-tensor hooks on fake tensors): its fp32 intermediates and the chunk's [c, c] boolean mask."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from _helpers import eager_delta_rule_kept_bytes
    values = R.values_for(qwen3_next(), "linear_attention", seq=seq, overrides={
        "lin_kh": key_heads, "lin_vh": value_heads, "lin_dk": key_width, "lin_dv": value_width,
        "linrec_chunk": chunk})
    terms = sum(t[-1] for t in R.term_bytes(values) if t[2] in ("reference_rule", "reference_mask"))
    assert terms == eager_delta_rule_kept_bytes(seq, key_heads, value_heads, key_width, value_width, chunk=chunk)


def test_fused_attention_keeps_statistics_not_scores():
    s, a = 4096, 16
    values = R.values_for(gpt2(), "dense", seq=s, attention="sdpa", dropout=True)
    # the kernel's fp32 log-sum-exp a head a token; no mask: a fused dropout keeps its philox seed and
    # offset, two int64 a call
    assert R.slot_bytes(values, "score") == s * a * 4 + 16
    assert R.slot_bytes(values, "score", "core_attention") == 0


def test_strategy_fills_the_evaluation():
    strategy = Strategy(tp=4, sp=True, cp=2, cp_algo="ulysses", micro_batch=2, seq=4096, etp=1,
                        param_dtype="fp32")
    values = R.values_for(llama(), "dense", strategy=strategy)
    assert (values["tp"], values["sp"], values["cp"], values["ulysses"], values["b"], values["s"]) == \
        (4, 1, 2, 1, 2, 4096)
    assert values["bytes_act"] == 4 and values["tokens"] == 4096 // 2 * 2
    assert R.values_for(llama(), "dense", strategy=strategy, tp=2)["tp"] == 2


def test_bad_models_and_evaluations():
    with pytest.raises(UnknownKey, match="its kinds: dense, moe, mtp"):
        R.values_for(deepseek(), "moee", seq=16)
    no_top_k = ModelSpec(name="broken-moe", model_type="mixtral", family="mixtral", hidden_size=64,
                         vocab_size=100, num_attention_heads=4, num_experts=8, intermediate_size=128,
                         layers=(LayerGroup(kind="moe", count=2),),
                         kind_specs={"moe": LayerKind(attention="gqa", mlp="moe")})
    with pytest.raises(InvalidValue) as info:
        R.values_for(no_top_k, "moe", seq=16)
    assert "num_experts_per_tok" in str(info.value) and "mixtral" in str(info.value)
    no_width = ModelSpec(name="broken", model_type="llama", family="llama", hidden_size=64, vocab_size=100,
                         num_attention_heads=4, layers=(LayerGroup(kind="dense", count=2),),
                         kind_specs={"dense": GQA_DENSE})
    with pytest.raises(InvalidValue, match="intermediate_size"):
        R.values_for(no_width, "dense", seq=16)
    with pytest.raises(InvalidValue, match="sequence length"):
        R.values_for(llama(), "dense")
    with pytest.raises(InvalidValue, match="cp_algo"):
        R.values_for(llama(), "dense", seq=16, cp_algo="spiral")
    with pytest.raises(InvalidValue, match="attention"):
        R.values_for(llama(), "dense", seq=16, attention="magic")


# ---------------------------------------------------------------------------
# the KindRecord
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [gpt2(), llama(), deepseek(), qwen3_next()], ids=lambda s: s.name)
def test_formula_records_for_every_kind(spec):
    seq, tp = 4096, 4
    for kind, record in R.formula_records(spec, seq).items():
        assert isinstance(record, KindRecord) and record.source == "op_records" and record.kind == kind
        assert set(record.ops) | set(record.ops_tp) <= set(OPS)
        assert sum(record.ops.values()) == record.saved_per_token
        assert sum(record.ops_tp.values()) == record.saved_tp_per_token
        assert record.selective_per_token + record.selective_tp_per_token <= \
            record.saved_per_token + record.saved_tp_per_token
        assert record.working_per_token is None  # the backward's peak is not priced here
        # a rank at TP t keeps saved + saved_tp / t, what the records give at TP t, and the rotary cos and sin
        # the model hands every layer (the records' layer alone keeps them; the KindRecord states them apart)
        # (bf16, 2 tables: the head width, MLA's rotary key width, a partial rotary's share of the head (Qwen3-Next's
        # quarter, its config class's default); a linear attention rotates nothing)
        layer = spec.kind(kind)
        share = 0.25 if spec.model_type == "qwen3_next" else 1.0
        rotary = 0 if not layer.rotary or layer.linear else 2 * 2 * (
            spec.qk_rope_head_dim if layer.latent else int(spec.resolved_head_dim * share))
        assert dict(record.shared_saved_per_token) == ({"position_embeddings": rotary} if rotary else {})
        values = R.values_for(spec, kind, seq=seq, tp=tp)
        assert R.total_bytes(values) == pytest.approx(
            seq * (record.saved_per_token + record.saved_tp_per_token / tp + rotary), rel=1e-12)
        values_sp = R.values_for(spec, kind, seq=seq, tp=tp, sp=True)
        assert R.total_bytes(values_sp) == pytest.approx(
            seq * (record.saved_per_token + record.saved_tp_per_token + rotary) / tp, rel=1e-12)
        assert KindRecord.from_dict(record.to_dict()) == record


# ---------------------------------------------------------------------------
# specs from the families' loader (Transformers configs built in code)
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_family_specs_give_records_for_every_kind():
    models = pytest.importorskip("ndcost.models")
    transformers = pytest.importorskip("transformers")
    configs = {
        "gpt2": transformers.GPT2Config(n_embd=256, n_head=4, n_layer=2),
        "llama": transformers.LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                          intermediate_size=512, num_hidden_layers=2),
        "qwen3": transformers.Qwen3Config(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                          head_dim=64, intermediate_size=512, num_hidden_layers=2),
        "deepseek_v3": transformers.DeepseekV3Config(),
        "qwen3_next": transformers.Qwen3NextConfig(),
    }
    expect = {  # kind: (moe, mla, linear attention, activation widths, QK-norm, output gate, mtp)
        ("gpt2", "dense"): (0, 0, 0, 1, 0, 0, 0),
        ("llama", "dense"): (0, 0, 0, 3, 0, 0, 0),
        ("qwen3", "dense"): (0, 0, 0, 3, 1, 0, 0),
        ("deepseek_v3", "dense"): (0, 1, 0, 3, 0, 0, 0),
        ("deepseek_v3", "moe"): (1, 1, 0, 3, 0, 0, 0),
        ("deepseek_v3", "mtp"): (1, 1, 0, 3, 0, 0, 1),
        ("qwen3_next", "linear_attention"): (1, 0, 1, 3, 1, 1, 0),
        ("qwen3_next", "full_attention"): (1, 0, 0, 3, 1, 1, 0),
    }
    for name, config in configs.items():
        spec = models.load_model(config)
        for kind in spec.kinds:
            values = R.values_for(spec, kind, seq=1024, attention="sdpa")
            flags = tuple(values[n] for n in ("moe", "mla", "linear_attention", "act_widths", "qk_norm",
                                              "output_gate", "mtp"))
            assert flags == expect[(name, kind)], (name, kind)
            record = R.formula_record(spec, kind, 1024, attention="sdpa")
            assert record.saved_per_token > 0 and record.saved_tp_per_token > 0


# ---------------------------------------------------------------------------
# the runtime's attention kernel
# ---------------------------------------------------------------------------
def test_runtime_attention_follows_the_profile_and_the_familys_sdpa_support(registry):
    from ndcost.models import load_model
    from ndcost.plugins.runtimes import profile_from_mapping
    cuda, eager, npu = (registry.get(f"runtime/{n}") for n in ("hf-cuda", "hf-cuda-eager", "hf-npu"))
    llama_spec, oss = load_model("llama-3.1-8b"), load_model("gpt-oss-20b")
    assert R.runtime_attention(llama_spec, cuda) == "sdpa"
    assert R.runtime_attention(oss, cuda) == "eager"          # GPT-OSS refuses SDPA: the fallback
    assert R.runtime_attention(llama_spec, eager) == "eager"
    assert R.runtime_attention(llama_spec, npu) == "npu_fusion_attention"
    assert R.runtime_attention(llama_spec, None) == "eager"   # no profile: the published formulas' assumption
    # a fused NPU kernel keeps a head's statistics, never the scores
    values = R.values_for(llama(), "dense", seq=1024, attention="npu_fusion_attention")
    assert R.slot_bytes(values, "score") == 1024 * 32 * 4 + 16  # and its dropout's seed and offset
    odd = profile_from_mapping({"name": "odd", "attention": "paged_magic"})
    with pytest.raises(InvalidValue, match="runtime 'odd' runs attention 'paged_magic'"):
        R.runtime_attention(llama_spec, odd)


# ---------------------------------------------------------------------------
# attention kernels: registered by the plugins that know them, not a table in the records
# ---------------------------------------------------------------------------
def test_attention_kernels_are_registered_by_their_contracts(registry):
    from ndcost.plugins.contracts import AttentionKernel

    materializes = {name: registry.get(f"attention_kernel/{name}").materializes_scores
                    for name in registry.names("attention_kernel")}
    # the kernels and flags the op records' closed table held before, and the family attention contracts' own
    assert materializes == {"eager": True, "sdpa": False, "flash": False, "flash_attention_2": False,
                            "flash_attention_3": False, "flex_attention": False, "npu_fusion_attention": False,
                            "deepseek-v4-sparse-attention": False, "gpt-oss-flash-sinks": False}
    assert registry.entry("attention_kernel/sdpa").source.module == "ndcost.plugins.contracts.cuda_sdpa"
    assert registry.entry("attention_kernel/gpt-oss-flash-sinks").source.module == "ndcost.plugins.contracts.gpt_oss"
    assert registry.entry("attention_kernel/npu_fusion_attention").source.module == "ndcost.plugins.contracts.npu"
    assert all(isinstance(v, AttentionKernel) for _, v in registry.items("attention_kernel"))


def test_registering_the_attention_kernels_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys\n"
            "from ndcost.plugins.contracts import cuda_sdpa, npu\n"
            "keys = []\n"
            "for m in (cuda_sdpa, npu):\n"
            "    m.ndcost_register(lambda key, value, override=False: keys.append(key))\n"
            "assert 'attention_kernel/sdpa' in keys and 'attention_kernel/npu_fusion_attention' in keys, keys\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_an_unknown_attention_kernel_names_the_registered_ones_and_how_to_add_one():
    with pytest.raises(InvalidValue) as err:
        R.model_values(llama(), "dense", attention="paged_magic")
    message = str(err.value)
    assert "attention='paged_magic'" in message and "eager" in message and "npu_fusion_attention" in message
    assert "'attention_kernel/<name>'" in message


def test_a_plugin_adds_an_attention_kernel_without_editing_the_records(monkeypatch):
    from ndcost.plugins.contracts import AttentionKernel

    module = types.ModuleType("paged_attention_plugin")
    module.ndcost_register = hookimpl(lambda register: register(
        "attention_kernel/paged", AttentionKernel(name="paged", materializes_scores=False,
                                                  description="a paged fused kernel")))
    monkeypatch.setattr(manager, "_current", manager.load(extra_modules={"paged": module}))
    spec = llama()
    assert R.model_values(spec, "dense", attention="paged")["scores"] == 0
    assert R.model_values(spec, "dense", attention="eager")["scores"] == 1
    paged = R.values_for(spec, "dense", seq=1024, attention="paged")
    sdpa = R.values_for(spec, "dense", seq=1024, attention="sdpa")
    assert R.slot_bytes(paged, "score") == R.slot_bytes(sdpa, "score")  # priced as the fused kernels are
