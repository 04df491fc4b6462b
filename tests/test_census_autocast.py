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


@pytest.mark.slow
def test_a_layer_that_cannot_run_under_autocast_raises_without_torch_logging_a_traceback():
    """Transformers' grouped_mm experts take bf16 operands only (torch's meta kernel checks them): under autocast
    with fp32 parameters the layer raises, which the census states as "not measured"; FakeTensorMode's own ERROR
    log of the same traceback is not shown."""
    import logging

    from transformers import AutoConfig

    from ndcost.plugins.census import records as R
    config = AutoConfig.for_model("qwen3_moe", hidden_size=H, intermediate_size=I, moe_intermediate_size=64,
                                  num_attention_heads=N, num_key_value_heads=KV, head_dim=D, vocab_size=1000,
                                  num_hidden_layers=1, num_experts=4, num_experts_per_tok=2)
    profile = R.runtime_profile("hf-cuda")
    seen = []

    class Seen(logging.Handler):
        def emit(self, record):
            seen.append(record)
    log = logging.getLogger("torch._subclasses.fake_tensor")  # torch's loggers do not propagate to the root
    handler, level = Seen(logging.DEBUG), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with pytest.raises(RuntimeError, match="BF16"):
            R._measure_plain(config, 0, S, profile, autocast=True)
        assert log.level == logging.INFO  # put back as it was
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert not [r for r in seen if r.levelno >= logging.ERROR]
