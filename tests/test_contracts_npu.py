"""The NPU contracts: a census under each differs from the census under hf-cuda by what the kernels save differently.

Differences derived by hand from Transformers' Llama modules (LlamaRMSNorm,
LlamaMLP, SDPA) and the kernels' contracts, for one Llama layer of
``s`` tokens, hidden ``h``, ``n`` query heads of width ``d``, feed-forward
``I``, in bf16.
"""
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _helpers import small_llama_config  # noqa: E402

from ndcost.errors import CensusUnavailable  # noqa: E402
from ndcost.plugins.runtimes import profile_from_mapping  # noqa: E402

S, H, N, KV, D, I = 256, 256, 8, 2, 32, 512


def _config():
    return small_llama_config(H, I, N, KV, D)


_NORMS = dict(match=["input_layernorm", "post_attention_layernorm"], module_type="*RMSNorm",
              factory="ndcost.plugins.contracts.npu:fused_rms_norm")
_MLP = dict(match=["mlp"], module_type="*MLP", factory="ndcost.plugins.contracts.npu:fused_swiglu_mlp")

PROFILES = {
    "cuda": dict(name="t-cuda", contracts=["cuda-sdpa"]),
    "attention": dict(name="t-npu-attention", attention="npu_fusion_attention",
                      contracts=["npu-fusion-attention"]),
    "dropout": dict(name="t-npu-attention", attention="npu_fusion_attention",
                    contracts=["npu-fusion-attention"]),
    "norm": dict(name="t-npu-norm", contracts=["cuda-sdpa", "npu-rms-norm"], replacements=[_NORMS]),
    "swiglu": dict(name="t-npu-swiglu", contracts=["cuda-sdpa", "npu-swiglu"], replacements=[_MLP]),
}


def _saved(profile, config=None, index=0):
    from ndcost.plugins.census import records as R
    return R._measure_plain(config or _config(), index, S, profile)


@pytest.fixture(scope="module")
def cuda():
    return _saved(profile_from_mapping(PROFILES["cuda"]))


@pytest.mark.slow
def test_fusion_attention_differs_by_its_statistics(cuda):
    # SDPA (flash) keeps an fp32 logsumexp [b, n, s, 1] and two int64 RNG scalars;
    # npu_fusion_attention keeps softmax_max and softmax_sum, fp32 [b, n, s, 8] each.
    # q, k, v (unexpanded) and the output are the same storages' bytes under both.
    npu = _saved(profile_from_mapping(PROFILES["attention"]))
    sdpa_stats = N * S * 1 * 4 + 2 * 8
    npu_stats = 2 * N * S * 8 * 4
    assert npu.saved_bytes - cuda.saved_bytes == npu_stats - sdpa_stats
    assert npu.ops_bytes["softmax"] == npu_stats
    assert "dropout" not in npu.ops_bytes


@pytest.mark.slow
def test_fusion_attention_installed_by_module_replacement(cuda):
    # the same kernel, installed on the layer's attention module by path instead of for every layer
    profile = profile_from_mapping(dict(
        name="t-npu-attention-module", contracts=["cuda-sdpa", "npu-fusion-attention"],
        replacements=[dict(match=["self_attn"], module_type="*Attention",
                           factory="ndcost.plugins.contracts.npu:fused_attention")]))
    npu = _saved(profile)
    assert npu.saved_bytes - cuda.saved_bytes == 2 * N * S * 8 * 4 - (N * S * 4 + 2 * 8)


@pytest.mark.slow
def test_fusion_attention_keeps_a_packed_dropout_mask_below_keep_probability_one():
    config = _config()
    config.attention_dropout = 0.1
    npu = _saved(profile_from_mapping(PROFILES["dropout"]), config)
    base = _saved(profile_from_mapping(PROFILES["attention"]))
    # one bit per query-key pair of each head
    assert npu.saved_bytes - base.saved_bytes == N * S * S // 8
    assert npu.ops_bytes["dropout"] == N * S * S // 8


@pytest.mark.slow
def test_rms_norm_differs_by_the_fp32_copy_and_the_unweighted_output(cuda):
    # LlamaRMSNorm keeps x in fp32 (pow and mul: 4 s h), the rstd (4 s) and the bf16 normalized
    # value before the weight (2 s h); npu_rms_norm keeps its bf16 input (2 s h) and the rstd (4 s).
    # The first norm's input is the layer's input, the second's the residual sum: nothing else
    # saves either, so each is a new storage under the NPU kernel.
    npu = _saved(profile_from_mapping(PROFILES["norm"]))
    per_norm_hf = 4 * S * H + 4 * S + 2 * S * H
    per_norm_npu = 2 * S * H + 4 * S
    assert cuda.saved_bytes - npu.saved_bytes == 2 * (per_norm_hf - per_norm_npu)
    assert npu.ops_bytes["normOp"] == 2 * per_norm_npu


@pytest.mark.slow
def test_swiglu_mlp_differs_by_one_intermediate_tensor(cuda):
    # LlamaMLP keeps gate_proj's output (SiLU's input), SiLU's output, up_proj's output and
    # their product (down_proj's input): four [s, I] bf16. The fused MLP keeps the gate-and-up
    # output [s, 2I] (npu_swiglu's input) and npu_swiglu's output [s, I]: three [s, I].
    npu = _saved(profile_from_mapping(PROFILES["swiglu"]))
    assert cuda.saved_bytes - npu.saved_bytes == 2 * S * I
    assert npu.ops_bytes["ffAct"] == 2 * S * 2 * I


@pytest.mark.slow
def test_hf_npu_profile_is_the_three_differences_together(cuda):
    from ndcost.plugins.census import records as R
    npu = _saved(R.runtime_profile("hf-npu"))
    attention = 2 * N * S * 8 * 4 - (N * S * 4 + 16)
    norms = 2 * ((4 * S * H + 4 * S + 2 * S * H) - (2 * S * H + 4 * S))
    mlp = 2 * S * I
    assert npu.saved_bytes == cuda.saved_bytes + attention - norms - mlp


@pytest.mark.slow
def test_replacements_keep_the_parameter_count():
    import torch

    from ndcost.plugins.census import layer as L
    from ndcost.plugins.census import records as R

    counts = {}
    for name in ("hf-cuda", "hf-npu"):
        with L.fake_layer(_config(), 0, R.runtime_profile(name)) as fake:
            counts[name] = sum(p.numel() for p in fake.layer.parameters())
            if name == "hf-npu":
                assert type(fake.layer.mlp).__name__ == "NpuSwiGLUMLP"
                assert type(fake.layer.input_layernorm).__name__ == "NpuRMSNorm"
                assert fake.layer.mlp.gate_up_proj.weight.dtype == torch.bfloat16
    assert counts["hf-cuda"] == counts["hf-npu"]


@pytest.mark.slow
def test_attention_sinks_are_refused_under_hf_npu():
    from transformers import AutoConfig

    from ndcost.plugins.census import records as R
    config = AutoConfig.for_model("gpt_oss", hidden_size=128, intermediate_size=128, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=32, num_local_experts=4, num_experts_per_tok=2,
                                  vocab_size=1000, num_hidden_layers=2,
                                  layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(CensusUnavailable, match="sinks"):
        R._measure_plain(config, 0, 64, R.runtime_profile("hf-npu"))


@pytest.mark.slow
def test_npu_native_dropout_keeps_a_bit_mask():
    # GPT-2 drops out the attention's and the MLP's outputs ([1, s, h] each, resid_pdrop 0.1): CUDA's
    # native_dropout keeps a bool mask (s h bytes), torch_npu's a uint8 bit mask padded to whole
    # 128-element blocks (s h / 8 bytes here). Both keep the layer norms' statistics in fp32.
    from transformers import AutoConfig

    from ndcost.plugins.census import records as R
    config = AutoConfig.for_model("gpt2", n_embd=H, n_layer=1, n_head=N, n_positions=S, vocab_size=1000,
                                  bos_token_id=0, eos_token_id=0)
    cuda = R._measure_plain(config, 0, S, R.runtime_profile("hf-cuda"))
    npu = R._measure_plain(config, 0, S, profile_from_mapping(dict(name="t-npu-native",
                                                                   contracts=["cuda-sdpa", "npu-native"])))
    elements = S * H
    assert cuda.saved_bytes - npu.saved_bytes == 2 * (elements - -(-elements // 128) * 128 // 8)
    assert npu.ops_bytes["dropout"] - 16 == 2 * elements // 8  # beside SDPA's two RNG scalars


def test_contracts_are_registered_without_importing_torch(registry):
    from ndcost.plugins.contracts import Contract
    names = {"npu-fusion-attention", "npu-rms-norm", "npu-swiglu", "npu-native", "npu-grouped-experts"}
    for name in names:
        contract = registry.get(f"contract/{name}")
        assert isinstance(contract, Contract) and contract.device == "npu"
    profile = registry.get("runtime/hf-npu")
    assert set(profile.contracts) == names


@pytest.mark.slow
def test_hf_npu_selective_runs_hyperparallels_policy_which_saves_the_fused_attentions_outputs():
    # Both policies keep the layer's input and every other matmul's output in the order the layer runs
    # them (q, k, v, o, the fused gate-and-up, down): q_proj's [s, n d], v_proj's [s, kv d] and the
    # gate-and-up projection's [s, 2 I], bf16. HyperParallel's (hyper_parallel.distributed.
    # activation_checkpoint's _SELECTIVE_AC_COMPUTE_OP_NAMES) also saves what npu.npu_fusion_attention
    # returns, which torchtitan's recomputes: the output [s, n, d] bf16 and softmax_max and softmax_sum,
    # fp32 [n, s, 8] each.
    import attrs

    from ndcost.plugins.census import records as R
    npu = R.runtime_profile("hf-npu")
    assert npu.selective_policy == "hyperparallel"
    kept = {}
    for profile in (npu, attrs.evolve(npu, selective_policy="torchtitan")):
        measured, _ = R._measure_selective(_config(), 0, S, profile, R.policy_for(profile), False)
        kept[profile.selective_policy] = measured.saved_bytes
    layer_input = 2 * S * H
    matmul_outputs = 2 * S * N * D + 2 * S * KV * D + 2 * S * 2 * I
    attention_outputs = 2 * S * N * D + 2 * N * S * 8 * 4
    assert kept["torchtitan"] == layer_input + matmul_outputs
    assert kept["hyperparallel"] == kept["torchtitan"] + attention_outputs
    assert attention_outputs / kept["torchtitan"] == pytest.approx(0.32, abs=0.01)  # about a quarter more


def test_a_census_checkpoints_as_the_cpu_and_puts_the_default_device_type_back():
    # importing torch_npu sets checkpointing's default device type to "npu"; a checkpoint over CPU
    # tensors takes it, and its recompute would enter the NPU's autocast (torch.utils.checkpoint)
    import torch
    from torch.utils.checkpoint import DefaultDeviceType, checkpoint

    from ndcost.plugins.census.measure import measure

    seen = []

    def layer(t):
        seen.append(DefaultDeviceType.get_device_type())  # in the forward, then in the recompute
        return (t * 2).sin()

    x = torch.ones(8, requires_grad=True)
    previous = DefaultDeviceType.get_device_type()
    DefaultDeviceType.set_device_type("npu")
    try:
        with pytest.raises(AttributeError, match="npu"):  # outside a census: this torch has no torch.npu
            checkpoint(layer, x, use_reentrant=False).sum().backward()
        seen.clear()
        measure([], (x,), lambda: checkpoint(layer, x, use_reentrant=False), lambda out: out.sum().backward(),
                checkpointed=True)
        assert seen == ["cpu", "cpu"]
        assert DefaultDeviceType.get_device_type() == "npu"

        def fails():
            raise ZeroDivisionError("a forward that raises")

        with pytest.raises(ZeroDivisionError):
            measure([], (x,), fails, lambda out: None)
        assert DefaultDeviceType.get_device_type() == "npu"
    finally:
        DefaultDeviceType.set_device_type(previous)


@pytest.mark.slow
def test_a_replacement_factory_that_fails_is_a_census_unavailable_naming_it_and_the_missing_library(
        tmp_path, monkeypatch):
    import importlib.util

    from ndcost.plugins.census import records as R
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed here")
    (tmp_path / "npu_factory_probe.py").write_text(
        "def fused_mlp(module, config):\n"
        "    import torch_npu  # a fused module built on Ascend's kernels\n"
        "    return module\n\n"
        "def broken_mlp(module, config):\n"
        "    raise ValueError('no gate_proj to fuse')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for factory, said in (("fused_mlp", r"needs torch_npu, absent on this host"),
                          ("broken_mlp", r"failed \(ValueError: no gate_proj to fuse\)")):
        profile = profile_from_mapping(dict(name="t-npu-factory", contracts=["cuda-sdpa"], replacements=[
            dict(match=["mlp"], module_type="*MLP", factory=f"npu_factory_probe:{factory}")]))
        with pytest.raises(CensusUnavailable, match=rf"replaces mlp \(LlamaMLP\) with npu_factory_probe:{factory}, "
                                                    rf"which {said}"):
            R._measure_plain(_config(), 0, S, profile)


# DeepSeek-V3.2's dense layer at widths a test runs quickly, its indexer's 4 heads scoring every key.
DSV32 = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
             num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
             v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
             first_k_dense_replace=1, vocab_size=100, num_hidden_layers=2, index_n_heads=4, index_head_dim=32,
             index_topk=8)


@pytest.mark.slow
def test_deepseek_v32_with_an_eager_indexer_under_hyperparallels_policy_is_refused_not_priced():
    # Transformers' DeepseekV32Indexer runs under no_grad: scores = q.float() @ k.float()^T, fp32
    # [s, heads, s], then weights @ scores, fp32 [s, 1, s], and a top-k no gradient takes. Without
    # checkpointing nothing of it is saved; HyperParallel's policy saves every batched matmul's output,
    # torchtitan's only mm's, so the two policies differ by exactly those two outputs.
    import attrs
    from transformers import AutoConfig

    from ndcost.plugins.census import records as R
    config = AutoConfig.for_model("deepseek_v32", **DSV32)
    cuda = R.runtime_profile("hf-cuda")
    eager_indexer = attrs.evolve(cuda, name="t-cuda-hyperparallel", selective_policy="hyperparallel")
    plain = R._measure_plain(config, 0, S, eager_indexer).saved_bytes
    kept = {p.selective_policy: R._measure_selective(config, 0, S, p, R.policy_for(p), False)[0].saved_bytes
            for p in (cuda, eager_indexer)}
    heads = DSV32["index_n_heads"]
    assert kept["hyperparallel"] - kept["torchtitan"] == 4 * S * heads * S + 4 * S * S
    assert kept["hyperparallel"] > 1.5 * plain > kept["torchtitan"]
    with pytest.raises(CensusUnavailable, match=rf"checkpoint_policy/hyperparallel a deepseek_v32 dense layer "
                                                rf"keeps {kept['hyperparallel'] / S:,.0f} bytes a token, "
                                                rf"{kept['hyperparallel'] / plain:.2f} times the {plain / S:,.0f}"):
        R.census_kind(config, 0, S, eager_indexer, "dense")
    # hf-npu states why before building it: HyperParallel's DSA module is no contract here
    with pytest.raises(CensusUnavailable, match="runtime 'hf-npu' cannot price a deepseek_v32 layer: .*eager "
                                                "indexer .* far more than the layer keeps plain"):
        R.census_kind(config, 0, S, R.runtime_profile("hf-npu"), "dense")


@pytest.mark.slow
def test_hyperparallels_grouped_experts_keep_what_their_npu_kernels_save():
    # A Qwen3-MoE layer of T = S tokens, k of E experts of width I, hidden h, under hf-npu with and
    # without the grouped-experts replacement (the other runs Transformers' grouped_mm experts).
    # HyperParallel's GroupedExperts (hyper_parallel/components/modules/grouped_experts.py) keeps, beside
    # the tokens and their top-k experts (the router keeps both already: its F.linear the norm's output,
    # its topk the indices): npu_moe_token_permute's int32 route order [T k] and the permuted tokens
    # [T k, h] (the first grouped matmul's input), the int64 group list [E] (both GMMFunctions'), the
    # gate-and-up output [T k, 2I] (npu_swiglu's input), the gated [T k, I] (the second grouped
    # matmul's input), the expert outputs [T k, h] and the bf16 routing weights [T, k] (unpermute's).
    # Transformers' grouped_mm experts keep three int64 index tensors [T k], the gathered tokens
    # [T k, h], int32 offsets [E], the gate-and-up output [T k, 2I] (kept first as its gate half),
    # the activation's output and the product [T k, I], the down output [T k, h] and the routing
    # weights gathered [T k, 1].
    from collections import Counter

    import attrs
    from transformers import AutoConfig

    from ndcost.plugins.census import layer as L
    from ndcost.plugins.census import records as R
    E, K, MOE_I = 8, 2, 32
    config = AutoConfig.for_model("qwen3_moe", hidden_size=H, intermediate_size=I, moe_intermediate_size=MOE_I,
                                  num_attention_heads=N, num_key_value_heads=KV, head_dim=D, num_experts=E,
                                  num_experts_per_tok=K, vocab_size=1000, num_hidden_layers=1)
    npu = R.runtime_profile("hf-npu")
    grouped_mm = attrs.evolve(npu, replacements=[r for r in npu.replacements if r.match != ("mlp.experts",)])
    fused, plain = (R._measure_plain(config, 0, S, p) for p in (npu, grouped_mm))
    routes = S * K
    bf, i32, i64 = "bfloat16", "int32", "int64"
    hyperparallel = Counter({((routes,), i32, 4 * routes): 1, ((routes, H), bf, 2 * routes * H): 2,
                             ((E,), i64, 8 * E): 1, ((routes, 2 * MOE_I), bf, 4 * routes * MOE_I): 1,
                             ((routes, MOE_I), bf, 2 * routes * MOE_I): 1, ((S, K), bf, 2 * routes): 1})
    transformers_ = Counter({((routes,), i64, 8 * routes): 3, ((routes, H), bf, 2 * routes * H): 2,
                             ((E,), i32, 4 * E): 1, ((routes, MOE_I), bf, 4 * routes * MOE_I): 1,
                             ((routes, MOE_I), bf, 2 * routes * MOE_I): 2, ((routes, 1), bf, 2 * routes): 1})
    found = Counter(t[:3] for t in fused.saved_tensors)
    assert found - Counter(t[:3] for t in plain.saved_tensors) == hyperparallel - transformers_
    assert Counter(t[:3] for t in plain.saved_tensors) - found == transformers_ - hyperparallel
    assert fused.saved_bytes - plain.saved_bytes == (4 * routes + 8 * E + 6 * routes * MOE_I) - (
        24 * routes + 4 * E + 8 * routes * MOE_I)
    # neither policy names npu_grouped_matmul: HyperParallel's alternates on q, k, v, o and the router's
    # mm (saving q, v and the router's), and recomputes both grouped matmuls
    record = R.census_kind(config, 0, S, npu, "moe")
    router, experts = 2 * S * H * E, 2 * routes * H * 2 * MOE_I + 2 * routes * MOE_I * H
    assert record.recomputed_other_mm_share == experts / (router + experts)
    with L.fake_layer(config, 0, npu) as fake:
        experts_module = fake.layer.mlp.experts
        assert type(experts_module).__name__ == "NpuGroupedExperts"
        assert tuple(experts_module.gate_up_proj.shape) == (E, H, 2 * MOE_I)
        assert tuple(experts_module.down_proj.shape) == (E, MOE_I, H)
