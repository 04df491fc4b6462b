"""Activations at fp32 compute (``compute_dtype=fp32``, or fp32 parameters without autocast): the 16-bit record
tables widened by the op records' ratios (``RecordTables.widened``), set beside a census of the same layer built
and run in fp32 (Transformers' LlamaDecoderLayer on fake tensors, no autocast), which the widening never reads."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _helpers import small_llama_config  # noqa: E402

import ndcost  # noqa: E402

S = 256


@pytest.mark.slow
def test_widened_records_match_a_census_of_the_fp32_layer():
    from ndcost.plugins.census import records as R

    config = small_llama_config(256, 512, 8, 2, 32)
    measured = R._measure_plain(config, 0, S, R.runtime_profile("hf-cuda"), fp32=True).saved_bytes / S
    model = ndcost.resolve(config.to_dict(), runtime="hf-cuda", hardware="h200", census="auto")
    narrow, wide = model.record_tables(S), model.record_tables(S, 4)
    widened = float(wide.saved[0] + wide.saved_tp[0])
    assert widened == pytest.approx(measured, rel=0.02)  # 16-bit census 9,640 bytes a token, fp32 17,192
    assert float(narrow.saved[0] + narrow.saved_tp[0]) < 0.6 * measured
    assert wide.compute_bytes == 4 and "fp32 activations" in wide.provenance["compute"]


def test_fp32_compute_keeps_wider_activations_and_claims_no_reserved_bytes():
    model = ndcost.resolve("llama-3.1-8b", hardware="h200", census="off")
    batch = model.evaluate_many(["seq=4096", "seq=4096,compute_dtype=fp32", "seq=4096,param_dtype=fp32",
                                 "seq=4096,param_dtype=fp32,compute_dtype=bf16"])
    plain, fp32, fp32_params, autocast = batch.layer_activation_bytes[:, 0].tolist()
    assert fp32 == fp32_params and fp32 > 1.5 * plain and plain <= autocast < fp32  # autocast: 16-bit compute
    assert batch.reserved_bytes[1] == -1 and batch.valid.all() and "fp32 activations" in batch.reserved_reason[1]
    assert model.record_tables(4096, 4).compute_bytes == 4 and model.record_tables(4096).compute_bytes == 2
