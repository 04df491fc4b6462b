"""The census with fp32 parameters under bf16 autocast, against the layer measured in bf16.

Derived by hand from Transformers' Llama modules (LlamaRMSNorm, the rotary
embedding, LlamaAttention, LlamaMLP) and autocast's rules (matmuls and SDPA
cast their inputs to bf16; a weight's cast is cached for the autocast region,
an activation's is made again for every op), for one layer of ``S`` tokens,
hidden ``H``, ``N`` query heads of width ``D`` in bf16 and in fp32 parameters:

- the residual stream is fp32, so each RMSNorm's ``to(float32)`` is its input
  itself and ``weight * x`` keeps the normalized value in fp32 where bf16
  parameters keep it in bf16: ``2 S H`` more a norm;
- the norm's fp32 output is cast anew by each projection reading it: q, k and
  v keep three bf16 copies ``[S, H]`` where one bf16 output served them, gate
  and up two where one did;
- cos and sin take the dtype of the hidden states: fp32 ``[S, D]``;
- the weights' bf16 copies are the memory model's (priced with the parameters)
  and are left out.

The whole step this changes is tests/test_resolver.py's
``small_llama_fp32_autocast`` against the H200 (-2.9 % before, +0.09 % with it).
"""
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _helpers import small_llama_config  # noqa: E402

S, H, N, KV, D, I = 256, 256, 8, 2, 32, 512


def _config():
    return small_llama_config(H, I, N, KV, D)


@pytest.mark.slow
def test_a_layer_under_autocast_keeps_fp32_norms_a_cast_per_projection_and_fp32_rotary_tables():
    from ndcost.plugins.census import records as R
    profile = R.runtime_profile("hf-cuda")
    bf16 = R._measure_plain(_config(), 0, S, profile)
    autocast = R._measure_plain(_config(), 0, S, profile, autocast=True)
    norms = 2 * (2 * S * H)
    casts = (2 + 1) * 2 * S * H
    rotary = 2 * (4 - 2) * S * D
    assert autocast.saved_bytes - bf16.saved_bytes == norms + casts + rotary  # no weight copy among them
    assert ((1, 1, S, D), "float32") in {(shape, dtype) for shape, dtype, _, _ in autocast.saved_tensors}


@pytest.mark.slow
def test_the_output_layer_under_autocast_keeps_the_final_norm_in_fp32():
    from ndcost.plugins.census import records as R
    from ndcost.plugins.census.output import census_output, measure_output
    profile = R.runtime_profile("hf-cuda")
    (bf16, _), (autocast, _) = measure_output(_config(), S, profile), measure_output(_config(), S, profile,
                                                                                      autocast=True)
    assert autocast.saved_bytes - bf16.saved_bytes == 2 * S * H  # the fp32 normalized value
    record = census_output(_config(), S, profile)
    assert record.autocast_saved_per_token - record.saved_per_token == pytest.approx(2 * H)


def _moe_config():
    from transformers import AutoConfig
    return AutoConfig.for_model("qwen3_moe", hidden_size=H, intermediate_size=I, moe_intermediate_size=64,
                                num_attention_heads=N, num_key_value_heads=KV, head_dim=D, vocab_size=1000,
                                num_hidden_layers=1, num_experts=4, num_experts_per_tok=2)


@pytest.mark.slow
def test_grouped_experts_under_autocast_keep_their_tensors_in_fp32():
    """Transformers' grouped experts cast their input to the weights' dtype before each grouped GEMM
    (``_grouped_mm``, transformers/integrations/moe.py), and autocast casts neither the GEMM nor the gating
    between them: with fp32 parameters every floating tensor the experts save is the bf16 layer's at fp32,
    the same shapes, and the routing's integer bookkeeping is unchanged. torch's meta kernel refuses fp32
    grouped GEMMs that the CUDA kernel runs (its per-group fallback): the census runs them all the same."""
    from ndcost.plugins.census import records as R
    profile = R.runtime_profile("hf-cuda")
    routed = S * 2  # S tokens, 2 experts each

    def experts(measured):  # the tensors of the routed rows the experts' ops save
        return sorted((shape, dtype) for shape, dtype, _, op in measured.saved_tensors
                      if op.startswith("ff") and shape and shape[0] == routed)

    bf16 = experts(R._measure_plain(_moe_config(), 0, S, profile))
    autocast = experts(R._measure_plain(_moe_config(), 0, S, profile, autocast=True))
    floating = [shape for shape, dtype in bf16 if dtype == "bfloat16" and shape[1:] != (1,)]
    assert len(floating) == 5  # the routed rows the experts hold between their two grouped GEMMs and around them
    widened = sorted((shape, "float32") if (shape, dtype) in {(s, "bfloat16") for s in floating} else (shape, dtype)
                     for shape, dtype in bf16)
    assert autocast == widened


@pytest.mark.slow
def test_an_op_fake_tensors_cannot_run_raises_without_torch_logging_a_traceback():
    """torch's meta kernel refuses an fp32 grouped GEMM: under the census's fake mode it raises (the census
    states such a layer as "not measured"), and FakeTensorMode's own ERROR log of the traceback is not shown."""
    import contextlib
    import logging

    import torch

    from ndcost.plugins.census import layer as L
    seen = []

    class Seen(logging.Handler):
        def emit(self, record):
            seen.append(record)
    log = logging.getLogger("torch._subclasses.fake_tensor")  # torch's loggers do not propagate to the root
    handler, level = Seen(logging.DEBUG), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with contextlib.ExitStack() as stack:
            L.enter_fake_mode(stack)
            rows, experts = torch.empty(8, 16), torch.empty(2, 16, 16)
            with pytest.raises(RuntimeError, match="BF16"):
                torch._grouped_mm(rows, experts, offs=torch.tensor([4, 8], dtype=torch.int32))
        assert log.level == logging.INFO  # put back as it was
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert not [r for r in seen if r.levelno >= logging.ERROR]
