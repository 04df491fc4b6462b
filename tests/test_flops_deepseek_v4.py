"""DeepSeek-V4's analytic work: its three attention types, its MoE and its hyper-connections, counted by hand.

The small DeepSeek-V4 of tests/test_contracts_deepseek_v4.py (four layers: heavily compressed, two
compressed sparse, sliding; hash routing in the first three) at ``S = 256`` tokens. The expected
counts are derived below from the config and Transformers 5.24's ``modeling_deepseek_v4.py``; the slow
tests check them against the census (``FlopCounterMode`` over Transformers' own modules).
"""
import pytest

from ndcost import models
from ndcost.errors import InvalidValue
from ndcost.plugins.estimators.flops import analytic_flops, kind_work, model_work
from ndcost.plugins.formulas import deepseek_v4 as formulas

S = 256
HIDDEN, HEADS, D, Q_LORA, GROUPS, O_LORA = 256, 4, 64, 128, 2, 64
EXPERTS, TOP_K, WIDTH, WINDOW, TOPK = 8, 2, 128, 16, 8
INDEX_HEADS, INDEX_D, HC = 4, 32, 4
TYPES = ["heavily_compressed_attention", "compressed_sparse_attention", "compressed_sparse_attention",
         "sliding_attention"]
CONFIG = dict(model_type="deepseek_v4", hidden_size=HIDDEN, moe_intermediate_size=WIDTH, num_hidden_layers=4,
              num_attention_heads=HEADS, head_dim=D, q_lora_rank=Q_LORA, n_routed_experts=EXPERTS,
              num_experts_per_tok=TOP_K, index_n_heads=INDEX_HEADS, index_head_dim=INDEX_D, index_topk=TOPK,
              o_groups=GROUPS, o_lora_rank=O_LORA, vocab_size=1000, sliding_window=WINDOW, layer_types=TYPES)

# Multiply-accumulates a token (FLOPs = 2 x tokens x these), DeepseekV4Attention.forward:
# q_a_proj h -> q_lora, q_b_proj q_lora -> heads d, kv_proj h -> d (one shared K=V head), o_a_proj o_groups
# blocks of heads d / o_groups -> o_lora, o_b_proj o_groups o_lora -> h.
ATTENTION_MACS = (HIDDEN * Q_LORA + Q_LORA * HEADS * D + HIDDEN * D
                  + GROUPS * (HEADS * D // GROUPS) * O_LORA + GROUPS * O_LORA * HIDDEN)           # 131,072
# DeepseekV4HCACompressor: kv_proj and gate_proj h -> d.
HCA_MACS = 2 * HIDDEN * D                                                                             # 32,768
# DeepseekV4CSACompressor: kv_proj and gate_proj h -> 2 d (overlapping windows); its DeepseekV4Indexer:
# kv_proj and gate_proj h -> 2 index_d, q_b_proj q_lora -> index_heads index_d, weights_proj h -> index_heads.
CSA_MACS = (2 * HIDDEN * 2 * D + 2 * HIDDEN * 2 * INDEX_D + Q_LORA * INDEX_HEADS * INDEX_D
            + HIDDEN * INDEX_HEADS)                                                                   # 115,712
# Two DeepseekV4HyperConnection: fn projects the hc streams flattened (hc h) to (2 + hc) hc weights; the layer
# mixes the streams, comb^T (hc x hc) @ streams (hc x h): hc hc h.
HC_MACS = 2 * (HC * HIDDEN * (2 + HC) * HC + HC * HC * HIDDEN)                                        # 57,344
# DeepseekV4SparseMoeBlock: top-k experts' gate, up and down (h x width each), the router's logits h -> experts
# (the hash router computes them too, to weight its table's experts), the shared expert's three.
ROUTED_MACS, ROUTER_MACS, SHARED_MACS = TOP_K * 3 * HIDDEN * WIDTH, HIDDEN * EXPERTS, 3 * HIDDEN * WIDTH


def _flops(macs):
    return float(2 * S * macs)


@pytest.fixture(scope="module")
def spec():
    return models.load_model(dict(CONFIG))


def _pairs_by_query(window, compressed, selected):
    """The sparse kernel's pairs, query by query: query i gathers its window and *selected* compressed entries,
    at most the i + 1 + compressed entries it could see (plugins/contracts/deepseek_v4.py)."""
    return sum(min(min(window, S) + selected, i + 1 + compressed) for i in range(S))


def test_matmul_flops_of_each_kind_are_the_modules(spec):
    common = {"other": _flops(HC_MACS), "routed": _flops(ROUTED_MACS), "router": _flops(ROUTER_MACS),
              "shared": _flops(SHARED_MACS)}
    attention = {"sliding_moe": ATTENTION_MACS, "hca_hash_moe": ATTENTION_MACS + HCA_MACS,
                 "csa_hash_moe": ATTENTION_MACS + CSA_MACS}
    for kind, macs in attention.items():
        flops = analytic_flops(spec, kind, S)
        assert {part: v for part, v in flops.items() if part != "scores"} == {"attention": _flops(macs), **common}


def test_scores_are_the_sparse_kernels_pairs_and_the_indexers(spec):
    # a pair: Q K^T and P V over the one shared K = V head, 2 (d + d) FLOPs a query head
    per_pair = 2 * HEADS * 2 * D
    # sliding: the window alone, 16 x 17 / 2 + 240 x 16 = 3,976 pairs
    assert _pairs_by_query(WINDOW, 0, 0) == 3_976
    assert analytic_flops(spec, "sliding_moe", S)["scores"] == per_pair * 3_976
    # heavily compressed: every 128 tokens one entry (2), all of them gathered: 3 + ... + 17 + 241 x 18
    assert _pairs_by_query(WINDOW, 2, 2) == 4_488
    assert analytic_flops(spec, "hca_hash_moe", S)["scores"] == per_pair * 4_488
    # compressed sparse: every 4 tokens one entry (64), the indexer's top 8 gathered: 256 x 24; the indexer
    # scores every query against every entry, 2 x 256 x 4 heads x 32 x 64
    assert _pairs_by_query(WINDOW, 64, TOPK) == 256 * 24
    indexer = 2 * S * INDEX_HEADS * INDEX_D * 64
    assert analytic_flops(spec, "csa_hash_moe", S)["scores"] == per_pair * 256 * 24 + indexer
    # at every pair (as Narayanan et al. count): each query against its sequence and all compressed entries
    assert analytic_flops(spec, "csa_hash_moe", S, all_pairs=True)["scores"] == per_pair * S * (S + 64) + indexer


@pytest.mark.parametrize("window,compressed,selected", [
    (16, 0, 0), (16, 2, 2), (16, 64, 8), (300, 64, 8), (0, 64, 64), (16, 64, 64), (4, 10, 3), (250, 5, 5)])
def test_sparse_pairs_closed_form_is_the_sum(window, compressed, selected):
    assert formulas.sparse_pairs(seq=S, window=window, compressed=compressed, selected=selected) == \
        _pairs_by_query(window or S, compressed, selected)


def test_kind_work_states_the_kernel_and_the_widths(spec):
    parameters = models.parameters(spec).by_kind
    for kind, gathered in (("sliding_moe", WINDOW), ("hca_hash_moe", WINDOW + 2), ("csa_hash_moe", WINDOW + TOPK)):
        work = kind_work(spec, kind, S, parameters=parameters[kind])
        assert work.source.startswith("analytic flops")
        assert work.window == gathered  # the entries a query gathers
        # the pairs the time model multiplies back give the scores' FLOPs at this sequence length
        assert work.forward_flops(S) == pytest.approx(sum(analytic_flops(spec, kind, S).values()), rel=1e-12)
        assert (work.attention_heads, work.attention_head_dim, work.attention_value_head_dim) == (HEADS, D, D)
        assert work.query_elements_per_token == HEADS * D
        assert work.experts_per_token == TOP_K
        # the GEMM shapes carry each class's FLOPs
        for op_class, field in (("attention", "attention_mm_flops_per_token"), ("other", "other_mm_flops_per_token"),
                                ("routed", "routed_mm_flops_per_token")):
            shaped = sum(g.flops_per_token for g in work.gemms if g.op_class == op_class)
            assert shaped == pytest.approx(getattr(work, field), rel=1e-12), (kind, op_class)
        assert work.has_attention and work.launches_per_layer > 0 and work.elementwise_elements_per_token > 0
    # eager attention concatenates every compressed entry to the keys (DeepseekV4Attention.forward): a query scores
    # S + S / rate of them, the pairs of the all-pairs count above (S (S + 64) on CSA, S (S + 2) on HCA)
    for kind, compressed in (("sliding_moe", 0), ("hca_hash_moe", 2), ("csa_hash_moe", 64)):
        extra = kind_work(spec, kind, S).extra_keys_per_token
        assert S * S * (1 + extra) == S * (S + compressed), kind
    # the shared K=V a token, and its share of the compressed entries (the indexer's keys too on CSA)
    assert kind_work(spec, "sliding_moe", S).kv_elements_per_token == D
    assert kind_work(spec, "hca_hash_moe", S).kv_elements_per_token == D + D // 128
    assert kind_work(spec, "csa_hash_moe", S).kv_elements_per_token == D + (D + INDEX_D) // 4


def test_bad_formula_input_is_named():
    with pytest.raises(InvalidValue, match="seq"):
        formulas.sparse_pairs(seq=-1, window=16, compressed=0, selected=0)
    with pytest.raises(InvalidValue, match="o_groups"):
        formulas.attention_matmuls(hidden=256, heads=4, head_dim=64, q_lora_rank=128, o_groups=3, o_lora_rank=64,
                                   rate=0, overlap=False, index_heads=4, index_head_dim=32)


def test_the_work_formulas_are_registered_slots(registry):
    for name in ("compressed_entries", "sparse_pairs", "indexer_scores"):
        assert f"formula/deepseek_v4.flops.{name}" in registry


def test_census_off_refuses_deepseek_v4_flash_memory_and_still_times_its_layers():
    """The op records price a plain layer of V4's widths (``ndcost verify``: a sixth of what the census measures a
    token), so without a census its memory is refused, saying why and how to price it; its layers' work is the
    analytic FLOPs estimator's, which the time model prices."""
    import ndcost
    from ndcost.compose import time as time_model
    from ndcost.errors import InvalidStrategy
    from ndcost.values import Strategy

    model = ndcost.resolve("deepseek-v4-flash", census="off")
    with pytest.raises(InvalidStrategy) as caught:
        model.evaluate("tp=8,ep=8,seq=4096,recompute=full")
    message = str(caught.value)
    assert "census='off' skips stack_census" in message and "do not price deepseek_v4's layers" in message
    assert "census='auto'" in message
    work = model_work(model.spec, 4096)  # no census records: the analytic estimator's
    assert "analytic flops" in work.source
    stated, _ = time_model.efficiencies(model.hardware)
    seconds = time_model.layer_seconds(work, time_model.strategy_columns([Strategy(seq=4096)]), model.hardware,
                                       stated)
    assert (seconds["forward"] > 0).all() and (seconds["backward"] > seconds["forward"]).all()


# ---------------------------------------------------------------------------
# against the census: FlopCounterMode over Transformers' modules
# ---------------------------------------------------------------------------
def _census_mapped(flops, attn_hc):
    """The census's parts as the analytic ones count them: it attributes each hyper-connection by its module's
    name (``attn_hc`` to the attention, ``ffn_hc`` to ``ffn``), the formulas count both (and the layer's
    mixing, ``other`` in both) as part ``other``, as the parameters do."""
    out = dict(flops)
    out["attention"] -= attn_hc
    out["other"] = out.get("other", 0) + out.pop("ffn", 0) + attn_hc
    return out


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["hf-cuda-fused", "hf-cuda"])
def test_forward_flops_equal_the_census(spec, runtime):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ndcost.plugins.census import kind_records
    records = kind_records(spec, S, runtime, use_cache=False, progress=None)
    attn_hc = _flops(HC * HIDDEN * (2 + HC) * HC)
    for kind, record in records.items():
        census = _census_mapped(record.flops_by_part, attn_hc)
        analytic = analytic_flops(spec, kind, S)
        assert {p: v for p, v in census.items() if p != "scores"} == \
            {p: v for p, v in analytic.items() if p != "scores"}, kind
        if runtime == "hf-cuda-fused":  # the sparse kernel's and the indexer's scores, as the contracts count them
            assert census["scores"] == analytic["scores"], kind
        # eager runs every pair: the census counts there what the analytic counts at all pairs
        assert record.flops_all_pairs_by_part["scores"] == analytic_flops(spec, kind, S, all_pairs=True)["scores"]
        # launches: the analytic count of the eager modules within a tenth of those the census counted
        counted = sum(record.traffic["launches"].values())
        assert kind_work(spec, kind, S).launches_per_layer == pytest.approx(counted, rel=0.1), kind


@pytest.mark.slow
def test_deepseek_v4_flash_matmuls_equal_the_census_at_4096():
    """deepseek-v4-flash under hf-cuda at 4,096 tokens (the census is cached on disk after its first run, ~3 min)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ndcost.plugins.census import kind_records
    flash = models.load_model("deepseek-v4-flash")
    built = [g.kind for g in flash.layers if not g.mtp]
    records = kind_records(flash, 4096, "hf-cuda", progress=None)
    hc, h = flash.extra["hc_mult"], flash.hidden_size
    for kind in built:
        census = _census_mapped(records[kind].flops_by_part, float(2 * 4096 * hc * h * (2 + hc) * hc))
        analytic = analytic_flops(flash, kind, 4096)
        assert {p: v for p, v in census.items() if p != "scores"} == \
            {p: v for p, v in analytic.items() if p != "scores"}, kind
        assert records[kind].flops_all_pairs_by_part["scores"] == \
            analytic_flops(flash, kind, 4096, all_pairs=True)["scores"], kind


def test_a_runtime_installing_the_sparse_kernel_is_priced_as_it_not_as_eager(monkeypatch):
    """hf-cuda-fused installs DeepSeek-V4's sparse attention contract in place of Transformers' eager function
    (``Contract.attention``): the time model prices the kernel's own FLOPs (the window and the selected entries)
    under its name, where hf-cuda's eager attention runs every pair of the sequence and the compressed entries; the
    formulas price the same kernel (``op_records.runtime_attention``: a row's statistics kept, not its scores)."""
    import ndcost
    from ndcost.models import family_for
    # the formulas' memory stands in for the census's (refused for V4 without one): the test is the runtimes'
    monkeypatch.setattr(type(family_for("deepseek_v4")), "formulas_unpriced", "")
    strategy = "dp=8,ep=8,seq=16384,recompute=full"
    eager = ndcost.resolve("deepseek-v4-flash", runtime="hf-cuda", census="off")
    fused = ndcost.resolve("deepseek-v4-flash", runtime="hf-cuda-fused", census="off")
    e, f = eager.evaluate(strategy), fused.evaluate(strategy)
    assert eager.resolved.model_work[16384].attention_kernel == "eager"
    assert fused.resolved.model_work[16384].attention_kernel == "deepseek-v4-sparse-attention"
    assert "csa_moe: deepseek-v4-sparse-attention, efficiency.attention" in f.provenance["time"]["kernels"]
    assert f.peak_bytes < e.peak_bytes  # eager attention's scores are not kept by the sparse kernel
    assert f.time.compute_seconds < e.time.compute_seconds / 2  # 16,384 queries gather 640 entries, not 20,480
