"""What a runtime's own kernels change in the time model: its attention's kernel order by compute capability, its
fused pointwise kernels (Transformer Engine under Megatron-LM: specs/runtimes/megatron-te-cuda.yaml) and a rotary
embedding torch.compile cannot fuse (torchtitan's complex product: specs/runtimes/torchtitan-cuda.yaml).

Expected figures are derived by hand: the scores' FLOPs of Llama-3.1-8B's layer (4 h d s (s + 1) / 2 at each
causal pair), the query-block waves of the flash prior (32 heads x 4096 / 128 blocks over the SMs), and the
eager and fused elementwise elements of a Llama layer (tests/test_lowp.py derives the same counts for compile).
Transformer Engine's choice is read from transformer_engine/pytorch/attention/dot_product_attention/utils.py
(get_attention_backend: FusedAttention, cuDNN's kernel, preferred over FlashAttention from sm90 on).
"""
from __future__ import annotations

import math

import attrs
import pytest

import ndcost
from ndcost.compose import time as ct
from ndcost.errors import InvalidValue
from ndcost.models import load_model
from ndcost.plugins.estimators import flops as analytic
from ndcost.plugins.runtimes import profile_from_mapping
from ndcost.specio import hardware_from_mapping
from ndcost.trainers import from_config
from ndcost.values import Strategy

SEQ = 4096
H, Q, KV, D, FFN = 4096, 32, 8, 128, 14336  # Llama-3.1-8B
SCORES = 4 * Q * D * SEQ * (SEQ + 1) / 2    # Q K^T and P V at each causal pair, one layer


@pytest.fixture(scope="module")
def work():
    return analytic.model_work(load_model("llama-3.1-8b"), SEQ)


def _under(work, registry, runtime):
    """*work* as the resolver hands it over under *runtime*: its kernel order and pointwise choice."""
    profile = registry.get(f"runtime/{runtime}")
    return attrs.evolve(work, attention_kernel="sdpa", attention_backends=profile.attention_backends,
                        fused_pointwise=profile.pointwise == "fused")


def _layer(work, hardware, **fields):
    cols = ct.strategy_columns([Strategy(seq=SEQ, param_dtype="bf16", **fields)])
    return {k: float(v[0, 0]) for k, v in ct.layer_seconds(work, cols, hardware).items() if k != "selective_measured"}


def _waves(sms):
    blocks = Q * math.ceil(SEQ / 128)
    return blocks / (math.ceil(blocks / sms) * sms)


def test_transformer_engine_runs_cudnn_from_hopper_on_and_flash_below(work, registry):
    h100, a100 = registry.get("hardware/h100"), registry.get("hardware/a100")
    te, sdpa = _under(work, registry, "megatron-te-cuda"), _under(work, registry, "hf-cuda-fused")
    # H100 (9.0): cuDNN's kernel, which the file prices at efficiency.attention (no plateau of its own)
    assert _layer(te, h100)["scores_forward"] == pytest.approx(
        SCORES / (h100.peak_flops("bf16") * h100.efficiency["attention"]), rel=1e-9)
    assert _layer(te, h100)["scores_backward"] == pytest.approx(
        2 * SCORES / (h100.peak_flops("bf16") * h100.efficiency["attention_backward"]), rel=1e-9)
    # PyTorch's SDPA on the same H100 under a torch before 2.9 tries flash first: FlashAttention-2's plateau (0.35
    # forward) x the waves; the file's own torch (2.13) prefers cuDNN, as Transformer Engine does
    older = attrs.evolve(h100, kernel_tables={**h100.kernel_tables, "sdpa_backends": ["flash", "efficient"]})
    assert _layer(sdpa, older)["scores_forward"] == pytest.approx(
        SCORES / (h100.peak_flops("bf16") * 0.35 * _waves(132)), rel=1e-9)
    assert _layer(sdpa, h100)["scores_forward"] == _layer(te, h100)["scores_forward"]
    # A100 (8.0): Transformer Engine keeps FlashAttention-2 first (0.73 forward), 108 SMs
    assert _layer(te, a100)["scores_forward"] == pytest.approx(
        SCORES / (a100.peak_flops("bf16") * 0.73 * _waves(108)), rel=1e-9)


def test_a_device_without_a_compute_capability_keeps_the_hardwares_order(work, registry):
    mi300x = registry.get("hardware/mi300x")
    assert mi300x.compute_capability is None
    te, sdpa = _under(work, registry, "megatron-te-cuda"), _under(work, registry, "hf-cuda-fused")
    assert _layer(te, mi300x)["scores_forward"] == _layer(sdpa, mi300x)["scores_forward"]


def test_fused_pointwise_kernels_move_each_chains_elements_once(work, registry):
    """Eager Llama layer: two RMSNorms of 18 elements an element, two residual adds of 3, rotary on q and k of 10
    plus the cos and sin reads (4 a head width), SwiGLU of 5; fused: norms and adds 9 a hidden element, rotary 2,
    SwiGLU 3. The fused runtime saves those bytes without compile, and compile on it saves nothing more."""
    h100 = registry.get("hardware/h100")
    eager_elements = (2 * 18 + 2 * 3) * H + 10 * (Q + KV) * D + 4 * D + 5 * FFN
    fused_elements = 9 * H + 2 * (Q + KV) * D + 3 * FFN
    saved = 2 * SEQ * (eager_elements - fused_elements)  # bf16 bytes
    eager, fused = _layer(work, h100), _layer(attrs.evolve(work, fused_pointwise=True), h100)
    hbm, eff = h100.hbm_bytes_per_second, h100.efficiency
    assert eager["forward"] - fused["forward"] == pytest.approx(saved / (hbm * eff["memory"]), rel=1e-9)
    assert eager["backward"] - fused["backward"] == pytest.approx(2 * saved / (hbm * eff["memory_backward"]),
                                                                  rel=1e-9)
    assert _layer(attrs.evolve(work, fused_pointwise=True), h100, compile=True)["forward"] == fused["forward"]


def test_torch_compile_leaves_a_complex_rotary_unfused(work, registry):
    """torchtitan's apply_rotary_emb casts q and k to fp32, multiplies them as complex numbers by freqs_cis and casts
    back; Inductor runs complex operators as ATen kernels, so under compile each rotated element moves 1 + 2 (the
    cast up), 2 + 2 (the product) and 2 + 1 (the cast back) 2-byte elements, 10, where the fused chain moves 2:
    8 more on the 32 query and 8 key heads of 128. Eager is unchanged (priced as rotate_half's 10 either way)."""
    h100 = registry.get("hardware/h100")
    complex_rotary = attrs.evolve(work, complex_rotary=True)
    extra = 2 * SEQ * 8 * (Q + KV) * D  # bf16 bytes
    hbm, eff = h100.hbm_bytes_per_second, h100.efficiency
    compiled, unfused = _layer(work, h100, compile=True), _layer(complex_rotary, h100, compile=True)
    assert unfused["forward"] - compiled["forward"] == pytest.approx(extra / (hbm * eff["memory"]), rel=1e-9)
    assert unfused["backward"] - compiled["backward"] == pytest.approx(2 * extra / (hbm * eff["memory_backward"]),
                                                                       rel=1e-9)
    assert _layer(complex_rotary, h100) == _layer(work, h100)
    assert registry.get("runtime/torchtitan-cuda").rotary == "complex"
    assert registry.get("runtime/hf-cuda").rotary == "real"
    model = ndcost.resolve("llama-3.1-8b", runtime="torchtitan-cuda", hardware="h100", census="off")
    assert model.model_work(SEQ).complex_rotary
    assert "complex rotary unfused" in model.evaluate(Strategy(seq=SEQ, compile=True)).time.provenance["kernels"]


def test_the_resolver_hands_the_runtimes_choices_over_and_says_so():
    model = ndcost.resolve("llama-3.1-8b", runtime="megatron-te-cuda", hardware="h100", census="off")
    work = model.model_work(SEQ)
    assert work.fused_pointwise and work.attention_backends["9.0"][0] == "cudnn"
    kernels = model.evaluate(Strategy(seq=SEQ)).time.provenance["kernels"]
    assert "dense: cudnn" in kernels and "each pointwise chain one kernel" in kernels
    plain = ndcost.resolve("llama-3.1-8b", runtime="hf-cuda-fused", hardware="h100", census="off")
    older = attrs.evolve(plain.hardware, kernel_tables={**plain.hardware.kernel_tables,
                                                        "sdpa_backends": ["flash", "efficient"]})
    kernels = plain.evaluate(Strategy(seq=SEQ), hardware=older).time.provenance["kernels"]  # apart from the other's
    assert "dense: flash" in kernels and "each pointwise chain" not in kernels


def test_the_time_models_choices_leave_the_census_key_alone(registry):
    """A census measures Transformers' modules under the contracts: megatron-te-cuda's is hf-cuda-fused's with
    Transformer Engine's fused norms, SwiGLU and grouped MLP, its time-model choices in no census key."""
    te, fused = registry.get("runtime/megatron-te-cuda"), registry.get("runtime/hf-cuda-fused")
    own = {"contracts": ("te-rms-norm", "te-swiglu", "te-grouped-mlp"), "replacements": te.content()["replacements"]}
    assert {**te.content(), "name": "", **own} == {**fused.content(), "name": "", **own}
    assert te.content()["contracts"] == fused.content()["contracts"] + own["contracts"]
    assert attrs.evolve(te, attention_backends={}, pointwise="eager", float8_casts="torchao").content() == te.content()
    assert te.float8_casts == "transformer_engine"
    model = ndcost.resolve("llama-3.1-8b", runtime="megatron-te-cuda", hardware="h100", census="off")
    assert model.model_work(SEQ).float8_casts == "transformer_engine"
    titan = registry.get("runtime/torchtitan-cuda")
    assert titan.content() == attrs.evolve(titan, rotary="real").content()


def test_megatron_runs_are_priced_under_transformer_engine(tmp_path):
    path = tmp_path / "train.sh"
    path.write_text("pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
                    "--group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 --seq-length 4096 "
                    "--micro-batch-size 1 --global-batch-size 8 --bf16 --swiglu --normalization RMSNorm "
                    "--position-embedding-type rope --untie-embeddings-and-output-weights --vocab-size 128256\n")
    config = from_config("megatron", path, devices=8)
    assert config.runtime == "megatron-te-cuda"
    assert any("megatron-te-cuda" in note and "cuDNN" in note for note in config.defaults)


@pytest.mark.parametrize("extra, says", [
    ({"attention_backends": {"9": ["cudnn"]}}, "attention_backends key '9' is not a CUDA compute capability"),
    ({"attention_backends": {"9.0": ["fa3"]}}, "attention_backends['9.0'] must list kernels of cudnn, flash"),
    ({"attention_backends": {"9.0": []}}, "attention_backends['9.0'] must list kernels"),
    ({"pointwise": "fast"}, "pointwise 'fast' is not one of eager, fused"),
    ({"rotary": "quaternion"}, "rotary 'quaternion' is not one of real, complex"),
    ({"float8_casts": "apex"}, "float8_casts 'apex' is not one of torchao, transformer_engine"),
])
def test_bad_runtime_kernel_choices_are_refused_by_name(extra, says):
    with pytest.raises(InvalidValue) as caught:
        profile_from_mapping({"name": "x", **extra}, where="x.yaml")
    assert says in str(caught.value)


def test_a_compute_capability_is_major_dot_minor(registry):
    spec = {"name": "box", "memory_bytes": 2**36, "hbm_bytes_per_second": 2e12, "peak_flops_per_second":
            {"bf16": 1e15}, "devices_per_node": 8, "network": {"within_node": {"bytes_per_second": 4e11}}}
    assert hardware_from_mapping({**spec, "compute_capability": 9.0}).compute_capability == "9.0"  # YAML's float
    with pytest.raises(InvalidValue, match=r"compute_capability 'sm90' is not a CUDA compute capability"):
        hardware_from_mapping({**spec, "compute_capability": "sm90"})
    assert registry.get("hardware/h200").compute_capability == "9.0"
