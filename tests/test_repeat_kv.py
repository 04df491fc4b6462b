"""Keys and values repeated to every query head before SDPA (runtime torchtitan-cuda, contract cuda-sdpa-repeat-kv).

torchtitan's Llama runs ``repeat_kv`` before SDPA (torchtitan/models/llama3/model/model.py, pytorch/torchtitan
018740b): an expand of each KV head to its ``n_heads / n_kv_heads`` query heads and a reshape, a copy where a rank
holds two KV heads or more, a view where it holds one. SDPA saves its inputs and torch's ring attention passes
them, so a rank keeps and sends a query head's keys and values each. Every expected figure below is derived by
hand from that: the copies replace the KV heads the kernel would save (2 tensors, K and V, of ``heads * d``
elements a token in place of ``kv_heads * d``).
"""
from __future__ import annotations

from pathlib import Path

import pytest

import ndcost
from ndcost.errors import UnknownKey
from ndcost.trainers import from_config

CONFIGS = Path(__file__).parent / "data" / "configs" / "torchtitan"

# Llama-3.1-8B: 32 query heads, 8 KV heads of 128, 32 layers; bf16 activations (2 bytes)
HEADS, KV_HEADS, D, LAYERS, BF16 = 32, 8, 128, 32, 2


def _activations(runtime, strategy):
    model = ndcost.resolve("llama-3.1-8b", runtime=runtime, census="off")
    return model.evaluate(strategy).stages[0].bytes_by_category["activations"]


@pytest.mark.parametrize("strategy, tp", [("fsdp=8,seq=8192", 1), ("tp=4,fsdp=2,seq=8192", 4)])
def test_a_rank_keeps_a_query_heads_keys_and_values(strategy, tp):
    # the copies: K and V of the rank's HEADS / tp query heads, in place of its KV_HEADS / tp KV heads
    extra_per_token = 2 * (HEADS - KV_HEADS) // tp * D * BF16
    extra = LAYERS * 8192 * extra_per_token
    assert extra == {1: 3_221_225_472, 4: 805_306_368}[tp]
    assert _activations("torchtitan-cuda", strategy) - _activations("hf-cuda", strategy) == extra


@pytest.mark.parametrize("tp", [8, 16])
def test_one_kv_head_a_rank_is_repeated_as_a_view(tp):
    # at tp >= 8 a rank holds one KV head (replicated past 8): the reshape of its expand copies nothing, so the
    # kernel saves that head, as without the repeat
    strategy = f"tp={tp},seq=8192"
    assert _activations("torchtitan-cuda", strategy) == _activations("hf-cuda", strategy)


def test_ring_cp_passes_every_query_heads_keys_and_values():
    plain = ndcost.resolve("llama-3.1-8b", runtime="hf-cuda", census="off")
    repeated = ndcost.resolve("llama-3.1-8b", runtime="torchtitan-cuda", census="off")
    assert plain.model_work(8192).work["dense"].kv_elements_per_token == 2 * KV_HEADS * D
    assert repeated.model_work(8192).work["dense"].kv_elements_per_token == 2 * HEADS * D
    assert repeated.tables.kv_elements_per_token.tolist() == [2 * HEADS * D]
    # without CP nothing is passed: the same step; with it, four times the bytes a ring step
    one = "fsdp=8,seq=8192"
    assert repeated.evaluate(one).time.step_seconds == plain.evaluate(one).time.step_seconds
    ring = "fsdp=4,cp=2,seq=65536,recompute=full"
    assert (repeated.evaluate(ring).time.communication_seconds
            > plain.evaluate(ring).time.communication_seconds)
    # Ulysses exchanges the projections' keys and values, before the attention repeats them: the same bytes
    assert repeated.model_work(8192).work["dense"].kv_copies == HEADS // KV_HEADS
    ulysses = "fsdp=4,cp=2,cp_algo=ulysses,seq=65536,recompute=full"
    assert (repeated.evaluate(ulysses).time.communication_seconds
            == pytest.approx(plain.evaluate(ulysses).time.communication_seconds, rel=1e-12))


def test_latent_attention_repeats_nothing_and_eager_attention_repeats_as_transformers_does():
    # DeepSeek-V3's MLA has a key and a value a query head already
    plain = ndcost.resolve("deepseek-v3", runtime="hf-cuda", census="off")
    repeated = ndcost.resolve("deepseek-v3", runtime="torchtitan-cuda", census="off")
    assert repeated.tables.kv_copies.tolist() == [1] * len(repeated.tables.kinds)
    assert repeated.tables.kv_elements_per_token.tolist() == plain.tables.kv_elements_per_token.tolist()
    # GPT-OSS runs eager attention under either (its family refuses SDPA), whose eager_attention_forward
    # (models/gpt_oss/modeling_gpt_oss.py) copies its 8 KV heads to the 64 query heads (repeat_kv)
    for runtime in ("hf-cuda", "torchtitan-cuda"):
        model = ndcost.resolve("gpt-oss-20b", runtime=runtime, census="off")
        assert model.tables.kv_repeated and model.tables.kv_copies.tolist() == [64 // 8] * len(model.tables.kinds)


def test_the_torchtitan_reader_prices_under_torchtitan_cuda():
    config = from_config("torchtitan", CONFIGS / "llama3_8b.toml", devices=64)
    assert config.runtime == "torchtitan-cuda"
    assert any("repeat_kv" in line for line in config.defaults)


def test_an_unknown_runtime_is_refused_naming_the_closest():
    with pytest.raises(UnknownKey, match="runtime/torchtitan-cuda"):
        ndcost.resolve("llama-3.1-8b", runtime="torchtitan_cuda", census="off")


# -- the census under the contract, against the formulas ---------------------------------------------------
def test_census_saves_the_copies_the_formulas_price():
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from ndcost import manager
    from ndcost.models import load_model
    from ndcost.plugins.census import records
    from ndcost.values import LayerGroup

    # 8 heads of 32, 4 KV heads: the census's TP-2 rank still holds two KV heads, so both ranks copy
    heads, kv_heads, d, seq = 8, 4, 32, 64
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, head_dim=d, num_hidden_layers=1,
                                      vocab_size=1000, max_position_embeddings=512)
    measured = {runtime: records.census_groups(config, [LayerGroup(kind="dense", count=1)], seq, runtime,
                                               use_cache=False, progress=None)["dense"]
                for runtime in ("hf-cuda", "torchtitan-cuda")}
    extra = 2 * (heads - kv_heads) * d * BF16  # bytes a token, split by TP with the query heads
    assert extra == 512
    plain, repeated = measured["hf-cuda"], measured["torchtitan-cuda"]
    assert repeated.saved_per_token == plain.saved_per_token
    assert repeated.saved_tp_per_token - plain.saved_tp_per_token == extra
    assert repeated.ops_tp["attBMM"] - plain.ops_tp["attBMM"] == extra
    # the formulas (the registered op-records estimator) under the same runtime: the same copies, in the same op
    spec = load_model(config)
    estimator = manager.registry().get("estimator/activations/op_records")
    formulas = {runtime: estimator.records(spec, ["dense"], seq, runtime)[0]["dense"]
                for runtime in ("hf-cuda", "torchtitan-cuda")}
    assert formulas["torchtitan-cuda"].saved_tp_per_token - formulas["hf-cuda"].saved_tp_per_token == extra
    assert formulas["torchtitan-cuda"].ops_tp["attBMM"] - formulas["hf-cuda"].ops_tp["attBMM"] == extra


@pytest.mark.slow
def test_verify_holds_the_formulas_to_the_census_under_torchtitan_cuda(tmp_path):
    pytest.importorskip("transformers")
    import json
    # Llama-3.1-8B's shape at small widths, 8 heads of 32 and 4 KV heads (two a rank at the census's TP 2)
    config = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8,
              "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000, "rms_norm_eps": 1e-5,
              "rope_theta": 500000.0, "max_position_embeddings": 4096, "hidden_act": "silu",
              "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = ndcost.verify(path, seq=128, runtime="torchtitan-cuda")
    flagged = {r.quantity for r in result.rows if r.flagged and r.kind == "dense"}
    # the copies kept plain and recomputed with the attention core alike; the formulas' elementwise traffic leaves
    # the repeat's copy out (the census counts it), the one row of the layer they may differ on
    assert flagged <= {"traffic.elementwise_per_token"}


def test_one_kv_head_is_never_copied():
    # multi-query attention: repeat_kv's reshape of one head's expand is a view at every TP degree, so the kernel
    # keeps the one head and the formulas count no copies (a Llama of 8 query heads of 32 and one KV head)
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=8,
                                      num_key_value_heads=1, head_dim=32, num_hidden_layers=2, vocab_size=1000)
    plain = ndcost.resolve(config, runtime="hf-cuda", census="off")
    repeated = ndcost.resolve(config, runtime="torchtitan-cuda", census="off")
    assert repeated.tables.kv_copies.tolist() == [1]
    for strategy in ("seq=1024", "tp=2,seq=1024", "tp=8,seq=1024"):
        assert (repeated.evaluate(strategy).stages[0].bytes_by_category
                == plain.evaluate(strategy).stages[0].bytes_by_category)
