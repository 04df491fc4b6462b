"""Exactness: every family's per-part counts equal Transformers' own modules on the meta device.

For each config of the matrix (small widths, a few layers, covering biases
on/off, tied/untied heads, MHA/GQA/MQA, MLA with and without a query latent,
shared experts, first dense layers, sparse steps, output gates, QK-norms,
DeepSeek-V4's layer types), the reference is Transformers' model built from
the config on the meta device, its named parameters summed by part by
``tests/_hf_parts.classify`` (independent of ndcost's code).
"""
from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("transformers")

from _hf_parts import hf_buffers, hf_parts  # noqa: E402

from ndcost.errors import InvalidValue  # noqa: E402
from ndcost.models import family_for, load_model, parameters  # noqa: E402

SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=100)
MLA = dict(num_hidden_layers=3, first_k_dense_replace=1, hidden_size=64, intermediate_size=96,
           moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
           num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8,
           qk_nope_head_dim=16, v_head_dim=12, vocab_size=100)
GLM = dict(num_hidden_layers=3, first_k_dense_replace=1, hidden_size=64, intermediate_size=96,
           moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
           num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=100)
NEXT = dict(num_hidden_layers=4, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=100, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=12)
TEXT35 = {k: v for k, v in NEXT.items() if k not in ("moe_intermediate_size", "shared_expert_intermediate_size",
                                                     "num_experts", "num_experts_per_tok")}
MOE35 = {k: v for k, v in NEXT.items() if k != "intermediate_size"}
V4 = dict(num_hidden_layers=5, hidden_size=64, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
          num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=24, vocab_size=100, o_groups=2,
          o_lora_rank=16, index_n_heads=4, index_head_dim=8, hc_mult=2)
GPT_OSS = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=100)
GPT2 = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0)

MATRIX = [
    ("llama", dict(SMALL)),
    ("llama", dict(SMALL, attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    ("llama", dict(SMALL, num_key_value_heads=4)),                     # MHA
    ("llama", dict(SMALL, num_key_value_heads=1, head_dim=24)),        # MQA, stated head width
    ("llama", dict(SMALL, attention_bias=True, mlp_bias=False)),
    ("mistral", dict(SMALL)),
    ("mistral", dict(SMALL, num_key_value_heads=1, tie_word_embeddings=True)),
    ("qwen2", dict(SMALL)),
    ("qwen2", dict(SMALL, tie_word_embeddings=True, num_key_value_heads=1)),
    ("qwen2", dict(SMALL, num_hidden_layers=4, use_sliding_window=True, max_window_layers=2)),
    ("qwen3", dict(SMALL)),
    ("qwen3", dict(SMALL, attention_bias=True, head_dim=32, tie_word_embeddings=True)),
    ("qwen3_moe", dict(SMALL, num_experts=8, moe_intermediate_size=32, num_experts_per_tok=2)),
    ("qwen3_moe", dict(SMALL, num_hidden_layers=4, num_experts=8, moe_intermediate_size=32, num_experts_per_tok=2,
                       decoder_sparse_step=2, mlp_only_layers=[3], attention_bias=True)),
    ("mixtral", dict(SMALL)),
    ("mixtral", dict(SMALL, num_local_experts=4, num_experts_per_tok=1, tie_word_embeddings=True, head_dim=8)),
    ("gpt2", dict(GPT2)),
    ("gpt2", dict(GPT2, tie_word_embeddings=False, n_inner=80)),
    ("deepseek_v3", dict(MLA)),
    ("deepseek_v3", dict(MLA, q_lora_rank=None, attention_bias=True, n_shared_experts=2)),
    ("deepseek_v3", dict(MLA, first_k_dense_replace=0, n_shared_experts=0, tie_word_embeddings=True)),
    ("deepseek_v2", dict(MLA, topk_method="group_limited_greedy")),
    ("deepseek_v2", dict(MLA, q_lora_rank=None, n_shared_experts=2)),  # greedy: the groups limit nothing
    ("deepseek_v32", dict(MLA, index_n_heads=4, index_head_dim=8)),
    ("deepseek_v32", dict(MLA, index_n_heads=2, index_head_dim=16, attention_bias=True,
                          mlp_layer_types=["sparse", "dense", "sparse"])),
    ("glm4_moe", dict(GLM, use_qk_norm=True, attention_bias=True)),
    ("glm4_moe", dict(GLM, first_k_dense_replace=2, n_shared_experts=2)),
    ("gpt_oss", dict(GPT_OSS)),
    ("gpt_oss", dict(GPT_OSS, attention_bias=False, num_hidden_layers=3, tie_word_embeddings=True)),
    ("qwen3_next", dict(NEXT)),
    ("qwen3_next", dict(NEXT, mlp_only_layers=[0], decoder_sparse_step=2, attention_bias=True)),
    ("qwen3_next", dict(NEXT, num_hidden_layers=6, layer_types=["linear_attention", "full_attention"] * 3)),
    ("qwen3_5", dict(text_config=TEXT35)),
    ("qwen3_5", dict(text_config=dict(TEXT35, tie_word_embeddings=True, attention_bias=True))),
    ("qwen3_5_text", dict(TEXT35)),
    ("qwen3_5_moe", dict(text_config=MOE35)),
    ("qwen3_5_moe_text", dict(MOE35, linear_conv_kernel_dim=3)),
    ("deepseek_v4", dict(V4)),
    ("deepseek_v4", dict(V4, layer_types=["sliding_attention", "heavily_compressed_attention",
                                          "compressed_sparse_attention", "heavily_compressed_attention",
                                          "compressed_sparse_attention"])),
    ("deepseek_v4", dict(V4, mlp_bias=True, hc_mult=3, mlp_layer_types=["hash_moe", "moe", "hash_moe", "moe", "moe"],
                         compress_rates={"compressed_sparse_attention": 8, "heavily_compressed_attention": 16})),
]


def _config(model_type, kwargs):
    from transformers import AutoConfig
    return AutoConfig.for_model(model_type, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("model_type,kwargs", MATRIX,
                         ids=[f"{mt}-{i}" for i, (mt, _) in enumerate(MATRIX)])
def test_parts_equal_transformers_on_meta(model_type, kwargs):
    config = _config(model_type, kwargs)
    reference, total, model = hf_parts(config)
    assert "unclassified" not in reference
    count = parameters(load_model(config))
    assert dict(count.by_part) == reference
    assert count.total == total == sum(p.numel() for p in model.parameters())
    assert sum(count.by_part.values()) == count.total
    assert count.buffers == hf_buffers(model)


@pytest.mark.slow
@pytest.mark.parametrize("model_type,kwargs", [MATRIX[i] for i in (1, 13, 19, 22, 23, 28, 34, 37)])
def test_layer_kind_parameters_equal_one_transformers_layer(model_type, kwargs):
    """One layer of each kind holds what the Transformers layer at that position holds."""
    config = _config(model_type, kwargs)
    _, _, model = hf_parts(config)
    spec = load_model(config)
    count = parameters(spec)
    layers = model.model.layers
    for index, kind in enumerate(spec.layer_kinds()):
        assert count.kind_total(kind) == sum(p.numel() for p in layers[index].parameters()), (index, kind)


def test_deepseek_v3_groups_in_model_order():
    spec = load_model("deepseek-v3")
    assert [(g.kind, g.count, g.mtp) for g in spec.layers] == [("dense", 3, False), ("moe", 58, False),
                                                               ("mtp", 1, True)]
    assert spec.num_layers == 61 and spec.num_mtp_layers == 1
    assert (spec.q_lora_rank, spec.kv_lora_rank, spec.first_k_dense, spec.num_shared_experts) == (1536, 512, 3, 1)


def test_deepseek_v2_routes_as_its_topk_method_says():
    """DeepseekV2TopkRouter limits a token to its best groups only under group_limited_greedy; greedy reads no
    groups (DeepSeek-V2-Lite's config states one of each); no score-correction biases, no MTP layers."""
    family = family_for("deepseek_v2")
    greedy = family.spec(dict(MLA, model_type="deepseek_v2", n_group=8, topk_group=3), "greedy")
    limited = family.spec(dict(MLA, model_type="deepseek_v2", topk_method="group_limited_greedy"), "limited")
    assert greedy.expert_groups is None and (limited.expert_groups, limited.expert_groups_per_token) == (2, 1)
    assert parameters(greedy).buffers == 0 and parameters(limited).layer_counts == {"dense": 1, "moe": 2}
    assert family.router_selection_bytes(greedy) == 0
    assert family.router_selection_bytes(limited) == 16 * 2 + 8 * 1 + 15 * 8  # V3's group mask, in bytes a token
    with pytest.raises(InvalidValue, match="topk_method 'noaux_tc' is not one of Transformers'"):
        family.spec(dict(MLA, model_type="deepseek_v2", topk_method="noaux_tc"), "bad")


def test_qwen3_next_groups_in_model_order():
    spec = load_model("qwen3-next-80b-a3b")
    expected = [("linear_attention", 3), ("full_attention", 1)] * 12
    assert [(g.kind, g.count) for g in spec.layers] == expected
    assert spec.kind("full_attention").attention == "gqa"
    assert spec.kind("linear_attention").attention == "gated_delta_net"
    assert spec.extra["output_gate"] and spec.extra["qk_norm"]


@pytest.mark.slow
def test_mixed_dense_layers_get_their_own_kind():
    spec = load_model(_config("qwen3_next", dict(NEXT, mlp_only_layers=[0], decoder_sparse_step=2)))
    # layer 0 dense (mlp_only_layers), 1 and 3 route (sparse step 2), layer 3 full attention (every 4th)
    assert spec.layer_kinds() == ("linear_attention_dense", "linear_attention", "linear_attention_dense",
                                  "full_attention")
    spec = load_model(_config("qwen3_moe", dict(SMALL, num_hidden_layers=4, num_experts=8, moe_intermediate_size=32,
                                                num_experts_per_tok=2, decoder_sparse_step=2)))
    assert spec.layer_kinds() == ("dense", "moe", "dense", "moe")


def test_kind_names_are_short_and_mtp_named():
    for name in ("deepseek-v3", "glm-4.5", "deepseek-v4-flash", "gpt-oss-20b", "qwen3-8b"):
        spec = load_model(name)
        for group in spec.layers:
            assert len(group.kind) <= 24
            assert ("mtp" in group.kind) == group.mtp
    assert set(load_model("gpt-oss-20b").kinds) == {"sliding_attention", "full_attention"}
    assert load_model("qwen3-8b").kinds == ("dense",)


def test_stack_census_flags():
    assert family_for("deepseek_v4").stack_census is True
    assert family_for("llama").stack_census is False


# Transformers' config defaults, so a config.json that omits a field reads as Transformers reads it.
FAMILY_CONFIGS = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
                  "qwen3_moe": "Qwen3MoeConfig", "mixtral": "MixtralConfig", "gpt2": "GPT2Config",
                  "deepseek_v2": "DeepseekV2Config", "deepseek_v3": "DeepseekV3Config",
                  "deepseek_v32": "DeepseekV32Config",
                  "deepseek_v4": "DeepseekV4Config", "glm4_moe": "Glm4MoeConfig", "gpt_oss": "GptOssConfig",
                  "qwen3_next": "Qwen3NextConfig", "qwen3_5": "Qwen3_5TextConfig",
                  "qwen3_5_moe": "Qwen3_5MoeTextConfig"}


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(FAMILY_CONFIGS))
def test_family_defaults_are_transformers_defaults(model_type):
    import transformers
    cls = getattr(transformers, FAMILY_CONFIGS[model_type])
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    family = family_for(model_type)
    checked = 0
    for name, value in family.defaults.items():
        names = (name,) + tuple(family.aliases.get(name, ()))
        present = [n for n in names if n in fields]
        if not present or value is None:
            continue
        assert fields[present[0]] == value, (model_type, name)
        checked += 1
    assert checked >= 5


MODEL_TYPES = ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "deepseek_v2", "deepseek_v3", "deepseek_v32",
               "deepseek_v4", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "gpt_oss",
               "glm4_moe", "gpt2", "generic_decoder"]


def test_every_family_registered_by_its_own_entry_point(registry):
    from ndcost import manager
    for model_type in MODEL_TYPES:
        assert f"family/{model_type}" in registry
    sources = {p.name: p for p in manager.plugins().plugins if p.distribution == "ndcost"}
    for module in ("family_llama", "family_deepseek_v3", "family_deepseek_v4", "family_qwen3_next",
                   "family_generic", "formulas_attention", "formulas_moe", "formulas_deepseek_v4"):
        assert module in sources and sources[module].error is None and sources[module].registered


def test_formula_slots_registered(registry):
    for name in ("attention.params.gqa", "attention.params.mha", "attention.params.mqa", "attention.params.mla",
                 "attention.params.output_gate", "attention.params.sinks", "attention.params.dsa_indexer",
                 "norm.params.qk", "norm.params.layer", "bias.params", "bias.params.mlp", "ffn.params.dense",
                 "moe.params.routed", "moe.params.shared", "moe.params.router",
                 "linear_attention.params.gated_delta_net", "deepseek_v4.params.hyper_connection",
                 "deepseek_v4.params.compressor", "deepseek_v4.params.indexer", "deepseek_v4.params.hash_router",
                 "gpt_oss.params.attention", "gpt_oss.params.experts", "gpt_oss.params.router",
                 "embedding.params", "head.params", "mtp.params.glue"):
        assert f"formula/{name}" in registry


def test_shared_identifiers():
    from ndcost.values import FLOP_PARTS, OPS, PARTS
    assert PARTS == ("attention", "norm", "ffn", "routed", "shared", "router", "embedding", "head", "mtp", "other")
    assert OPS == ("attMM", "attBMM", "softmax", "dropout", "normOp", "ffAct", "ffMM", "linrec", "other")
    assert FLOP_PARTS == PARTS + ("scores", "linrec")


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(FAMILY_CONFIGS))
def test_supports_sdpa_is_transformers_own(model_type):
    """Whether a runtime asking for SDPA runs it: Transformers' causal-LM class's ``_supports_sdpa``."""
    import importlib

    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    cls = getattr(modeling, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    assert family_for(model_type).supports_sdpa == bool(cls._supports_sdpa)


def test_mistral_and_phi3_layers_attend_within_the_configs_window():
    """MistralModel and Phi3Model mask every layer by config.sliding_window where it is set: the config class's
    default where a config leaves it out (Transformers' own), none where it states null."""
    transformers = pytest.importorskip("transformers")
    from ndcost.models import load_model
    for model_type, config_class in (("mistral", transformers.MistralConfig), ("phi3", transformers.Phi3Config)):
        default = config_class().sliding_window
        assert load_model({"model_type": model_type}).kind("dense").sliding_window == (default or 0)
        assert load_model({"model_type": model_type, "sliding_window": 1024}).kind("dense").sliding_window == 1024
        assert load_model({"model_type": model_type, "sliding_window": None}).kind("dense").sliding_window == 0
