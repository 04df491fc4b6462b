"""DeepSeek-V4: the stack census, its sparse-attention and indexer contracts, and the single-layer refusal.

A small DeepSeek-V4 of four layers, one of each attention type (heavily
compressed, compressed sparse, sliding) with hash routing in the first
three, at ``s`` tokens: compressed-sparse layers compress every 4 tokens,
heavily compressed ones every 128, the window is 16 tokens and the indexer
keeps the top 8 compressed entries.
"""
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from ndcost.errors import CensusUnavailable  # noqa: E402
from ndcost.plugins.runtimes import profile_from_mapping  # noqa: E402

S, HIDDEN, HEADS, D, WINDOW, TOPK = 256, 256, 4, 64, 16, 8
TYPES = ["heavily_compressed_attention", "compressed_sparse_attention", "compressed_sparse_attention",
         "sliding_attention"]


def _config():
    from transformers import AutoConfig
    return AutoConfig.for_model(
        "deepseek_v4", hidden_size=HIDDEN, moe_intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=HEADS, head_dim=D, q_lora_rank=128, n_routed_experts=8, num_experts_per_tok=2,
        index_n_heads=4, index_head_dim=32, index_topk=TOPK, o_groups=2, o_lora_rank=64, vocab_size=1000,
        sliding_window=WINDOW, layer_types=TYPES)


EAGER = dict(name="t-eager", contracts=["cuda-sdpa"])
INDEXER = dict(name="t-indexer", contracts=["cuda-sdpa"], family_contracts={"deepseek_v4": ["deepseek-v4-indexer"]})


@pytest.fixture(scope="module")
def fused():
    from ndcost.plugins.census import records as R
    from ndcost.plugins.census.stack import census_stack
    return census_stack(_config(), S, R.runtime_profile("hf-cuda-fused"))


@pytest.mark.slow
def test_indexer_contract_keeps_what_the_eager_selection_keeps():
    # The selection's indices take no gradient: a run frees the scores' graph once the top-k is
    # taken, so the eager indexer keeps nothing past the forward, and the contract, which records
    # no graph at all, keeps the same bytes in every layer.
    from ndcost.plugins.census.stack import census_stack
    eager = census_stack(_config(), S, profile_from_mapping(EAGER))
    indexed = census_stack(_config(), S, profile_from_mapping(INDEXER))
    assert [m.kept_bytes for m in indexed] == [m.kept_bytes for m in eager]


def _compressed(layer_type):
    return {"heavily_compressed_attention": S // 128, "compressed_sparse_attention": S // 4}.get(layer_type, 0)


def _gathered(layer_type):
    compressed = _compressed(layer_type)
    if layer_type == "compressed_sparse_attention":
        return WINDOW + min(TOPK, compressed)
    return WINDOW + compressed


@pytest.mark.slow
def test_sparse_attention_keeps_its_contract_in_every_layer(fused):
    # per layer: q [1, h, s, d] bf16 (rope's output, new), the shared K=V [1, 1, s + c, d] bf16
    # (the window's keys concatenated with the compressed entries, new), the output [1, s, h, d]
    # bf16, the gathered indices int32 [1, s, k] (batched-matmul inputs, attBMM) and the fp32
    # log-sum-exp [1, h, s] (softmax).
    for measured, layer_type in zip(fused, TYPES):
        attbmm = (2 * HEADS * S * D + 2 * (S + _compressed(layer_type)) * D + 2 * S * HEADS * D
                  + 4 * S * _gathered(layer_type))
        assert measured.ops_bytes["attBMM"] == attbmm, layer_type
        # beside the log-sum-exp, the attention's other softmaxes: the attention hyper-connection's
        # mixing weights (softmax over [1, s, 4, 4], fp32) and the compressor's gate over each window
        # (fp32: [1, s/128, 128, d] heavily compressed, [1, s/4, 2 * 4, d] compressed sparse)
        gates = {"heavily_compressed_attention": 4 * S * D, "compressed_sparse_attention": 4 * (S // 4) * 8 * D}
        softmax = 4 * HEADS * S + 4 * S * 4 * 4 + gates.get(layer_type, 0)
        assert measured.ops_bytes["softmax"] == softmax, layer_type


@pytest.mark.slow
def test_kind_records_are_the_mean_of_their_layers(fused):
    from ndcost import models
    from ndcost.plugins.census import kind_records
    spec = models.load_model(_config())
    records = kind_records(spec, S, "hf-cuda-fused", use_cache=False, progress=None)
    kinds = [g.kind for g in spec.layers if not g.mtp for _ in range(g.count)]
    assert set(records) == set(kinds)  # no MTP kind: Transformers builds none
    for kind, record in records.items():
        members = [m.kept_bytes for m, each in zip(fused, kinds) if each == kind]
        assert record.source == "census-stack"
        assert round((record.saved_per_token + record.saved_tp_per_token) * S) == sum(members) / len(members)
        assert record.saved_tp_per_token > 0  # the heads and the experts' widths split
        # under torchtitan's policy every layer checkpointed: it keeps less than plain, and the matmuls it
        # recomputes are a share; its backward peaks with part of its gradients made
        assert 0 < record.selective_per_token + record.selective_tp_per_token < \
            record.saved_per_token + record.saved_tp_per_token
        assert 0 <= record.recomputed_other_mm_share <= 1 and 0 < record.working_grad_share <= 1
    # the sparse kernel's scores at the pairs it gathers: query i sees min(k, i + 1 + c) entries
    # (k = window + compressed entries, c = compressed entries ahead of the window), each pair
    # costing 2 (d + d) per head; a sliding layer's k is the window alone
    per_pair = 2 * HEADS * 2 * D
    for kind, layer_type in (("sliding_moe", "sliding_attention"), ("hca_hash_moe", "heavily_compressed_attention")):
        gathered, ahead = _gathered(layer_type), _compressed(layer_type)
        pairs = sum(min(gathered, i + 1 + ahead) for i in range(S))
        assert records[kind].flops_by_part["scores"] == per_pair * pairs
        assert records[kind].flops_all_pairs_by_part["scores"] == per_pair * S * (S + ahead)


def test_single_layer_census_is_refused():
    from ndcost.plugins.census.stack import refuse_single_layer
    with pytest.raises(CensusUnavailable, match="hyper-connection.*whole stack"):
        refuse_single_layer(_config())


def test_tp_config_keeps_the_one_shared_kv_head_and_halves_widths_once():
    from ndcost.plugins.census.stack import stack_tp_config
    config = _config()
    half = stack_tp_config(config, 2)
    assert half.num_attention_heads == HEADS // 2
    assert half.num_key_value_heads == 1
    assert half.moe_intermediate_size == 64 and half.intermediate_size == 64
    assert half.head_dim == D


def test_contracts_registered(registry):
    for name in ("deepseek-v4-sparse-attention", "deepseek-v4-indexer"):
        assert registry.get(f"contract/{name}").name == name
    assert callable(registry.get("census/stack"))


def test_a_family_whose_kernels_no_contract_states_is_refused():
    from ndcost.plugins.census.stack import census_stack
    profile = profile_from_mapping(dict(name="t-missing", contracts=["cuda-sdpa"],
                                        family_contracts={"deepseek_v4": ["deepseek-v4-not-installed"]}))
    with pytest.raises(CensusUnavailable) as refused:
        census_stack(_config(), S, profile)
    message = str(refused.value)
    assert "deepseek-v4-not-installed" in message and "census='off'" in message


def test_a_runtime_that_cannot_price_the_family_says_why():
    from ndcost.plugins.census import records as R
    from ndcost.plugins.census.stack import census_stack
    with pytest.raises(CensusUnavailable, match="sinks"):
        census_stack(_config(), S, R.runtime_profile("hf-npu"))


@pytest.mark.slow
def test_output_census_runs_the_hyper_connection_head_on_the_streams(monkeypatch):
    """``DeepseekV4Model.forward`` ends ``self.norm(self.hc_head(hidden_states))``: the output layer's census runs
    the head on the ``[1, s, hc, h]`` streams the last layer hands on (the family's ``output_prelude``).

    ``DeepseekV4HyperHead`` keeps, by hand (its fp32 parameters left out), a token: the streams flattened to fp32
    (the unweighted RMSNorm's ``square`` and ``mul`` save it, 4 hc h), that norm's fp32 ``rsqrt`` (4), its fp32
    output (the ``linear``'s input, 4 hc h), the mixes (the scale's ``mul``, 4 hc), the ``sigmoid``'s output
    (4 hc), ``pre`` and the bf16 streams (the final ``mul``'s operands, 4 hc + 2 hc h): 10 hc h + 12 hc + 4.
    """
    from ndcost.plugins.census import records as R
    from ndcost.plugins.census.output import measure_output, output_holder
    from ndcost.plugins.census.stack import _family

    config, runtime = _config(), R.runtime_profile("hf-cuda")
    hc = config.hc_mult
    with output_holder(config, runtime) as holder:
        assert [type(m).__name__ for m in holder.prelude] == ["DeepseekV4HyperHead"]
    with_head, _ = measure_output(config, S, runtime)
    monkeypatch.setattr(type(_family("deepseek_v4")), "output_prelude", ())
    without, _ = measure_output(config, S, runtime)
    assert with_head.saved_bytes - without.saved_bytes == S * (10 * hc * HIDDEN + 12 * hc + 4) == S * 10_292
