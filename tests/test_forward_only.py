"""Work autograd records no backward for: told apart by the census, stated by the formulas, left out of the backward.

Transformers runs DeepSeek-V3.2's lightning indexer under ``torch.no_grad`` (DeepseekV32Indexer.forward), a
DeepSeek-V3 router's expert selection likewise (``get_topk_indices``), and every MoE block's dispatch moves integer
indices; none of it has a backward. The census runs each layer under autograd and keeps apart the ops whose
outputs require no grad; the time model prices their forward and no backward. Expected figures are derived by hand
from the modules' shapes, or measured by the census on Transformers' own layers against the formulas written
without torch.
"""
from __future__ import annotations

import attrs
import pytest

from ndcost.compose import time as ct
from ndcost.plugins.estimators import flops as analytic
from ndcost.values import Strategy

SEQ = 64
# a small DeepSeek-V3.2: 4 indexer heads 32 wide, rope 8, a query latent of 32, top-8 selection (below SEQ)
DSV32 = {"model_type": "deepseek_v32", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
         "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 16,
         "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8,
         "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "vocab_size": 100,
         "num_hidden_layers": 2, "index_n_heads": 4, "index_head_dim": 32, "index_topk": 8}
LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
             "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 100}
GLM = {"model_type": "glm4_moe", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
       "num_hidden_layers": 2, "first_k_dense_replace": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
       "head_dim": 16, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
       "vocab_size": 100}


def _census_records(config):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import ndcost
    model = ndcost.resolve(config, census="on")
    model.record_tables(SEQ)
    return model, model.resolved.kind_records[SEQ][0]


@pytest.mark.slow
def test_the_census_keeps_apart_the_indexers_forward_flops():
    """The indexer's projections (wq_b from the 32-wide query latent to 4 heads of 32, wk to one 32-wide key,
    weights_proj to a weight a head) and its scores over every pair (q k^T, then the heads' weights); a Llama
    layer has none."""
    _, records = _census_records(DSV32)
    t, h, heads, dim, latent = SEQ, 64, 4, 32, 32
    expected = {"attention": 2 * t * (latent * heads * dim + h * dim + h * heads),
                "scores": 2 * heads * dim * t * t + 2 * heads * t * t}
    for kind in ("dense", "moe"):
        assert dict(records[kind].forward_only_flops_by_part) == expected
    _, plain = _census_records(LLAMA)
    assert dict(plain["dense"].forward_only_flops_by_part) == {}
    assert not any(plain["dense"].traffic["forward_only_moved_bytes"].values())


@pytest.mark.slow
@pytest.mark.parametrize("config,kind", [(DSV32, "dense"), (DSV32, "moe"), (QWEN3_MOE, "moe"), (GLM, "moe")])
def test_the_formulas_state_the_forward_only_work_the_census_measures(config, kind):
    """Without torch the formulas state the same forward-only work as Transformers' layers run: the indexer's
    FLOPs and bytes, the grouped_mm dispatch's indices, a group-limited router's selection with two groups and
    with one (whose expansion is a view)."""
    import ndcost
    measured = _census_records(config)[0].model_work(SEQ).work[kind]
    stated = ndcost.resolve(config, census="off").model_work(SEQ).work[kind]
    for field in attrs.fields(type(stated)):
        if field.name.startswith("forward_only_"):
            assert getattr(stated, field.name) == pytest.approx(getattr(measured, field.name), rel=1e-12), field.name
    assert measured.forward_only_elementwise_elements_per_token > 0


def _layer(work, **forward_only):
    one = attrs.evolve(work.work["dense"], **forward_only)
    return attrs.evolve(work, work={"dense": one})


def test_the_backward_repeats_none_of_the_forward_only_work(registry):
    """A layer whose other matmuls, half its scores and its elementwise bytes are forward-only: its forward is
    unchanged; its backward's matmuls are those of a layer without the other matmuls, its scores' backward half,
    and its elementwise backward none."""
    from test_time_model import llama_spec
    h200 = registry.get("hardware/h200")
    base = analytic.model_work(llama_spec(2), 4096)
    plain = base.work["dense"]
    marked = _layer(base, forward_only_other_mm_flops_per_token=plain.other_mm_flops_per_token,
                    forward_only_score_flops_per_pair=plain.score_flops_per_pair / 2,
                    forward_only_elementwise_elements_per_token=plain.elementwise_elements_per_token,
                    forward_only_replicated_elements_per_token=plain.replicated_elements_per_token)
    no_other = _layer(base, other_mm_flops_per_token=0.0)
    cols = ct.strategy_columns([Strategy.parse("seq=32768")])  # long enough for the rooflines to set each pass
    eff, _ = ct.efficiencies(h200)
    figures = {name: ct.layer_seconds(w, cols, h200, eff) for name, w in
               (("plain", base), ("marked", marked), ("no_other", no_other))}
    for key in ("matmul_forward", "scores_forward", "forward"):
        assert figures["marked"][key][0, 0] == figures["plain"][key][0, 0]
    assert figures["marked"]["matmul_backward"][0, 0] == pytest.approx(figures["no_other"]["matmul_backward"][0, 0])
    assert figures["marked"]["scores_backward"][0, 0] == pytest.approx(figures["plain"]["scores_backward"][0, 0] / 2)
    bytes_backward = (figures["plain"]["backward"][0, 0] - figures["plain"]["matmul_backward"][0, 0]
                      - figures["plain"]["scores_backward"][0, 0])
    assert bytes_backward > 0
    assert figures["marked"]["backward"][0, 0] == pytest.approx(
        figures["marked"]["matmul_backward"][0, 0] + figures["marked"]["scores_backward"][0, 0])


def test_model_flops_count_no_backward_of_forward_only_work():
    """MFU's model FLOPs: the forward, twice it for the backward less twice the forward-only FLOPs; full recompute
    one more forward (the forward-only work reruns with it)."""
    from test_time_model import llama_spec
    base = analytic.model_work(llama_spec(2), 4096)
    plain = base.work["dense"]
    only = 1e9
    marked = _layer(base, forward_only_attention_mm_flops_per_token=only / 4096)
    forward = 2 * plain.forward_flops(4096)
    head = 3 * base.head_flops_per_token * 4096
    assert marked.training_flops_per_sequence(4096) == pytest.approx(3 * forward - 2 * 2 * only + head)
    assert marked.training_flops_per_sequence(4096, recompute="full") == pytest.approx(
        4 * forward - 2 * 2 * only + head)


def test_gemms_tp_leaves_whole_run_whole_on_every_tp_rank():
    """At TP 2 a rank multiplies half of each split GEMM but all of one TP leaves whole: MLA's down-projections
    (h x q_lora, h x (kv_lora + rope)), the indexer's projections (latent x heads d, h x d, h x heads) and the
    router (h x experts) run on every token of the micro-batch, as their shapes are priced (M = the tokens)."""
    import ndcost

    work = ndcost.resolve(DSV32, census="off").model_work(SEQ)
    cols = ct.strategy_columns([Strategy(seq=SEQ, tp=2, sp=True)])
    h200 = ndcost.resolve(DSV32, census="off").hardware
    by_class = ct._layer_rooflines(work, cols, h200, ct.efficiencies(h200)[0], ct._rows(cols, h200))["by_class"]
    h, latent, kv_latent, rope, heads, dim, experts = 64, 32, 16, 8, 4, 32, 8
    whole_attention = 2 * (h * latent + h * (kv_latent + rope) + latent * heads * dim + h * dim + h * heads)
    for kind in ("dense", "moe"):
        k = work.kinds.index(kind)
        attention = work.work[kind].attention_mm_flops_per_token
        assert by_class[0, k, 0] == pytest.approx(SEQ * ((attention - whole_attention) / 2 + whole_attention))
    moe = work.kinds.index("moe")
    router = 2 * h * experts
    other = work.work["moe"].other_mm_flops_per_token  # the shared expert (split) and the router (whole)
    assert by_class[0, moe, 1] == pytest.approx(SEQ * ((other - router) / 2 + router))
    # the indexer's projections are its only forward-only matmuls, and all of them whole
    arrays = ct._kind_arrays(work)
    assert arrays["class_forward_only_whole_share"][moe].tolist() == [1.0, 0.0, 0.0]


def test_a_tp_rank_holds_the_weights_tp_leaves_whole_whole():
    """Every TP rank holds MLA's down-projections and the indexer's projections whole (ndcost.work
    tp_whole_parameters): at TP 2 a rank holds half of each layer's other TP-split weights less than at TP 1."""
    import ndcost

    model = ndcost.resolve(DSV32, census="off")
    h, latent, kv_latent, rope, heads, dim = 64, 32, 16, 8, 4, 32
    whole = h * latent + h * (kv_latent + rope) + latent * heads * dim + h * dim + h * heads
    tables = model.tables
    assert dict(zip(tables.kinds, tables.whole_params.tolist())) == {"dense": whole, "moe": whole}

    def parameter_bytes(tp):
        cost = model.evaluate(Strategy(seq=SEQ, tp=tp, sp=tp > 1, param_dtype="bf16"))
        return cost.to_dict()["stages"][0]["bytes_by_category"]["parameters"]
    split = {k: int(n) - whole for k, n in zip(tables.kinds, tables.tp_params.tolist())}
    assert parameter_bytes(1) - parameter_bytes(2) == 2 * (split["dense"] // 2 + split["moe"] // 2)  # bf16
