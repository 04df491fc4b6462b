"""Transformer Engine's fused RMSNorm and Megatron-LM's fused SwiGLU (contracts te-rms-norm and te-swiglu, the
replacements of runtime megatron-te-cuda): the census under them against the census of Transformers' modules, and
the formulas beside the census.

Differences derived by hand from Transformers' Llama modules and the kernels' saves, for one Llama layer of ``s``
tokens, hidden ``h``, feed-forward ``I``, in bf16. LlamaRMSNorm keeps the fp32 input (its pow and its product, one
storage: 4 s h), the rstd (4 s) and the bf16 normalized value the weight multiplies (2 s h); Transformer Engine's
rmsnorm_fwd keeps its bf16 input (2 s h) and an fp32 rsigma a row (4 s). LlamaMLP keeps gate_proj's output (SiLU's
input), SiLU's output, up_proj's output and their product (down_proj's input): four [s, I]; Megatron-LM's
linear_fc1 (gate and up, one matmul) feeds BiasSwiGLUFunction, which keeps its input [s, 2I]
(megatron/core/fusions/fused_bias_swiglu.py), and linear_fc2 keeps its input [s, I]: three.
"""
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _helpers import small_llama_config  # noqa: E402

import ndcost  # noqa: E402
from ndcost.manager import registry  # noqa: E402
from ndcost.plugins import op_records  # noqa: E402
from ndcost.plugins.runtimes import profile_from_mapping  # noqa: E402

S, H, N, KV, D, I = 256, 256, 8, 2, 32, 512


def _config():
    return small_llama_config(H, I, N, KV, D)


def _saved(profile):
    from ndcost.plugins.census import records as R
    return R._measure_plain(_config(), 0, S, profile)


@pytest.mark.slow
def test_the_fused_norms_and_swiglu_keep_what_the_kernels_keep():
    from ndcost.plugins.census import layer as L
    from ndcost.plugins.census import records as R

    plain = _saved(profile_from_mapping(dict(name="t-cuda", contracts=["cuda-sdpa"])))
    te = _saved(R.runtime_profile("megatron-te-cuda"))
    per_norm_hf, per_norm_te = 4 * S * H + 4 * S + 2 * S * H, 2 * S * H + 4 * S
    assert plain.saved_bytes - te.saved_bytes == 2 * (per_norm_hf - per_norm_te) + 2 * S * I
    assert te.ops_bytes["normOp"] == 2 * per_norm_te
    assert te.ops_bytes["ffAct"] == 2 * S * 2 * I
    with L.fake_layer(_config(), 0, R.runtime_profile("megatron-te-cuda")) as fake:
        assert type(fake.layer.input_layernorm).__name__ == "TeRMSNorm"
        assert type(fake.layer.mlp).__name__ == "TeSwiGLUMLP"


def test_the_formulas_take_the_fused_modules_values():
    # a Llama layer: 2 bytes an element and 4 a row for each norm, 2 feed-forward-wide tensors for the activation
    spec = ndcost.models.load_model("llama-3.1-8b")
    te, plain = registry().get("runtime/megatron-te-cuda"), registry().get("runtime/hf-cuda-fused")
    assert op_records.runtime_values(spec, "dense", te) == {"norm_bytes": 2, "norm_row_bytes": 4, "act_widths": 2,
                                                           "act_fused": 1, "expert_act_widths": 3}
    assert op_records.runtime_values(spec, "dense", plain) == {}
    # GPT-OSS: RMSNorms fused; its experts (no dense MLP to fuse) keep their clamped SwiGLU's six widths
    gpt_oss = ndcost.models.load_model("gpt-oss-20b")
    values = op_records.runtime_values(gpt_oss, gpt_oss.kinds[0], te)
    assert (values["norm_bytes"], values["norm_row_bytes"], values["expert_act_widths"]) == (2, 4, 6)


def test_llama_70b_megatron_layer_as_transformer_engine_keeps_it():
    """Llama-3.1-70B (h 8192, 64 query and 8 KV heads of 128, I 28672) a token at TP 1, by hand: the two norms'
    inputs and rows (2 (2 h + 4)) and the QKV and fc1 inputs (2 h each) beside the sequence; q, k, v, the
    attention output, its fp32 log-sum-exp a head, fc1's output (2 I), the SwiGLU's output (I) across TP."""
    model = ndcost.resolve("llama-3.1-70b", runtime="megatron-te-cuda", hardware="h100", census="off")
    model.record_tables(8192)
    record = model.resolved.kind_records[8192][0]["dense"]
    h, q, kv, i = 8192, 64 * 128, 8 * 128, 28672
    assert record.saved_per_token == pytest.approx(2 * (2 * h + 4) + 2 * h * 2, abs=0.01)
    assert record.saved_tp_per_token == 2 * (q + 2 * kv + q) + 64 * 4 + 2 * (2 * i + i)
